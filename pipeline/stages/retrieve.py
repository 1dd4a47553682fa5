"""Stage `<benchmark>-retrieve@<retriever>`: the benchmark's queries -> one ranking per query.

The benchmark says what is ranked (`Benchmark.retrieval.queries`: each query with its candidate
passages, how deep to keep, and its released rankings); this stage ranks them with one entry of
`retrievers:` and writes `retrievals/<benchmark>/<retriever>.jsonl`: one line per query,
`{"query_id", "ranking": [[passage id, score], ...]}`, best first (score null where the
retriever gives an order only), and its usage to `retrievals/usage/<benchmark>/<retriever>.json`.
Generate stages read the rankings wherever a setting names the retriever, so every model of the
benchmark uses the same ranking, made once (and a re-run answered by the cache, whose usage
differs, re-runs nothing downstream).

Providers (`pipeline.core.config`):

- `bm25`, `dense`: the project's own (`pipeline.retrieval`), with the entry's options;
- `embeddings`: an OpenAI-compatible `/v1/embeddings` endpoint; the cosine of the query's and
  each passage's vector (a passage cut into windows scores its best window);
- `rerank`: a Cohere-compatible `/v1/rerank` endpoint re-ordering the top `top_k` of another
  ranking (bm25, dense, or a released one); the rest follow in that ranking's order;
- `python`: the user's callable, `f(query, passages, **options)` -> a score per passage, the
  passage ids in order, or (id, score) pairs; journaled per query;
- `run`: a TREC run file (`qid Q0 docid rank score tag`), checked against the queries.

Endpoint requests go through `pipeline.llm.retrieval` (response cache, journal, limits,
retries, Ctrl-C). The usage file carries the requests, tokens and cost, the entry's digest
and the retriever's lineage (provider, model, code or file digest).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.benchmark import AnyBenchmark, Passage, RetrievalQuery
from pipeline.core.config import (
    Bm25Retriever,
    DenseRetriever,
    EmbeddingsRetriever,
    Params,
    PythonRetriever,
    RerankRetriever,
    RetrieverSpec,
    RunRetriever,
)
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import iter_lines, write_json, write_jsonl
from pipeline.core.types import UsageReport
from pipeline.llm.client import wall_path
from pipeline.llm.journal import clear_journal
from pipeline.stages.common import (
    context,
    entry_sha,
    llm_paths,
    log_usage,
    no_usage,
    read_dataset,
    retrieval_lineage_path,
    retrieval_usage_path,
    retrieve_stage,
)
from pipeline.stages.memo import Memo, memo_key
from pipeline.stages.plugins import RETRIEVERS_DIR, file_sha, load_entry_point

log = logging.getLogger(__name__)

Ranking = list[tuple[str, float | None]]
SCORE_DIGITS = 6  # scores as written (the order is decided on the full value)


def order(passages: Sequence[Passage], scores: Sequence[float]) -> Ranking:
    """The passages by descending score; equal scores keep the passages' order."""
    idx = sorted(range(len(passages)), key=lambda i: (-scores[i], i))
    return [(passages[i].id, float(scores[i])) for i in idx]


# ---------------------------------------------------------------- the providers


def _bm25(q: RetrievalQuery, stopwords: bool = True) -> Ranking:
    from pipeline.retrieval.bm25 import bm25_scores

    return order(q.passages, bm25_scores(q.text, [p.text for p in q.passages], stopwords=stopwords))


def _dense(q: RetrievalQuery) -> Ranking:
    from pipeline.retrieval.dense import dense_scores

    return order(q.passages, dense_scores(q.text, [p.text for p in q.passages]))


def base_ranking(name: str, q: RetrievalQuery) -> list[str]:
    """The passage ids of a ranking a reranker re-orders: bm25, dense or a released one."""
    if name == "bm25":
        return [p for p, _ in _bm25(q)]
    if name == "dense":
        return [p for p, _ in _dense(q)]
    if name in q.rankings:
        return list(q.rankings[name])
    have = ", ".join(["bm25", "dense", *sorted(q.rankings)])
    raise DataError(f"no ranking {name!r} for this query (it has: {have})", item=q.id)


