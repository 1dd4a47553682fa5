"""The LLM judge's answer parsing, repair bookkeeping and prompt rendering (no model calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.benchmarks.summhay import judging
from pipeline.core.errors import ConfigError
from pipeline.llm.client import ChatRequest, ChatResult
from pipeline.core.prompts import combined_sha, load_prompt
from pipeline.core.records import Generation

ROOT = Path(__file__).resolve().parents[2]


def _result(text: str | None, status: str = "ok", tokens: int = 10) -> ChatResult:
    return ChatResult(
        key="k",
        cache_key="c",
        status=status,  # type: ignore[arg-type]
        text=text,
        error=None if status == "ok" else "HTTP 500 after 6 retries",
        input_tokens=tokens,
        output_tokens=2,
    )


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


def _task() -> judging.Task:
    gen = Generation(
        benchmark="summhay",
        item_id="news1/s1",
        model="m",
        system="m",
        setting="oracle",
        status="ok",
        text="- first [1]\n- second [2][3]",
    )
    return judging.Task(gen, ["- first [1]", "- second [2][3]"], ["a", "b"])


def test_absorb_repair_then_invalid_is_recorded_not_zero() -> None:
    t = _task()
    bad = judging.absorb(t, "a", _result("garbage"), final=False)
    assert bad is not None and "not valid JSON" in bad["a"]
    assert "a" not in t.verdicts
    judging.absorb(t, "a", _result("still garbage"), final=True)
    v = t.verdicts["a"]
    assert v.status == "invalid" and v.label == "INVALID" and "still garbage" in (v.raw or "")
    # a repaired answer replaces the problem
    judging.absorb(t, "b", _result("nope"), final=False)
    judging.absorb(t, "b", _result('{"coverage": "FULL_COVERAGE", "bullet_id": 2}'), final=True)
    assert t.verdicts["b"].status == "ok" and "b" not in t.problems
    assert t.calls == 4 and t.input_tokens == 40


def test_absorb_batch_repair_reads_only_the_bad_insights() -> None:
    t = _task()
    first = json.dumps(
        {"verdicts": [{"insight_id": "a", "coverage": "FULL_COVERAGE", "bullet_id": 1}]}
    )
    bad = judging.absorb(t, None, _result(first), final=False)
    assert bad is not None and set(bad) == {"b"}
    # the repair answer also (wrongly) changes "a": only "b" is taken from it
    second = json.dumps(
        {
            "verdicts": [
                {"insight_id": "a", "coverage": "NO_COVERAGE", "bullet_id": "NA"},
                {"insight_id": "b", "coverage": "PARTIAL_COVERAGE", "bullet_id": 2},
            ]
        }
    )
    judging.absorb(t, None, _result(second), final=True, only=["b"])
    assert t.verdicts["a"].label == "FULL_COVERAGE"
    assert t.verdicts["b"].label == "PARTIAL_COVERAGE"


def test_absorb_request_error_is_an_error_not_a_verdict() -> None:
    t = _task()
    assert judging.absorb(t, "a", _result(None, status="error"), final=True) is None
    assert t.errors and t.verdicts == {}


def test_repair_request_shows_the_answer_and_the_problem() -> None:
    repair = load_prompt("prompts/summhay/judge_repair.txt", ROOT)
    first = ChatRequest("g#a", [{"role": "user", "content": "task"}], "sha", 0, None, None)
    r = judging.repair_request(first, "garbage", "it is not valid JSON", repair)
    assert r.key == "g#a#repair" and r.prompt_sha == "sha"
    assert [m["role"] for m in r.messages] == ["user", "assistant", "user"]
    assert r.messages[1]["content"] == "garbage"
    assert "it is not valid JSON" in r.messages[2]["content"]


def test_project_prompts_render_with_the_placeholders_the_code_fills() -> None:
    t = _task()
    bj = judging.bullets_json(t.bullets)
    assert json.loads(bj)["bullets"][1] == {"bullet_id": 2, "text": "- second [2][3]"}
    single = load_prompt("prompts/summhay/judge_insight.txt", ROOT).render(bullets=bj, insight="X")
    assert bj in single and '"X"' in single and "${" not in single
    batch = load_prompt("prompts/summhay/judge_batch.txt", ROOT).render(bullets=bj, insights="[]")
    assert "${" not in batch
    values = dict.fromkeys(
        ["n_documents", "topic", "participants", "documents", "query", "subtopic", "n_insights"],
        "v",
    )
    for name in ("generate_news", "generate_conversation"):
        text = load_prompt(f"prompts/summhay/{name}.txt", ROOT).render(**values)
        assert "${" not in text


def test_prompt_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.txt: prompt file not found"):
        load_prompt(tmp_path / "missing.txt")
    bad = tmp_path / "mine.txt"
    bad.write_text("Summarise ${documentz}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"mine.txt: placeholder \$\{documentz\}"):
        load_prompt(bad).render(documents="d")
    a, b = load_prompt(bad), load_prompt("prompts/summhay/judge_repair.txt", ROOT)
    assert combined_sha(a, b) != combined_sha(b, a) and len(a.sha) == 64
