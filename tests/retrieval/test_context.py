"""Context settings: full-context orders, retriever ranking, token-budget packing."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.data.haystacks import (
    Document,
    Haystack,
    Insight,
    Subtopic,
    load_raw_haystack,
    normalise,
)
from pipeline.retrieval import context as ctx
from pipeline.retrieval.tokens import count_tokens

# 8 documents. Subtopic s1: insight a in docs 2 and 5, insight b in docs 5 and 7, so oracle
# scores are doc 5 -> 2, docs 2 and 7 -> 1, others 0. Doc 3 holds c, an insight of s2 only.
INSIGHTS_OF = {2: ["a"], 3: ["c"], 5: ["a", "b"], 7: ["b"]}
VECTOR = [0.1, 0.9, 0.5, 0.9, 0.2, 0.0, 0.7, 0.5]


def hand_haystack() -> tuple[Haystack, Subtopic]:
    docs = [
        Document(
            position=p,
            document_id=f"d{p}",
            text=" ".join(f"w{p}_{k}" for k in range(10)),
            insight_ids=INSIGHTS_OF.get(p, []),
        )
        for p in range(1, 9)
    ]
    s1 = Subtopic(
        item_id="h/s1",
        subtopic_id="s1",
        name="S1",
        subtopic="the first subtopic",
        query="What about the first subtopic?",
        insights=[
            Insight(insight_id="a", name="", text="A.", gold_docs=[2, 5]),
            Insight(insight_id="b", name="", text="B.", gold_docs=[5, 7]),
        ],
        retriever_scores={"vector": VECTOR, "oracle": [0, 1, 0, 0, 2, 0, 1, 0]},
    )
    s2 = s1.model_copy(
        update={
            "item_id": "h/s2",
            "subtopic_id": "s2",
            "insights": [Insight(insight_id="c", name="", text="C.", gold_docs=[3])],
        }
    )
    hay = Haystack(
        haystack_id="h",
        domain="news",
        topic_id="t",
        topic="T",
        participants=[],
        source_file="h.json",
        documents=docs,
        subtopics=[s1, s2],
    )
    return hay, s1


def positions(docs: list[Document]) -> list[int]:
    return [d.position for d in docs]


class WordCounter:
    """One token per whitespace-separated word: packing arithmetic checkable by hand."""

    def count(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, n: int) -> str:
        return " ".join(text.split()[:n])


def test_oracle_scores() -> None:
    hay, s1 = hand_haystack()
    assert ctx.oracle_scores(hay, s1) == [0, 1, 0, 0, 2, 0, 1, 0]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("full", [1, 2, 3, 4, 5, 6, 7, 8]),
        ("full-sort", [5, 2, 7, 1, 3, 4, 6, 8]),
        ("full-rev-sort", [1, 3, 4, 6, 8, 2, 7, 5]),
        ("full-middle", [1, 3, 5, 2, 7, 4, 6, 8]),
    ],
)
def test_full_context_orders(setting: str, expected: list[int]) -> None:
    hay, s1 = hand_haystack()
    assert positions(ctx.order_documents(hay, s1, setting)) == expected


def test_shuffle_is_seeded() -> None:
    hay, s1 = hand_haystack()
    a = positions(ctx.order_documents(hay, s1, "full-shuffle", seed=1))
    assert sorted(a) == list(range(1, 9))
    assert a == positions(ctx.order_documents(hay, s1, "full-shuffle", seed=1))
    assert a != positions(ctx.order_documents(hay, s1, "full-shuffle", seed=2))


def test_rank_documents_ties_by_position() -> None:
    hay, s1 = hand_haystack()
    assert positions(ctx.rank_documents(hay, s1, "vector")) == [2, 4, 7, 3, 8, 5, 1, 6]
    assert positions(ctx.rank_documents(hay, s1, "oracle")) == [5, 2, 7, 1, 3, 4, 6, 8]


def test_computed_retrievers_rank_all_documents() -> None:
    hay, s1 = hand_haystack()
    assert sorted(positions(ctx.rank_documents(hay, s1, "bm25"))) == list(range(1, 9))
    assert ctx.retrieval_query(s1) == "What about the first subtopic? the first subtopic"


def test_unknown_setting_and_missing_scores() -> None:
    hay, s1 = hand_haystack()
    with pytest.raises(LfbenchError, match=r"unknown context setting 'nope'; known: full, "):
        ctx.build_context(hay, s1, "nope")
    with pytest.raises(LfbenchError, match=r"no released 'rerank3' retriever scores"):
        ctx.build_context(hay, s1, "rerank3")


def test_pack_stops_at_budget_and_truncates_last() -> None:
    hay, s1 = hand_haystack()
    docs = ctx.rank_documents(hay, s1, "vector")  # 2, 4, 7, ...
    # each formatted document is 11 words: the "[p]" header and 10 words of text
    packed = ctx.pack(docs, 30, WordCounter())
    assert [(d.position, d.tokens, d.truncated) for d in packed] == [
        (2, 11, False),
        (4, 11, False),
        (7, 8, True),
    ]
    assert packed[2].text == "w7_0 w7_1 w7_2 w7_3 w7_4 w7_5 w7_6"
    assert ctx.pack(docs, 22, WordCounter()) == packed[:2]  # exactly full: nothing truncated
    assert ctx.pack(docs, 23, WordCounter()) == packed[:2]  # room for a header only
    assert len(ctx.pack(docs, None, WordCounter())) == 8
    assert ctx.pack(docs, 0, WordCounter()) == []


def test_build_context_text_and_defaults() -> None:
    hay, s1 = hand_haystack()
    c = ctx.build_context(hay, s1, "vector", budget_tokens=30, counter=WordCounter())
    assert c.text.startswith("[2]\nw2_0 ")
    assert "\n\n[4]\nw4_0 " in c.text
    assert c.n_tokens == 30
    assert c.budget_tokens == 30
    full = ctx.build_context(hay, s1, "full-rev-sort", counter=WordCounter())
    assert full.budget_tokens is None
    assert [d.position for d in full.documents] == [1, 3, 4, 6, 8, 2, 7, 5]
    assert not any(d.truncated for d in full.documents)
    rag = ctx.build_context(hay, s1, "oracle", counter=WordCounter())
    assert rag.budget_tokens == ctx.DEFAULT_BUDGET_TOKENS


def test_real_haystack_oracle(mirror: Path) -> None:
    path = mirror / "summhay" / "topic_news1.json"
    hay = normalise("news1", load_raw_haystack(path), path.name)
    for sub in hay.subtopics[:3]:
        gold = {p for ins in sub.insights for p in ins.gold_docs}
        assert [float(s) for s in ctx.oracle_scores(hay, sub)] == sub.retriever_scores["oracle"]
        ranked = positions(ctx.rank_documents(hay, sub, "oracle"))
        assert set(ranked[: len(gold)]) == gold
        top = positions(ctx.order_documents(hay, sub, "full-sort"))
        assert set(top[: len(gold)]) == gold
        bottom = positions(ctx.order_documents(hay, sub, "full-rev-sort"))
        assert set(bottom[-len(gold) :]) == gold

    sub = hay.subtopics[0]
    c = ctx.build_context(hay, sub, "oracle")
    assert c.n_tokens == count_tokens(c.text) <= 15_000
    sep = count_tokens(ctx.SEPARATOR)
    used = sum(d.tokens for d in c.documents) + sep * (len(c.documents) - 1)
    assert 15_000 - 5 <= used <= 15_000  # the last document fills the budget
    last = c.documents[-1]
    assert last.truncated and not any(d.truncated for d in c.documents[:-1])
    assert last.tokens == count_tokens(ctx.format_document(last.position, last.text))
    assert {d.position for d in c.documents} <= {p for i in sub.insights for p in i.gold_docs}
    full = ctx.build_context(hay, sub, "full")
    assert [d.position for d in full.documents] == list(range(1, len(hay.documents) + 1))