def _embeddings(
    spec: EmbeddingsRetriever,
    queries: Sequence[RetrievalQuery],
    root: Path,
    stage: str,
) -> tuple[list[Ranking], UsageReport]:
    from pipeline.llm.retrieval import embed
    from pipeline.retrieval.windows import cut

    passage_texts = list(dict.fromkeys(p.text for q in queries for p in q.passages))
    windows = dict(
        zip(
            passage_texts,
            cut(passage_texts, spec.window_tokens, spec.tokenizer, str(root)),
            strict=True,
        )
    )
    q_texts = [spec.query_prefix + q.text for q in queries]
    w_texts = [spec.passage_prefix + w for ws in windows.values() for w in ws]
    cache, journal = llm_paths(root, stage)
    vectors, report = embed(
        spec, [*q_texts, *w_texts], cache_path=cache, journal_path=journal, label=stage
    )
    out: list[Ranking | None] = [None] * len(queries)
    # queries over the same passages (a shared corpus) are scored in one product; the same
    # ids alone are not the same passages (SummHay's are positions in each haystack)
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for n, q in enumerate(queries):
        groups.setdefault(tuple((p.id, p.text) for p in q.passages), []).append(n)
    for members in groups.values():
        passages = queries[members[0]].passages
        rows = [spec.passage_prefix + w for p in passages for w in windows[p.text]]
        starts = np.cumsum([0, *(len(windows[p.text]) for p in passages)])[:-1]
        w = np.stack([vectors[t] for t in rows]).astype(np.float64)
        qm = np.stack([vectors[q_texts[n]] for n in members]).astype(np.float64)
        best = np.maximum.reduceat(w @ qm.T, starts, axis=0)  # (passages, queries)
        for col, n in enumerate(members):
            out[n] = order(passages, [float(x) for x in best[:, col]])
    return [r for r in out if r is not None], report


def _rerank(
    spec: RerankRetriever, queries: Sequence[RetrievalQuery], root: Path, stage: str
) -> tuple[list[Ranking], UsageReport]:
    from pipeline.llm.retrieval import RerankAsk, rerank

    text_of = [{p.id: p.text for p in q.passages} for q in queries]
    bases = [base_ranking(spec.over, q) for q in queries]
    tops = [b[: spec.top_k] for b in bases]
    cut = spec.max_chars
    asks = [
        RerankAsk(q.text, tuple(t[p][:cut] if cut else t[p] for p in top))
        for q, t, top in zip(queries, text_of, tops, strict=True)
    ]
    cache, journal = llm_paths(root, stage)
    answers, report = rerank(spec, asks, cache_path=cache, journal_path=journal, label=stage)
    out = []
    for base, top, ranked in zip(bases, tops, answers, strict=True):
        head: Ranking = [(top[i], s) for i, s in ranked]
        seen = {p for p, _ in head}
        # what the server did not score keeps the base order, then everything past top_k
        out.append(head + [(p, None) for p in base if p not in seen])
    return out, report


def python_result(got: Any, q: RetrievalQuery, where: str) -> Ranking:
    """A python retriever's answer for one query, checked: a score per passage (in order),
    passage ids best first, or (id, score) pairs best first."""
    if hasattr(got, "tolist"):
        got = got.tolist()
    if not isinstance(got, list | tuple):
        raise ConfigError(
            f"{where}: query {q.id}: returned {type(got).__name__}; return a score per passage,"
            " the passage ids in order, or (id, score) pairs"
        )
    ids = {p.id for p in q.passages}
    items = list(got)
    if items and all(isinstance(x, int | float) and not isinstance(x, bool) for x in items):
        if len(items) != len(q.passages):
            raise ConfigError(
                f"{where}: query {q.id}: {len(items)} scores for {len(q.passages)} passages"
            )
        if not all(math.isfinite(float(x)) for x in items):
            raise ConfigError(f"{where}: query {q.id}: a score is not a finite number")
        return order(q.passages, [float(x) for x in items])
    pairs: Ranking = []
    for x in items:
        if isinstance(x, str):
            pairs.append((x, None))
        elif (
            isinstance(x, list | tuple)
            and len(x) == 2
            and isinstance(x[0], str)
            and isinstance(x[1], int | float)
            and not isinstance(x[1], bool)
            and math.isfinite(float(x[1]))
        ):
            pairs.append((x[0], float(x[1])))
        else:
            raise ConfigError(
                f"{where}: query {q.id}: {x!r} is neither a score, a passage id nor an"
                " (id, score) pair"
            )
    unknown = [p for p, _ in pairs if p not in ids]
    if unknown:
        raise ConfigError(
            f"{where}: query {q.id}: returned ids that are not its passages: {unknown[:3]}"
        )
    if len({p for p, _ in pairs}) != len(pairs):
        raise ConfigError(f"{where}: query {q.id}: a passage id is returned twice")
    return pairs


