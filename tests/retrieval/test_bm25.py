"""BM25 scoring and its tokenisation."""

from __future__ import annotations

from pipeline.retrieval.bm25 import bm25_scores, tokenize

DOCS = [
    "The city council approved a new budget for public parks on Tuesday.",
    "Researchers found that the new vaccine reduced hospital admissions by 40 percent.",
    "A storm knocked out power to thousands of homes along the coast.",
    "The football club signed a striker from Brazil for a record fee.",
]


def test_tokenize() -> None:
    assert tokenize("The COVID-19 vaccine's rollout, in 2021!") == [
        "covid",
        "19",
        "vaccine",
        "rollout",
        "2021",
    ]
    assert tokenize("The end", stopwords=False) == ["the", "end"]


def test_matching_document_first() -> None:
    scores = bm25_scores("vaccine hospital admissions", DOCS)
    assert len(scores) == len(DOCS)
    assert max(range(len(DOCS)), key=scores.__getitem__) == 1
    assert scores[1] > 0
    assert scores[0] == scores[2] == scores[3] == 0.0


def test_edge_cases() -> None:
    assert bm25_scores("anything", []) == []
    assert bm25_scores("the of and", DOCS) == [0.0] * len(DOCS)  # stopwords only
    assert bm25_scores("unseenword", DOCS) == [0.0] * len(DOCS)
    assert bm25_scores("storm", ["", "storm"])[1] > 0
    # deterministic
    assert bm25_scores("new budget parks", DOCS) == bm25_scores("new budget parks", DOCS)
