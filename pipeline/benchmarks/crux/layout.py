"""CRUX's released layout (see schema.py) read into collections: one collection per layout
folder, its passages the corpus's passages the queries need (judged or ranked), the ratings
from its judgement files, the rankings from its run files."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable

from pipeline.benchmarks.crux import schema
from pipeline.benchmarks.crux.metrics import answerable, greedy_cover
from pipeline.benchmarks.crux.schema import Collection, Passage, SubQuestion
from pipeline.core.benchmark import Inputs
from pipeline.core.errors import DataError

log = logging.getLogger(__name__)


def _jsonl(inputs: Inputs, folder: str, sub: str) -> list[tuple[str, object]]:
    lines: list[tuple[str, object]] = []
    for path in inputs.glob(posixpath.join(folder, sub), "*.jsonl"):
        lines += inputs.jsonl(path)
    return lines


def _known_query(
    qid: str, topics: dict[str, tuple[str, str]], where: str, what: str, item: str | None = None
) -> None:
    if qid not in topics:
        raise DataError(
            f"{what} for query {qid!r}, which topic/ does not have",
            file=where,
            item=item or qid,
            field="id",
        )


def _unmatched(
    name: str,
    path: str,
    run: dict[str, list[str]],
    topics: dict[str, tuple[str, str]],
    corpus: dict[str, tuple[str, str]],
) -> None:
    """A run ranks a whole collection: its lines for passages the corpus folder does not hold
    (or queries topic/ does not have) are dropped, counted and said once per run file."""
    queries = [q for q in run if q not in topics]
    passages = sum(1 for q, ps in run.items() if q in topics for p in ps if p not in corpus)
    if queries or passages:
        log.warning(
            "crux: run %s (%s): %d ranked passages not in the corpus dropped; %d queries not in"
            " topic/ skipped%s",
            name,
            path,
            passages,
            len(queries),
            f" (e.g. {queries[0]!r})" if queries else "",
        )


def read(
    inputs: Inputs, folder: str, eta: int, domain: str, tokens: Callable[[str], int]
) -> Collection:
    if not inputs.exists(posixpath.join(folder, "topic")):
        raise DataError("not a folder of CRUX's layout (no topic/)", file=folder)
    topics = schema.topics(_jsonl(inputs, folder, "topic"))
    sub_lines = _jsonl(inputs, folder, "subtopics")
    subs = schema.subquestions(sub_lines)
    judged = schema.judgements(_jsonl(inputs, folder, "judgements"))
    corpus = schema.corpus(_jsonl(inputs, folder, "corpus"))
    # A line about a query topic/ does not have is a typo or a mixed-up file: an error, never
    # ignored (a judged passage missing from the corpus is one too, below).
    for where, raw in sub_lines:
        _known_query(schema.ident(raw, where), topics, where, "sub-questions")
    for qid, by_pid in judged.items():
        for pid, (_, where) in by_pid.items():
            _known_query(qid, topics, where, "a judgement", f"{qid}/{pid}")
    reports = {}
    if inputs.exists(posixpath.join(folder, "reports")):
        for where, raw in _jsonl(inputs, folder, "reports"):
            ident = schema.ident(raw, where)
            _known_query(ident, topics, where, "a report")
            reports[ident] = str(raw.get("report", "")) if isinstance(raw, dict) else ""
    runs: dict[str, dict[str, list[str]]] = {}
    if inputs.exists(posixpath.join(folder, "runs")):
        for path in inputs.glob(posixpath.join(folder, "runs"), "*.run"):
            name = posixpath.basename(path).removesuffix(".run")
            runs[name] = schema.trec_run(inputs.text(path), path)
            _unmatched(name, path, runs[name], topics, corpus)
    queries = []
    needed: set[str] = set()
    for qid, (request, where) in topics.items():
        if qid not in subs:
            raise DataError(
                "no sub-questions for this query", file=where, item=qid, field="subtopics"
            )
        texts = subs[qid]
        full: dict[str, list[int]] = {}
        for pid, (ratings, at) in judged.get(qid, {}).items():
            if len(ratings) != len(texts):
                raise DataError(
                    f"{len(ratings)} ratings for {len(texts)} sub-questions",
                    file=at,
                    item=f"{qid}/{pid}",
                    field="rating",
                )
            if pid not in corpus:
                raise DataError(
                    "a judged passage missing from the corpus",
                    file=at,
                    item=f"{qid}/{pid}",
                    field="docid",
                )
            full[pid] = ratings
        keep = answerable(full, len(texts), eta)
        kept = {p: [r[i] for i in keep] for p, r in full.items() if any(r[i] >= eta for i in keep)}
        rankings = {
            name: [p for p in run.get(qid, []) if p in corpus] for name, run in runs.items()
        }
        needed |= set(kept) | {p for r in rankings.values() for p in r}
        raw = {
            "item_id": qid,
            "query": request,
            "domain": domain,
            "subquestions": [
                SubQuestion(qid=f"q{i + 1}", text=texts[i]).model_dump() for i in keep
            ],
            "dropped": [
                SubQuestion(qid=f"q{i + 1}", text=texts[i]).model_dump()
                for i in range(len(texts))
                if i not in keep
            ],
            "ratings": kept,
            "zstar": greedy_cover(kept, sorted(kept), eta),
            "rankings": {n: r for n, r in rankings.items() if r},
            "reference": reports.get(qid),
            "meta": {"layout": folder},
        }
        queries.append(schema.validate_query(raw, where))
    passages = [
        Passage(pid=p, text=corpus[p][0], tokens=tokens(corpus[p][0])) for p in sorted(needed)
    ]
    return Collection(
        collection_id=posixpath.basename(folder.rstrip("/")) or folder,
        domain=domain,
        source=folder,
        passages=passages,
        queries=queries,
    )