def _python(
    spec: PythonRetriever, queries: Sequence[RetrievalQuery], root: Path, stage: str, entry: str
) -> tuple[list[Ranking], UsageReport, str]:
    """Call the user's retriever once per query; each finished query is journaled and cached
    (`pipeline.stages.memo`: a kill loses none, a re-run computes none twice), keyed by the code
    digest, so an edit computes everything again."""
    ep = load_entry_point(spec.entry, root, RETRIEVERS_DIR, f"retrievers.{entry}")
    t0 = time.monotonic()
    entry_digest = entry_sha(spec, "")

    def key(q: RetrievalQuery) -> str:
        passages = [[p.id, p.text] for p in q.passages]
        return memo_key("python-retriever", ep.code_sha, entry_digest, q.id, q.text, passages)

    keys = [key(q) for q in queries]
    out: list[Ranking] = []
    with Memo(root, stage) as memo:
        done = memo.get_many(keys)
        for q, k in zip(queries, keys, strict=True):
            if k in done:
                out.append([(str(p), s) for p, s in json.loads(done[k])])
                continue
            passages = [Passage(p.id, p.text) for p in q.passages]
            try:
                got = ep.func(q.text, passages, **spec.options)
            except Exception as e:
                raise ConfigError(
                    f"retrievers.{entry} ({spec.entry}): query {q.id}: {type(e).__name__}: {e}"
                ) from e
            ranking = python_result(got, q, f"retrievers.{entry} ({spec.entry})")
            memo.put(k, q.id, json.dumps(ranking))
            out.append(ranking)
        hits, cache_hits = memo.journal_hits, memo.cache_hits
    report = no_usage(stage).model_copy(
        update={
            "items": len(queries),
            "ok": len(queries),
            "journal_hits": hits,
            "cache_hits": cache_hits,
            "wall_s": round(time.monotonic() - t0, 3),
        }
    )
    return out, report, ep.code_sha


def read_run(path: Path, shown: str, queries: Sequence[RetrievalQuery]) -> dict[str, Ranking]:
    """A TREC run file's rankings of `queries`: by descending score (equal scores by rank),
    checked: 6 fields, a number for rank and score, a known query and passage, no passage
    twice in a query, every query ranked."""
    if not path.is_file():
        raise DataError("run file not found", file=shown)
    passages = {q.id: {p.id for p in q.passages} for q in queries}
    rows: dict[str, list[tuple[float, int, str]]] = {}
    for lineno, line in iter_lines(path, shown):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{shown}:{lineno}"
        parts = line.split()
        if len(parts) != 6:
            raise DataError(
                f"expected 6 fields (qid Q0 docid rank score tag), got {len(parts)}", file=where
            )
        qid, _, docid, rank, score, _ = parts
        try:
            r, s = int(rank), float(score)
        except ValueError:
            raise DataError(
                f"rank {rank!r} or score {score!r} is not a number", file=where
            ) from None
        if not math.isfinite(s):
            raise DataError(f"score {score!r} is not finite", file=where)
        if qid not in passages:
            raise DataError(
                f"query {qid!r} is not one of this benchmark's queries"
                f" (`lfbench export queries` lists them; e.g. {next(iter(passages), '-')})",
                file=where,
            )
        if docid not in passages[qid]:
            raise DataError(f"{docid!r} is not a passage of query {qid!r}", file=where)
        got = rows.setdefault(qid, [])
        if any(d == docid for _, _, d in got):
            raise DataError(f"passage {docid!r} is ranked twice for query {qid!r}", file=where)
        got.append((s, r, docid))
    missing = [q.id for q in queries if q.id not in rows]
    if missing:
        raise DataError(
            f"{len(missing)} of the {len(queries)} queries have no line (first: {missing[0]})",
            file=shown,
        )
    return {
        qid: [(d, s) for s, _, d in sorted(got, key=lambda x: (-x[0], x[1]))]
        for qid, got in rows.items()
    }


