"""CRUX's judges: the rating parser, the LLM judge's requests (one per pair, each pair sent once
whatever the contexts that rank it), and the local judge's view of a passage."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.benchmarks.crux import judging
from pipeline.core.benchmark import JudgePrompts
from pipeline.core.parse import ParseError
from pipeline.core.prompts import load_prompt
from pipeline.local_judge.model import LocalVerdict
from tests.benchmarks.crux.test_scoring import BENCH, built, ctx

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "pipeline" / "benchmarks" / "crux" / "prompts"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{"rating": 4}', "4"),
        ('```json\n{"rating": "5"}\n```', "5"),
        ('{"rating": 0, "why": "unrelated"}', "0"),
    ],
)
def test_rating_parser_reads(text: str, want: str) -> None:
    assert judging.parse_rating(text) == want


REFUSED = ['Sure. {"rating": 3}', '{"rating": 6}', '{"rating": -1}', '{"rating": 2.5}',
           '{"rating": true}', '{"score": 3}', "four", "", None]  # fmt: skip


@pytest.mark.parametrize("text", REFUSED)
def test_rating_parser_refuses(text: str | None) -> None:
    with pytest.raises(ParseError):
        judging.parse_rating(text)


def prompts() -> JudgePrompts:
    rate, repair = load_prompt(PROMPTS / "rate.txt"), load_prompt(PROMPTS / "repair.txt")
    return JudgePrompts(rate, repair, "per_insight", {"type": "json_object"})


def test_llm_requests_one_per_pair_keyed_by_query_passage_and_sub_question() -> None:
    c = ctx()
    dataset, gens, _ = built(c)
    items = BENCH.items(dataset)
    tasks = [judging.rating_task(g, items[g.item_id], prompts()) for g in gens if g.item_id == "q1"]
    keys = [a.request.key for t in tasks for a in t.asks]
    # first-stage ranks p4, p1; zstar p1, p2; three sub-questions each
    assert len(keys) == 12 and len(set(keys)) == 9  # p1's three asks are shared
    assert "q1#p1#q2" in keys
    (ask,) = [a for a in tasks[0].asks if a.request.key == "q1#p1#q1"]
    content = ask.request.messages[0]["content"]
    assert "Who organised the harbour festival?" in content and "fishermen's guild" in content
    assert ask.repair is not None and ask.request.response_format == {"type": "json_object"}
    values, problems = ask.parse('{"rating": 5}', ["p1#q1"])
    assert values["p1#q1"].label == "5" and problems == {}
    values, problems = ask.parse('{"rating": 9}', ["p1#q1"])
    assert values == {} and "0 to 5" in problems["p1#q1"]
    # the same pair in another context: the same request, byte for byte
    (again,) = [a for a in tasks[1].asks if a.request.key == "q1#p1#q1"]
    assert again.request == ask.request


def test_the_local_judge_sees_each_pair_with_the_passage_s_best_sentences() -> None:
    c = ctx(local_sentences=1)
    dataset, gens, _ = built(c)
    items = BENCH.items(dataset)
    cases = BENCH.coverage.cases(c, items["q1"], gens[0])  # p4, p1
    assert [[t for t, _ in case.targets] for case in cases] == [
        ["p4#q1"], ["p4#q2"], ["p4#q3"], ["p1#q1"], ["p1#q2"], ["p1#q3"]
    ]  # fmt: skip
    # "Who organised the harbour festival?" shares three words with p1's second sentence
    assert cases[3].bullets == ["The harbour festival was organised by the fishermen's guild."]
    # p4 shares no content word with "How much did the festival cost?": its first sentence
    assert cases[1].bullets == ["Local shops reported a busy weekend."]
    two = BENCH.coverage.cases(ctx(local_sentences=2), items["q1"], gens[0])
    assert two[3].bullets == [
        "Festival opens",
        "The harbour festival was organised by the fishermen's guild.",
    ]  # in passage order
    full = LocalVerdict("FULL_COVERAGE", 1, (0.1, 0.1, 0.8))
    part = LocalVerdict("PARTIAL_COVERAGE", 1, (0.1, 0.8, 0.1))
    none = LocalVerdict("NO_COVERAGE", None, (0.8, 0.1, 0.1))
    assert [BENCH.coverage.verdict("p1#q1", v).label for v in (full, part, none)] == ["5", "3", "0"]
