"""SummHay's derived haystacks: recombination to a target length (gold citations checked by hand)
and the pure parts of synthesis (insight sampling, the specificity check, the answer parsers)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline.benchmarks.summhay.recombine import collection_of, recombine
from pipeline.benchmarks.summhay.synthesis import is_specific, numbers, one_number, sample_plan
from pipeline.core.errors import ConfigError
from pipeline.core.parse import ParseError
from pipeline.data.haystacks import Haystack, parse_raw_haystack


def words(texts: list[str]) -> list[int]:
    """A token counter that is easy to follow by hand: one token per word."""
    return [len(t.split()) for t in texts]


def _raw(topic: str, docs: list[tuple[str, str, list[str]]], subs: dict[str, list[str]]) -> Any:
    ids = [d for d, _, _ in docs]
    return parse_raw_haystack(
        {
            "topic_id": topic,
            "topic": f"topic {topic}",
            "subtopics": [
                {
                    "subtopic_id": s,
                    "subtopic": f"subtopic {s}",
                    "query": f"What about {s}?",
                    "insights": [{"insight_id": i, "insight": f"insight {i}"} for i in ins],
                    "retriever": {"random": {d: 0.5 for d in ids}},
                }
                for s, ins in subs.items()
            ],
            "documents": [
                {"document_id": d, "document_text": t, "insights_included": ins}
                for d, t, ins in docs
            ],
        },
        topic,
    )


# news1: d1 (4 words; i1), d2 (4; i1, i3), d3 (6; i2) = 14 tokens. s1 = {i1, i2}, s2 = {i3}.
TARGET = _raw(
    "news1",
    [("d1", "w " * 4, ["i1"]), ("d2", "w " * 4, ["i1", "i3"]), ("d3", "w " * 6, ["i2"])],
    {"s1": ["i1", "i2"], "s2": ["i3"]},
)
# news2: four distractors of 5 words, holding news2's own insight j1
POOL = [
    (
        "news2",
        _raw("news2", [(f"x{k}", "v " * 5, ["j1"]) for k in range(1, 5)], {"t1": ["j1"]}),
    )
]


def _pos(hay: Haystack) -> dict[str, int]:
    return {d.document_id: d.position for d in hay.documents}


def _gold(hay: Haystack) -> dict[str, list[int]]:
    return {i.insight_id: i.gold_docs for s in hay.subtopics for i in s.insights}


def test_a_longer_haystack_keeps_every_document_and_adds_distractors() -> None:
    hay = recombine("news1", TARGET, POOL, 25, 0, words)
    # 14 own tokens + 5 + 5 = 24; a third distractor (29) would pass 25
    assert hay.derived is not None and hay.derived.n_tokens == 24
    assert hay.haystack_id == "news1@0.025k" and hay.derived.collection == "0.025k"
    pos = _pos(hay)
    assert sorted(pos) == sorted(["news1:d1", "news1:d2", "news1:d3", *_distractors(hay)])
    assert len(_distractors(hay)) == 2
    # the gold citations follow the documents to their new positions
    assert _gold(hay) == {
        "i1": sorted([pos["news1:d1"], pos["news1:d2"]]),
        "i2": [pos["news1:d3"]],
        "i3": [pos["news1:d2"]],
    }
    # a distractor plants nothing here (news2's j1 is not a task of this haystack)
    for d in hay.documents:
        if d.document_id.startswith("news2:"):
            assert d.insight_ids == []
    # the oracle retriever: each document's count of the subtopic's insights
    s1, s2 = hay.subtopics
    by_id = {d.document_id: d for d in hay.documents}
    want = {"news1:d1": 1.0, "news1:d2": 1.0, "news1:d3": 1.0}
    assert s1.retriever_scores == {"oracle": [want.get(d.document_id, 0.0) for d in hay.documents]}
    assert s2.retriever_scores["oracle"][pos["news1:d2"] - 1] == 1.0
    assert sum(s2.retriever_scores["oracle"]) == 1.0
    assert by_id["news1:d2"].insight_ids == ["i1", "i3"]
    f = hay.derived.figures
    assert (f["target_documents"], f["distractor_documents"], f["insights_dropped"]) == (3, 2, 0)
    assert f["distractors_by_haystack"] == {"news2": 2}


def _distractors(hay: Haystack) -> list[str]:
    return [d.document_id for d in hay.documents if d.document_id.startswith("news2:")]


def test_a_shorter_haystack_keeps_every_insight_it_can() -> None:
    # 10 tokens: d2 first (it holds 2 insights), then d3 (i2): all three insights, d1 left out
    hay = recombine("news1", TARGET, POOL, 10, 0, words)
    pos = _pos(hay)
    assert sorted(pos) == ["news1:d2", "news1:d3"]
    assert _gold(hay) == {"i1": [pos["news1:d2"]], "i2": [pos["news1:d3"]], "i3": [pos["news1:d2"]]}
    assert hay.derived is not None and hay.derived.n_tokens == 10


def test_an_insight_that_cannot_fit_is_dropped_and_counted() -> None:
    # 8 tokens: d2 (4), then d3 (6) does not fit; d1 (4) fills. i2 is in no kept document.
    hay = recombine("news1", TARGET, POOL, 8, 0, words)
    assert sorted(_pos(hay)) == ["news1:d1", "news1:d2"]
    assert [[i.insight_id for i in s.insights] for s in hay.subtopics] == [["i1"], ["i3"]]
    assert hay.derived is not None and hay.derived.figures["insights_dropped"] == 1
    assert all(g for g in _gold(hay).values())


def test_recombination_is_seeded_and_deterministic() -> None:
    a = recombine("news1", TARGET, POOL, 25, 0, words)
    assert a.model_dump() == recombine("news1", TARGET, POOL, 25, 0, words).model_dump()
    orders = {
        tuple(d.document_id for d in recombine("news1", TARGET, POOL, 25, s, words).documents)
        for s in range(6)
    }
    assert len(orders) > 1
    assert a.derived is not None
    other = recombine("news1", TARGET, POOL, 25, 1, words).derived
    assert other is not None and other.recipe_sha != a.derived.recipe_sha


def test_collection_labels() -> None:
    assert [collection_of(t) for t in (25000, 200000, 2500)] == ["25k", "200k", "2.5k"]


# ---------------------------------------------------------------- synthesis, the pure parts


@pytest.mark.parametrize("seed", range(5))
def test_sampling_gives_every_insight_its_minimum(seed: int) -> None:
    plan = sample_plan(9, 12, None, 2, random.Random(seed))
    assert len(plan) == 12 and all(len(set(d)) == len(d) == 2 for d in plan)  # ceil(18 / 12)
    held = [sum(1 for d in plan if i in d) for i in range(9)]
    assert min(held) >= 2 and sum(held) == 24
    plan = sample_plan(9, 12, 4, 3, random.Random(seed))
    assert all(len(set(d)) == 4 for d in plan)
    assert min(sum(1 for d in plan if i in d) for i in range(9)) >= 3


def test_sampling_refuses_what_cannot_be_done() -> None:
    with pytest.raises(ConfigError, match="cannot give each of 5 insights 2 documents"):
        sample_plan(5, 3, 2, 2, random.Random(0))
    with pytest.raises(ConfigError, match="more than the haystack's 2 insights"):
        sample_plan(2, 3, 3, 1, random.Random(0))


def test_specificity_check() -> None:
    assert is_specific("Ana counted 40 boats.")
    assert is_specific("the fair moved to Lisbon")
    assert is_specific("it rained on 3 May")
    assert not is_specific("people enjoyed it a lot.")
    assert not is_specific("Everyone enjoyed the fair.")  # a capital only at the start


def test_parsers_name_the_problem() -> None:
    assert numbers('{"present": [3, 1, 3]}', "present", 3) == [1, 3]
    with pytest.raises(ParseError, match=r"holds \[4\]: the numbers go from 1 to 3"):
        numbers('{"present": [4]}', "present", 3)
    with pytest.raises(ParseError, match="list of whole numbers"):
        numbers('{"present": ["1"]}', "present", 3)
    with pytest.raises(ParseError, match="from 1 to 2, got 0"):
        one_number('{"subtopic": 0}', "subtopic", 2)
