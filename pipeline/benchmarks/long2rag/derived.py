"""The offline default: a Long²RAG-format dataset DERIVED from the SummHay haystacks.

The Long²RAG authors released no data, so that `dvc repro` can score KPR with no key and no
download, lfbench derives questions from the SummHay data it already has (data/summhay):

- one question per SummHay subtopic: `question` = the subtopic's query;
- `documents` = the top `n_documents` (5) documents of the haystack for that query, ranked by
  lfbench's BM25 (`pipeline.retrieval.bm25`, query = the subtopic query; ties keep haystack
  order), or MiniLM (`derived.retriever: dense`);
- `key_points` = the subtopic's planted insights that at least one of those documents holds;
  a key point's `doc_id` is the best-ranked of them, `support` all of them;
- `domain` = the haystack domain (news / conversation); `category` = the haystack id (news1 ..
  conv5: one topic each, its text in `meta.topic`);
- every record carries `derived_from: "summhay"`; ids are `<haystack>/<subtopic>`.

A question whose top documents hold none of its insights keeps an empty key-point list: the
scorer excludes it and counts it (`n_excluded_questions`). These questions are not the paper's
(no evolution, no web search, no human check); numbers on them are not comparable to its tables.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from pipeline.benchmarks.long2rag.schema import KeyPoint, L2Document, Question
from pipeline.core.benchmark import Inputs
from pipeline.data.haystacks import Haystack, haystack_file, normalise, parse_raw_haystack

DERIVED_FROM = "summhay"


def rank(query: str, texts: Sequence[str], retriever: str) -> list[int]:
    """Indices of `texts` from most to least relevant to `query` (stable on ties)."""
    if retriever == "bm25":
        from pipeline.retrieval.bm25 import bm25_scores

        scores = bm25_scores(query, texts)
    elif retriever == "dense":
        from pipeline.retrieval.dense import dense_scores

        scores = dense_scores(query, texts)
    else:
        raise ValueError(f"unknown retriever {retriever!r}")
    return sorted(range(len(texts)), key=lambda i: (-scores[i], i))


def questions_from_haystack(hay: Haystack, n_documents: int, retriever: str) -> list[Question]:
    texts = [d.text for d in hay.documents]
    out = []
    for sub in hay.subtopics:
        top = rank(sub.query, texts, retriever)[:n_documents]
        docs = [hay.documents[i] for i in top]
        key_points = []
        for ins in sub.insights:
            holders = [d.document_id for d in docs if ins.insight_id in d.insight_ids]
            if holders:
                key_points.append(
                    KeyPoint(
                        kp_id=ins.insight_id, text=ins.text, doc_id=holders[0], support=holders
                    )
                )
        out.append(
            Question(
                item_id=sub.item_id,
                question=sub.query,
                domain=hay.domain,
                category=hay.haystack_id,
                documents=[L2Document(doc_id=d.document_id, text=d.text) for d in docs],
                key_points=key_points,
                derived_from=DERIVED_FROM,
                meta={
                    "haystack": hay.haystack_id,
                    "topic": hay.topic,
                    "subtopic_id": sub.subtopic_id,
                    "retriever": retriever,
                    "insights_in_haystack": len(sub.insights),
                    "positions": [d.position for d in docs],
                },
            )
        )
    return out


def derive(
    inputs: Inputs,
    data_dir: str,
    haystacks: Sequence[str],
    subtopics: int | None,
    n_documents: int,
    retriever: str,
) -> tuple[list[Question], str]:
    """The derived questions, and a line for the log."""
    out: list[Question] = []
    for hid in haystacks:
        path = posixpath.join(data_dir, haystack_file(hid))
        hay = normalise(
            hid, parse_raw_haystack(inputs.json(path), path), source_file=haystack_file(hid)
        )
        if subtopics is not None:
            hay = hay.model_copy(update={"subtopics": hay.subtopics[:subtopics]})
        out.extend(questions_from_haystack(hay, n_documents, retriever))
    empty = sum(1 for q in out if not q.key_points)
    note = (
        f"derived from {len(haystacks)} SummHay haystacks ({retriever} top {n_documents}):"
        f" {sum(len(q.key_points) for q in out)} key points, {empty} questions whose documents"
        " hold no insight (excluded from KPR)"
    )
    return out, note
