"""Haystacks of any length from the released documents, offline (the length study).

A recombined haystack keeps one released haystack's task (its topic, subtopics, queries and
insights) and changes how much text surrounds it, counted in `cl100k_base` tokens of the
documents:

- **shorter** than the released haystack: a subset of its own documents. They are chosen so that
  every insight keeps at least one document where the budget allows (greedily, the document that
  holds the most insights not yet held first; ties in a seeded order), then filled with the rest
  of its documents in the seeded order, skipping any that would pass the target;
- **longer**: all of its documents, plus distractor documents of the other released haystacks of
  the same domain (seeded order, skipping any that would pass the target). A distractor plants
  none of this topic's insights, and its own insights belong to subtopics that are not tasks
  here, so its insight list is empty.

The documents are then shuffled (seeded), so a document's position (the id systems cite) says
nothing of where it came from. The insight-to-document map is carried over exactly, document by
document; gold citations and the oracle retriever's scores are recomputed from the new
positions. An insight left with no document (a short haystack that cannot hold them all) is
dropped, and counted. No other retriever's released scores carry over (they scored the released
haystack only): the computed retrievers (bm25, dense), the oracle and the full-context orders run
on it. The result is validated as a released haystack is, and labelled as derived: its rows'
`collection` column is the target length (e.g. `50k`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.data.haystacks import (
    Derivation,
    Haystack,
    RawDocument,
    RawHaystack,
    domain_of,
    normalise,
    parse_raw_haystack,
)

VERSION = "1"  # of the recipe: bump when the same parameters would give other haystacks


def collection_of(tokens: int) -> str:
    """The rows' label of a target length: 50000 -> '50k', 2500 -> '2.5k'."""
    k = tokens / 1000
    return f"{k:g}k"


def derived_id(haystack_id: str, tokens: int) -> str:
    return f"{haystack_id}@{collection_of(tokens)}"


@dataclass(frozen=True)
class _Doc:
    source: str
    doc: RawDocument
    tokens: int

    @property
    def doc_id(self) -> str:
        return f"{self.source}:{self.doc.document_id}"


def recipe_sha(target: str, tokens: int, seed: int, sources: Sequence[str]) -> str:
    recipe = {"v": VERSION, "target": target, "tokens": tokens, "seed": seed, "pool": list(sources)}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _fill(chosen: list[_Doc], candidates: Sequence[_Doc], budget: int, used: int) -> int:
    """Append the candidates not yet chosen that still fit, in order; the tokens now used."""
    taken = {d.doc_id for d in chosen}
    for d in candidates:
        if d.doc_id not in taken and used + d.tokens <= budget:
            chosen.append(d)
            taken.add(d.doc_id)
            used += d.tokens
    return used


def recombine(
    target_id: str,
    target: RawHaystack,
    pool: Sequence[tuple[str, RawHaystack]],
    tokens: int,
    seed: int,
    count: Callable[[list[str]], list[int]],
) -> Haystack:
    """The haystack of `target`'s task at `tokens` cl100k_base tokens of documents (see the module
    docstring); `pool`: the released haystacks distractors come from (the target excluded);
    `count`: token counts of texts."""
    rng = random.Random(f"{seed}/{target_id}/{tokens}")
    own = [
        _Doc(target_id, d, n)
        for d, n in zip(
            target.documents, count([d.document_text for d in target.documents]), strict=True
        )
    ]
    own_total = sum(d.tokens for d in own)
    order = list(own)
    rng.shuffle(order)
    chosen: list[_Doc] = []
    used = 0
    if own_total <= tokens:
        chosen, used = list(own), own_total
    else:
        uncovered = {i for d in own for i in d.doc.insights_included}
        while uncovered:
            taken = {d.doc_id for d in chosen}
            fits = [d for d in order if d.doc_id not in taken and used + d.tokens <= tokens]
            best = max(
                fits, key=lambda d: len(uncovered & set(d.doc.insights_included)), default=None
            )
            if best is None or not uncovered & set(best.doc.insights_included):
                break
            chosen.append(best)
            used += best.tokens
            uncovered -= set(best.doc.insights_included)
        used = _fill(chosen, order, tokens, used)
    distractors: list[_Doc] = []
    for hid, hay in pool:
        texts = [d.document_text for d in hay.documents]
        distractors += [_Doc(hid, d, n) for d, n in zip(hay.documents, count(texts), strict=True)]
    rng.shuffle(distractors)
    n_own = len(chosen)
    if own_total <= tokens:
        used = _fill(chosen, distractors, tokens, used)
    rng.shuffle(chosen)

    kept = {i for d in chosen if d.source == target_id for i in d.doc.insights_included}
    dropped_insights = 0
    subtopics: list[dict[str, Any]] = []
    for s in target.subtopics:
        insights = [i for i in s.insights if i.insight_id in kept]
        dropped_insights += len(s.insights) - len(insights)
        if not insights:
            continue
        ids = {i.insight_id for i in insights}
        oracle = {
            d.doc_id: float(len(ids & set(d.doc.insights_included)) if d.source == target_id else 0)
            for d in chosen
        }
        subtopics.append(
            {
                "subtopic_id": s.subtopic_id,
                "subtopic_name": s.subtopic_name,
                "subtopic": s.subtopic,
                "query": s.query,
                "insights": [i.model_dump() for i in insights],
                "retriever": {"oracle": oracle},
            }
        )
    raw = {
        "topic_id": f"{target.topic_id}@{collection_of(tokens)}",
        "topic": target.topic,
        "topic_metadata": {"participants": target.topic_metadata.get("participants") or []},
        "subtopics": subtopics,
        "documents": [
            {
                "document_id": d.doc_id,
                "document_text": d.doc.document_text,
                "insights_included": list(d.doc.insights_included) if d.source == target_id else [],
            }
            for d in chosen
        ],
    }
    hid = derived_id(target_id, tokens)
    where = f"{hid} (recombined from {target_id})"
    pool_ids = [h for h, _ in pool]
    by_source: dict[str, int] = {}
    for d in chosen:
        if d.source != target_id:
            by_source[d.source] = by_source.get(d.source, 0) + 1
    derivation = Derivation(
        kind="recombined",
        collection=collection_of(tokens),
        sources=[target_id, *sorted(by_source)],
        target_tokens=tokens,
        n_tokens=used,
        seed=seed,
        recipe_sha=recipe_sha(target_id, tokens, seed, pool_ids),
        figures={
            "target_documents": n_own,
            "target_documents_released": len(own),
            "target_tokens_released": own_total,
            "distractor_documents": len(chosen) - n_own,
            "distractors_by_haystack": dict(sorted(by_source.items())),
            "insights_dropped": dropped_insights,
            "subtopics_dropped": len(target.subtopics) - len(subtopics),
        },
    )
    return normalise(
        hid,
        parse_raw_haystack(raw, where),
        source_file=where,
        domain=domain_of(target_id),
        derived=derivation,
    )
