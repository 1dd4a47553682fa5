"""The LLM judge's answer parsing, repair bookkeeping and prompt rendering (no model calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.benchmarks.summhay import judging
from pipeline.core.benchmark import JudgePrompts
from pipeline.core.errors import ConfigError
from pipeline.core.prompts import combined_sha, load_prompt
from pipeline.core.records import Generation
from pipeline.data.haystacks import Insight, Subtopic

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = "pipeline/benchmarks/summhay/prompts"


@pytest.mark.parametrize(
    ("answer", "label", "link"),
    [
        ('{"coverage": "FULL_COVERAGE", "bullet_id": 2}', "FULL_COVERAGE", 2),
        ('{"coverage": "PARTIAL_COVERAGE", "bullet_id": "3"}', "PARTIAL_COVERAGE", 3),
        ('{"coverage": "NO_COVERAGE", "bullet_id": "NA"}', "NO_COVERAGE", "NA"),
        ('{"coverage": "NO_COVERAGE"}', "NO_COVERAGE", "NA"),
        ('```json\n{"coverage": "FULL_COVERAGE", "bullet_id": 1}\n```', "FULL_COVERAGE", 1),
    ],
)
def test_parse_single_accepts(answer: str, label: str, link: object) -> None:
    v = judging.parse_single(answer, "i1", n_bullets=3)
    assert (v.target_id, v.label, v.link, v.status) == ("i1", label, link, "ok")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("", "empty"),
        (None, "empty"),
        ("Sure! It is covered by bullet 2.", "not valid JSON"),
        ('["FULL_COVERAGE", 2]', "not an object"),
        ('{"coverage": "MOSTLY", "bullet_id": 2}', '"coverage" must be one of'),
        ('{"coverage": "FULL_COVERAGE", "bullet_id": "NA"}', "integer"),
        ('{"coverage": "FULL_COVERAGE", "bullet_id": true}', "integer"),
        ('{"coverage": "FULL_COVERAGE", "bullet_id": 4}', "not a bullet number (1..3)"),
        ('{"coverage": "PARTIAL_COVERAGE", "bullet_id": 0}', "not a bullet number"),
        ('{"coverage": "FULL_COVERAGE"} trailing', "not valid JSON"),
    ],
)
def test_parse_single_rejects_with_reason(answer: str | None, problem: str) -> None:
    with pytest.raises(judging.ParseError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        judging.parse_single(answer, "i1", n_bullets=3)


def test_parse_batch_keeps_good_verdicts_and_names_bad_ones() -> None:
    answer = json.dumps(
        {
            "verdicts": [
                {"insight_id": "a", "coverage": "FULL_COVERAGE", "bullet_id": 1},
                {"insight_id": "b", "coverage": "WHAT", "bullet_id": 1},
                {"insight_id": "c", "coverage": "NO_COVERAGE", "bullet_id": "NA"},
                {"insight_id": "c", "coverage": "NO_COVERAGE", "bullet_id": "NA"},
                {"insight_id": "zz", "coverage": "NO_COVERAGE", "bullet_id": "NA"},
            ]
        }
    )
    good, bad = judging.parse_batch(answer, ["a", "b", "c", "d"], n_bullets=2)
    assert set(good) == {"a"} and good["a"].link == 1
    assert set(bad) == {"b", "c", "d"}
    assert "has 2 verdicts" in bad["c"] and "has 0 verdicts" in bad["d"]


def test_parse_batch_whole_answer_problem_applies_to_every_insight() -> None:
    good, bad = judging.parse_batch("no json here", ["a", "b"], n_bullets=2)
    assert good == {} and set(bad) == {"a", "b"}
    good, bad = judging.parse_batch('{"answers": []}', ["a"], n_bullets=2)
    assert 'no "verdicts" list' in bad["a"]


def _gen() -> Generation:
    return Generation(
        benchmark="summhay",
        item_id="news1/s1",
        model="m",
        system="m",
        setting="oracle",
        status="ok",
        text="- first [1]\n- second [2][3]",
    )


def _sub() -> Subtopic:
    return Subtopic(
        item_id="news1/s1",
        subtopic_id="s1",
        name="",
        subtopic="",
        query="q",
        insights=[
            Insight(insight_id="a", name="", text="Insight A.", gold_docs=[1]),
            Insight(insight_id="b", name="", text="Insight B.", gold_docs=[2]),
        ],
        retriever_scores={},
    )


def test_judge_task_per_insight_and_batched() -> None:
    p = load_prompt(f"{PROMPTS}/judge_insight.txt", ROOT)
    b = load_prompt(f"{PROMPTS}/judge_batch.txt", ROOT)
    r = load_prompt(f"{PROMPTS}/judge_repair.txt", ROOT)
    t = judging.judge_task(
        _gen(), _sub(), JudgePrompts(p, r, "per_insight", {"type": "json_object"})
    )
    assert t.targets == ("a", "b") and t.prompt_sha == combined_sha(p, r)
    assert [a.request.key for a in t.asks] == [
        "news1/s1|oracle|m|0#a",
        "news1/s1|oracle|m|0#b",
    ]
    assert [a.targets for a in t.asks] == [("a",), ("b",)] and t.asks[0].repair is r
    assert "Insight A." in t.asks[0].request.messages[0]["content"]
    good, bad = t.asks[0].parse('{"coverage": "FULL_COVERAGE", "bullet_id": 2}', ["a"])
    assert good["a"].link == 2 and not bad
    good, bad = t.asks[0].parse('{"coverage": "FULL_COVERAGE", "bullet_id": 3}', ["a"])
    assert not good and "not a bullet number (1..2)" in bad["a"]
    t = judging.judge_task(_gen(), _sub(), JudgePrompts(b, r, "batched", None))
    (ask,) = t.asks
    assert ask.request.key == "news1/s1|oracle|m|0" and ask.targets == ("a", "b")
    assert ask.request.response_format is None and t.prompt_sha == combined_sha(b, r)


def test_project_prompts_render_with_the_placeholders_the_code_fills() -> None:
    bj = judging.bullets_json(["- first [1]", "- second [2][3]"])
    assert json.loads(bj)["bullets"][1] == {"bullet_id": 2, "text": "- second [2][3]"}
    single = load_prompt(f"{PROMPTS}/judge_insight.txt", ROOT).render(bullets=bj, insight="X")
    assert bj in single and '"X"' in single and "${" not in single
    batch = load_prompt(f"{PROMPTS}/judge_batch.txt", ROOT).render(bullets=bj, insights="[]")
    assert "${" not in batch
    values = dict.fromkeys(
        ["n_documents", "topic", "participants", "documents", "query", "subtopic", "n_insights"],
        "v",
    )
    for name in ("generate_news", "generate_conversation"):
        text = load_prompt(f"{PROMPTS}/{name}.txt", ROOT).render(**values)
        assert "${" not in text


def test_prompt_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.txt: prompt file not found"):
        load_prompt(tmp_path / "missing.txt")
    bad = tmp_path / "mine.txt"
    bad.write_text("Summarise ${documentz}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"mine.txt: placeholder \$\{documentz\}"):
        load_prompt(bad).render(documents="d")
    a, b = load_prompt(bad), load_prompt(f"{PROMPTS}/judge_repair.txt", ROOT)
    assert combined_sha(a, b) != combined_sha(b, a) and len(a.sha) == 64
