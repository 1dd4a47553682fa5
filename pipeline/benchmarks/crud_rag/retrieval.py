"""The retrieval contexts of the knob study: the corpus chunked, and the top-k chunks of a query.

- `bm25`: BM25 (bm25s, k1 1.5, b 0.75) over jieba words (text.words);
- `dense`: cosine similarity of MiniLM embeddings (pipeline.retrieval.dense; all-MiniLM-L6-v2,
  trained on English: a stand-in, not the paper's bge-base-zh);
- `hybrid`: reciprocal rank fusion of the bm25 and dense top-k lists (weights 0.5 and 0.5,
  constant 60, as the authors' code does; the paper's text says a random sample of the fused
  list), the top-k of the fused scores.

Ties: the earlier chunk (corpus order) first. An index is built once per (chunk size, overlap)
and serves every query and retriever of that chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.benchmarks.crud_rag import text as T
from pipeline.benchmarks.crud_rag.params import Knobs

RRF_K = 60
RRF_WEIGHTS = (0.5, 0.5)


@dataclass
class Index:
    """The corpus chunked one way; its BM25 index and, when asked, its chunk embeddings. BM25
    indexes the jieba words of each chunk's sentences (each sentence segmented on its own)."""

    size: int
    overlap: int
    chunks: list[str]
    doc_of: list[int]
    words: list[list[str]]
    _bm25: Any = None
    _vectors: np.ndarray | None = None
    _vocab: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, docs: Sequence[str], size: int, overlap: int) -> Index:
        from pipeline.retrieval.tokens import count_tokens

        chunks, doc_of, words = [], [], []
        counted: dict[str, int] = {}

        def count(piece: str) -> int:
            if piece not in counted:
                counted[piece] = count_tokens(piece)
            return counted[piece]

        cut: list[list[str]] = []
        for d, doc in enumerate(docs):
            for pieces in T.chunks(doc, size, overlap, count):
                chunks.append("".join(pieces))
                doc_of.append(d)
                cut.append(pieces)
        T.segment_all([p for pieces in cut for p in pieces])  # on every core, once per piece
        words = [[w for p in pieces for w in T.words(p)] for pieces in cut]
        return cls(size, overlap, chunks, doc_of, words)

    def _bm25_index(self) -> Any:
        if self._bm25 is None:
            import bm25s  # type: ignore[import-untyped]

            from pipeline.retrieval.bm25 import K1, METHOD, B

            corpus = [w or ["\u0000"] for w in self.words]
            self._vocab = {w for c in corpus for w in c}
            self._bm25 = bm25s.BM25(k1=K1, b=B, method=METHOD)
            self._bm25.index(corpus, show_progress=False)
        return self._bm25

    def prepare(self, retrievers: set[str]) -> None:
        """Build now what these retrievers read (the BM25 index and jieba's dictionary for
        the queries, the chunk vectors): a process that forks afterwards shares them."""
        if retrievers & {"bm25", "hybrid"}:
            self._bm25_index()
            T.words("")  # jieba's dictionary, loaded at its first text
        if retrievers & {"dense", "hybrid"} and self._vectors is None:
            from pipeline.retrieval.dense import embed

            self._vectors = np.asarray(embed(self.chunks))

    def bm25(self, query: str) -> np.ndarray:
        index = self._bm25_index()
        q = [w for w in T.words(query) if w in self._vocab]
        if not q:
            return np.zeros(len(self.chunks))
        return np.asarray(index.get_scores(q), dtype=float)

    def dense(self, query: str) -> np.ndarray:
        from pipeline.retrieval.dense import embed

        self.prepare({"dense"})
        q = np.asarray(embed([query]))[0]
        return np.asarray(self._vectors @ q, dtype=float)


def top(scores: np.ndarray, k: int) -> list[int]:
    """The k best chunks, ties by corpus order."""
    order = np.argsort(-np.asarray(scores, dtype=float), kind="stable")
    return [int(i) for i in order[:k]]


def rrf(lists: Sequence[Sequence[int]], k: int) -> list[int]:
    """Reciprocal rank fusion of ranked lists: sum over lists of w / (rank + 60), rank from 1;
    the union's top k, ties by first appearance."""
    fused: dict[int, float] = {}
    for weight, ranked in zip(RRF_WEIGHTS, lists, strict=True):
        for rank, c in enumerate(ranked, start=1):
            fused[c] = fused.get(c, 0.0) + weight / (rank + RRF_K)
    order = list(fused)
    return sorted(order, key=lambda c: (-fused[c], order.index(c)))[:k]


def retrieve(
    index: Index, query: str, knobs: Knobs, ranked: Sequence[str] | None = None
) -> list[int]:
    """The chunks (indices) a setting retrieves for a query, best first (`ranked`: a
    retrievers entry's ranking of the chunks, by index, from its retrieval stage)."""
    if ranked is not None:
        return [int(i) for i in ranked[: knobs.top_k]]
    if knobs.retriever == "bm25":
        return top(index.bm25(query), knobs.top_k)
    if knobs.retriever == "dense":
        return top(index.dense(query), knobs.top_k)
    if knobs.retriever != "hybrid":
        raise ValueError(f"no ranking of retriever {knobs.retriever!r} was given")
    return rrf(
        [top(index.bm25(query), knobs.top_k), top(index.dense(query), knobs.top_k)], knobs.top_k
    )