# ---------------------------------------------------------------- the stage


def rank_all(
    bench: AnyBenchmark,
    params: Params,
    retriever: str,
    queries: Sequence[RetrievalQuery],
    root: Path,
) -> tuple[list[Ranking], UsageReport, dict[str, str]]:
    """Every query ranked by one retrievers entry; the usage; the retriever's lineage."""
    spec: RetrieverSpec = params.retrievers[retriever]
    stage = retrieve_stage(bench.name, retriever)
    lineage = {"name": retriever, "provider": spec.provider, "entry_sha": entry_sha(spec, "")}
    t0 = time.monotonic()
    local: Callable[[RetrievalQuery], Ranking] | None = None
    if isinstance(spec, Bm25Retriever):
        stopwords = spec.stopwords

        def local(q: RetrievalQuery) -> Ranking:
            return _bm25(q, stopwords)
    elif isinstance(spec, DenseRetriever):
        local = _dense
    if local is not None:
        rankings = [local(q) for q in queries]
        report = no_usage(stage).model_copy(update={"items": len(queries), "ok": len(queries)})
    elif isinstance(spec, EmbeddingsRetriever):
        lineage |= {"model": spec.model, "tokenizer": spec.tokenizer}
        rankings, report = _embeddings(spec, queries, root, stage)
    elif isinstance(spec, RerankRetriever):
        lineage |= {"model": spec.model, "over": spec.over}
        rankings, report = _rerank(spec, queries, root, stage)
    elif isinstance(spec, PythonRetriever):
        rankings, report, code = _python(spec, queries, root, stage, retriever)
        lineage |= {"entry": spec.entry, "code_sha": code}
    elif isinstance(spec, RunRetriever):
        shown = spec.files[bench.name]
        path = root / shown
        runs = read_run(path, shown, queries)
        rankings = [runs[q.id] for q in queries]
        lineage |= {"file": shown, "file_sha": file_sha(path)}
        report = no_usage(stage).model_copy(update={"items": len(queries), "ok": len(queries)})
    else:  # pragma: no cover - the params model admits no other provider
        raise ConfigError(f"retrievers.{retriever}: unknown provider {spec.provider!r}")
    report = report.model_copy(update={"wall_s": round(time.monotonic() - t0, 3)})
    return rankings, report, lineage


def retrieve(
    bench: AnyBenchmark,
    params: Params,
    retriever: str,
    dataset_path: Path,
    data_dir: Path,
    out: Path,
    root: Path,
) -> int:
    stage = retrieve_stage(bench.name, retriever)
    if bench.retrieval is None:
        raise ConfigError(f"{bench.name} takes no retrievers of yours")
    section = params.section(bench.name, bench.params_model)
    if retriever not in section.retrievers:
        raise ConfigError(
            f"{bench.name}.retrievers does not list {retriever!r} (it lists:"
            f" {', '.join(section.retrievers) or 'none'})"
        )
    ctx = context(bench, params, root, data_dir)
    dataset = read_dataset(bench, dataset_path)
    queries = bench.retrieval.queries(ctx, dataset, retriever)
    if not queries:
        raise DataError("the dataset gives no query to rank", file=str(dataset_path))
    rankings, report, lineage = rank_all(bench, params, retriever, queries, root)
    lines = [
        {
            "query_id": q.id,
            "ranking": [
                [p, None if s is None else round(s, SCORE_DIGITS)]
                for p, s in (ranking if q.depth is None else ranking[: q.depth])
            ],
        }
        for q, ranking in zip(queries, rankings, strict=True)
    ]
    write_jsonl(out, lines)
    usage = retrieval_usage_path(root, bench.name, retriever)
    data = report.model_dump(mode="json")
    wall = data.pop("wall_s")
    data["entry_sha"] = lineage["entry_sha"]
    data["retriever"] = lineage
    write_json(usage, data)
    write_json(wall_path(usage), {"wall_s": wall})
    write_json(retrieval_lineage_path(root, bench.name, retriever), lineage)
    log_usage(stage, report)
    log.info(
        "wrote %s: %d queries ranked by %s (%s)", out, len(lines), retriever, spec_text(lineage)
    )
    clear_journal(llm_paths(root, stage)[1])
    return len(lines)


def spec_text(lineage: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in lineage.items() if k not in ("name", "entry_sha"))
