"""Retrieval contexts: each retriever's ranking of a query's passages, and its cut-offs.

A context generation holds a ranking deep enough for every cut-off: `|Z*|` of the query, a
number of passages, and `budget`, the passages packed into `scoring.budget_tokens` cl100k tokens
by the same code that packs SummHay's RAG contexts (`pipeline.retrieval.context.pack`: in ranked
order, the last one truncated to fit). The judges rate every passage of the ranking, so the
cut-offs are a scoring choice (changing them judges nothing again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.benchmarks.crux.params import COMPUTED, CruxScoring
from pipeline.benchmarks.crux.schema import Passage, Query, QueryView
from pipeline.core.errors import DataError
from pipeline.core.records import Generation


def retrieval_text(q: Query) -> str:
    """What the computed retrievers score passages against (for a query derived from SummHay,
    its subtopic too, as the released retriever scores were computed)."""
    subtopic = q.meta.get("subtopic")
    return f"{q.query} {subtopic}" if subtopic else q.query


def rank(view: QueryView, retriever: str, ranked: Sequence[str] | None = None) -> list[str]:
    """The query's passages by the retriever, best first (ties: the collection's order);
    `ranked`: a retriever of the user's ranking (its retrieval stage's output)."""
    q = view.query
    if ranked is not None:
        unknown = [p for p in ranked if p not in view.passages]
        if unknown:
            raise DataError(
                f"retriever {retriever!r} ranks passages the collection lacks: {unknown[:3]}",
                item=q.item_id,
            )
        return list(ranked)
    if retriever in q.rankings:
        return list(q.rankings[retriever])
    pids = list(view.passages)
    if retriever == "zstar":  # the reference: Z* in greedy order, then the rest in order
        return [*q.zstar, *(p for p in pids if p not in set(q.zstar))]
    texts = [view.passages[p].text for p in pids]
    if retriever == "bm25":
        from pipeline.retrieval.bm25 import bm25_scores

        scores = bm25_scores(retrieval_text(q), texts)
    elif retriever == "dense":
        from pipeline.retrieval.dense import dense_scores

        scores = dense_scores(retrieval_text(q), texts)
    else:
        have = ", ".join([*sorted(q.rankings), *COMPUTED])
        raise DataError(
            f"no ranking by {retriever!r} (this query has: {have})",
            item=q.item_id,
            field=f"rankings.{retriever}",
        )
    order = sorted(range(len(pids)), key=lambda i: (-scores[i], i))
    return [pids[i] for i in order]


def pack_budget(
    ranking: Sequence[str], passages: Mapping[str, Passage], budget: int
) -> list[list[Any]]:
    """[[passage id, tokens], ...] of the passages packed into `budget` tokens (the last one's
    tokens as truncated to fit)."""
    from pipeline.data.haystacks import Document
    from pipeline.retrieval.context import pack
    from pipeline.retrieval.tokens import count_tokens

    docs = [
        Document(
            position=passages[p].position or n, document_id=p, text=passages[p].text, insight_ids=[]
        )
        for n, p in enumerate(ranking, start=1)
    ]
    packed = pack(docs, budget)
    by_position = {d.position: d.document_id for d in docs}
    return [[by_position[d.position], count_tokens(d.text)] for d in packed]


def depth(q: Query, scoring: CruxScoring, n_budget: int) -> int:
    numbers = [int(c) for c in scoring.cutoffs if c.isdigit()]
    return max([len(q.zstar), n_budget, *numbers, 1])


def generation(
    view: QueryView,
    retriever: str,
    model: str,
    system: str,
    scoring: CruxScoring,
    ranked: Sequence[str] | None = None,
    *,
    keep_all: bool = False,
) -> Generation:
    """One context: the retriever's ranking, deep enough for every cut-off (`keep_all`: all
    of it, e.g. the passages a RAG system used, whatever their number)."""
    ranking = rank(view, retriever, ranked)
    budget = pack_budget(ranking, view.passages, scoring.budget_tokens)
    kept = ranking if keep_all else ranking[: depth(view.query, scoring, len(budget))]
    meta = {"ranking": kept, "budget": budget, "prompt_sha": f"retrieval-{retriever}"}
    return Generation.offline(
        "crux",
        view.query.item_id,
        model,
        system,
        retriever,
        "\n".join(kept),
        meta,
        empty="no passage in the context",
    )


@dataclass(frozen=True)
class Context:
    passages: list[str]
    tokens: int


def cut(gen: Generation, q: Query, cutoff: str, passages: Mapping[str, Passage]) -> Context:
    """The context of a generation at a cut-off."""
    ranking: list[str] = list(gen.meta.get("ranking", []))
    if cutoff == "budget":
        packed = gen.meta.get("budget", [])
        return Context([p for p, _ in packed], sum(int(t) for _, t in packed))
    k = len(q.zstar) if cutoff == "zstar" else int(cutoff)
    chosen = ranking[:k]
    return Context(chosen, sum(passages[p].tokens for p in chosen))
