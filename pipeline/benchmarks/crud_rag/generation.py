"""Generation: each item in each setting of the knob study, by a model or a no-model baseline.

Settings (`crud_rag.grid`): `oracle` (the record's own news text, for items that carry one) and
one retrieval setting per distinct combination of knobs (the base, then one knob varied at a
time), named `<retriever>-c<chunk size>-o<overlap %>-k<top-k>`. A setting's context is its
retrieved chunks, best first, separated by blank lines.

Models: any `openai` entry, with the project's prompt of the item's task family (prompts/ in
this folder); the no-model baselines (`provider: baseline`):
- `lead`: the context's sentences in order, until `generation.max_chars` characters;
- `extractive`: the context's sentences ranked by BM25 (jieba words) against the item's query,
  best first, near-duplicates skipped, until `generation.max_chars` characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.benchmarks.crud_rag import text as T
from pipeline.benchmarks.crud_rag.params import CrudParams, Knobs
from pipeline.benchmarks.crud_rag.retrieval import Index, retrieve
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core.benchmark import Planned
from pipeline.core.errors import ConfigError
from pipeline.core.prompts import Prompt
from pipeline.core.records import Generation, generation_id
from pipeline.core.types import ChatRequest

ORACLE = "oracle"
PROMPT_OF_TASK = {
    "event_summary": "event_summary",
    "continuing_writing": "continuing_writing",
    "questanswer_1doc": "questanswer",
    "questanswer_2docs": "questanswer",
    "questanswer_3docs": "questanswer",
    "hallu_modified": "hallu_modified",
}


@dataclass(frozen=True)
class Setting:
    name: str
    knob: (
        str  # which knob this row varies: base, chunk_size, chunk_overlap, retriever, top_k, oracle
    )
    knobs: Knobs | None  # None: the oracle context


def settings(section: CrudParams) -> list[Setting]:
    out = [Setting(ORACLE, ORACLE, None)] if section.grid.oracle else []
    out += [Setting(k.name, knob, k) for knob, k in section.grid.settings()]
    return out


@dataclass(frozen=True)
class Context:
    item: Item
    setting: Setting
    text: str
    chunks: list[int]


# A retrievers entry's ranking of an item's query over a chunking's chunks (chunk indices as
# strings, best first), or None for the project's own retrievers
RankOf = Callable[[Knobs, Item], "Sequence[str] | None"]


def no_ranking(knobs: Knobs, item: Item) -> Sequence[str] | None:
    return None


def query_id(knobs: Knobs, item: Item) -> str:
    """The retrieval stage's name of an item's query over one chunking."""
    return f"c{knobs.chunk_size}-o{knobs.overlap_tokens}|{item.item_id}"


def contexts(
    section: CrudParams,
    items: Sequence[Item],
    corpus: Sequence[str],
    rank_of: RankOf = no_ranking,
) -> Iterator[Context]:
    """Every (item, setting) context; an index per chunking, built once."""
    for job in context_jobs(section, items, corpus):
        yield context_of(job, rank_of)


Job = tuple[Setting, Item, Index | None]


def context_jobs(section: CrudParams, items: Sequence[Item], corpus: Sequence[str]) -> list[Job]:
    """Every (setting, item) to make a context of, with the index it retrieves from (None: the
    oracle's own text); the indexes are built here, once per chunking."""
    indexes: dict[tuple[int, int], Index] = {}
    jobs: list[Job] = []
    for s in settings(section):
        if s.knobs is None:
            jobs += [(s, item, None) for item in items if item.oracle is not None]
            continue
        key = (s.knobs.chunk_size, s.knobs.overlap_tokens)
        if key not in indexes:
            if not corpus:
                raise ConfigError(
                    "crud_rag.corpus: no news texts to retrieve from (the source's records"
                    " carry none; name a folder of the authors' corpus files)"
                )
            indexes[key] = Index.build(corpus, *key)
        jobs += [(s, item, indexes[key]) for item in items]
    return jobs


def context_of(job: Job, rank_of: RankOf = no_ranking) -> Context:
    """One context: the oracle text, or the chunks retrieved for the item's query."""
    s, item, index = job
    if index is None or s.knobs is None:
        assert item.oracle is not None
        return Context(item, s, item.oracle, [])
    ids = retrieve(index, item.query, s.knobs, rank_of(s.knobs, item))
    return Context(item, s, T.join_context([index.chunks[i] for i in ids]), ids)


def meta(ctx: Context) -> dict[str, Any]:
    k = ctx.setting.knobs
    return {
        "knob": ctx.setting.knob,
        "knobs": k.model_dump() if k is not None else None,
        "chunks": ctx.chunks,
        "context_chars": len(ctx.text),
    }


def render(prompt: Prompt, item: Item, context: str) -> str:
    return prompt.render(**item.fields, context=context)


def plan(
    section: CrudParams,
    model: str,
    system: str,
    max_tokens: int,
    items: Sequence[Item],
    corpus: Sequence[str],
    prompts: dict[str, Prompt],
    rank_of: RankOf = no_ranking,
) -> list[Planned]:
    out = []
    for ctx in contexts(section, items, corpus, rank_of):
        prompt = prompts[PROMPT_OF_TASK[ctx.item.task]]
        request = ChatRequest(
            key=generation_id(ctx.item.item_id, system, ctx.setting.name, 0),
            messages=[{"role": "user", "content": render(prompt, ctx.item, ctx.text)}],
            prompt_sha=prompt.sha,
            max_tokens=section.generation.max_tokens,
        )
        m = meta(ctx) | {"prompt": prompt.path, "prompt_sha": prompt.sha, "max_tokens": max_tokens}
        out.append(Planned(request, ctx.item.item_id, system, ctx.setting.name, 0, m))
    return out


def _take(sentences: Sequence[str], max_chars: int) -> str:
    out: list[str] = []
    n = 0
    for s in sentences:
        if out and n + len(s) > max_chars:
            break
        out.append(s)
        n += len(s)
    return "".join(out)[: max(max_chars, len(out[0]) if out else 0)]


def lead(context: str, max_chars: int) -> str:
    return _take(T.sentences(context), max_chars)


def extractive(query: str, context: str, max_chars: int) -> str:
    import bm25s  # type: ignore[import-untyped]

    from pipeline.retrieval.bm25 import K1, METHOD, B

    sents = list(dict.fromkeys(T.sentences(context)))
    if not sents:
        return ""
    corpus = [T.words(s) or ["\u0000"] for s in sents]
    vocab = {w for c in corpus for w in c}
    q = [w for w in T.words(query) if w in vocab]
    if not q:
        return _take(sents, max_chars)
    index = bm25s.BM25(k1=K1, b=B, method=METHOD)
    index.index(corpus, show_progress=False)
    scores = index.get_scores(q)
    order = sorted(range(len(sents)), key=lambda i: (-float(scores[i]), i))
    taken: list[str] = []
    seen: list[set[str]] = []
    for i in order:
        w = set(corpus[i])
        if any(len(w & s) / max(1, len(w | s)) >= 0.8 for s in seen):
            continue
        taken.append(sents[i])
        seen.append(w)
    return _take(taken, max_chars)


def offline(
    section: CrudParams,
    model: str,
    system: str,
    kind: str,
    items: Sequence[Item],
    corpus: Sequence[str],
    rank_of: RankOf = no_ranking,
) -> list[Generation]:
    """The no-model baselines' answers."""
    from pipeline.core.parallel import fork_map

    mc = section.generation.max_chars

    def one(job: Job) -> Generation:
        ctx = context_of(job, rank_of)
        text = lead(ctx.text, mc) if kind == "lead" else extractive(ctx.item.query, ctx.text, mc)
        m = meta(ctx) | {"prompt_sha": f"baseline-{kind}", "max_chars": mc}
        return Generation.offline(
            "crud_rag", ctx.item.item_id, model, system, ctx.setting.name, text, m
        )

    jobs = context_jobs(section, items, corpus)
    warm(jobs, rank_of)
    # each retrieval and answer on its own: on every core, in the order of `contexts`
    return fork_map(one, jobs)


def warm(jobs: Sequence[Job], rank_of: RankOf = no_ranking) -> None:
    """Build here what the jobs' retrievals will read (each index's BM25 index or chunk
    vectors, jieba's dictionary for the queries), so the processes `fork_map` starts share it
    instead of each building its own."""
    needs: dict[int, tuple[Index, set[str]]] = {}
    for s, item, index in jobs:
        if index is None or s.knobs is None or rank_of(s.knobs, item) is not None:
            continue
        needs.setdefault(id(index), (index, set()))[1].add(s.knobs.retriever)
    for index, retrievers in needs.values():
        index.prepare(retrievers)
