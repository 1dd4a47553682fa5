"""The one judge loop (pipeline/llm_judge/loop.py): first pass, one repair, invalid values counted
with the raw answer, request failures kept apart. Through the real client and the test server
(scripted answers), and its bookkeeping on hand-made results."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.benchmark import WHOLE, Answer, Ask, Parsed, single
from pipeline.core.parse import ParseError, load_object
from pipeline.core.prompts import Prompt, load_prompt
from pipeline.core.types import ChatRequest, ChatResult, EndpointConfig
from pipeline.llm_judge.loop import _absorb, ask_all, repair_request
from pipeline.testing.server import TestServer

ROOT = Path(__file__).resolve().parents[2]
REPAIR = Prompt("repair.txt", "Your reply could not be used: ${problem}", "r" * 64)

# The last user message decides the answer: the first requests by their marker, the repair
# requests by the problem they quote (which quotes the bad answer).
SCRIPT: list[dict[str, Any]] = [
    {"match": "no n in 'fixable'", "reply": '{"n": 2}'},
    {"match": "no n in 'hopeless'", "reply": "hopeless again"},
    {"match": "x and y wanted", "reply": '{"x": 9, "y": 8}'},
    {"match": "[ok]", "reply": '{"n": 1}'},
    {"match": "[fix]", "reply": "fixable"},
    {"match": "[hopeless]", "reply": "hopeless"},
    {"match": "[norepair]", "reply": "hopeless"},
    {"match": "[batch]", "reply": '{"x": 5}'},
    {"match": "[bad-request]", "status": 400, "reply": "invalid request"},
]


def number(text: str | None) -> int:
    obj = load_object(text) if text and text.startswith("{") else {}
    if not isinstance(obj.get("n"), int):
        raise ParseError(f"no n in {text!r}")
    return int(obj["n"])


def both(text: str | None, targets: Sequence[str]) -> Parsed:
    obj = load_object(text)
    good = {t: obj[t] for t in targets if isinstance(obj.get(t), int)}
    return good, {t: "x and y wanted" for t in targets if t not in good}


def ask(key: str, content: str, repair: Prompt | None = REPAIR) -> Ask:
    req = ChatRequest(key, [{"role": "user", "content": content}], "sha", 0, None, None)
    return Ask(req, single(number), (WHOLE,), repair)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    log = tmp_path_factory.mktemp("loop-server") / "requests.log"
    with TestServer(script=SCRIPT, log_path=log, cwd=ROOT) as srv:
        yield srv


def test_first_pass_repair_and_invalid_through_the_server(
    server: TestServer, tmp_path: Path
) -> None:
    endpoint = EndpointConfig(
        base_url=server.base_url, model="m", api_key_env=None, max_retries=0, timeout_s=5.0
    )
    batch = Ask(
        ChatRequest("k5", [{"role": "user", "content": "[batch] five"}], "sha", 0, None, None),
        both,
        ("x", "y"),
        REPAIR,
    )
    asks = [
        ask("k1", "[ok] one"),
        ask("k2", "[fix] two"),
        ask("k3", "[hopeless] three"),
        ask("k4", "[norepair] four", repair=None),
        batch,
        ask("k6", "[bad-request] six"),
    ]
    answers, report = ask_all(
        endpoint, asks, repair=True, cache_path=None, journal_path=None, label="t"
    )
    ok, fixed, hopeless, norepair, batched, failed = answers
    assert ok.value == 1 and ok.ok and ok.calls == 1
    assert fixed.value == 2 and fixed.ok and fixed.calls == 2  # repaired
    assert not hopeless.values and hopeless.calls == 2
    assert hopeless.invalid[WHOLE] == "no n in 'hopeless again' | answer: hopeless again"
    assert "repair" not in norepair.invalid[WHOLE] and norepair.calls == 1  # no repair prompt
    assert not norepair.values and "no n in 'hopeless'" in norepair.invalid[WHOLE]
    # the repair answer also gives x (9): only y, the target still wanted, is read from it
    assert batched.values == {"x": 5, "y": 8} and batched.calls == 2
    assert failed.errors and not failed.values and not failed.invalid and failed.calls == 1
    assert "request failed" in failed.failure
    # 6 first requests, 3 repairs (fix, hopeless, batch); the usage report counts them all
    log = [json.loads(line) for line in server.log_path.read_text().splitlines()]
    assert len(log) == 9 and report.items == 9
    repairs = [e for e in log if "could not be used" in e["prompt_head"]]
    assert len(repairs) == 3


def _result(text: str | None, status: str = "ok") -> ChatResult:
    return ChatResult(
        key="k",
        cache_key="c",
        status=status,  # type: ignore[arg-type]
        text=text,
        error=None if status == "ok" else "HTTP 500 after 6 retries",
        input_tokens=10,
        output_tokens=2,
    )


def test_absorb_counts_every_call_and_reads_only_wanted_targets() -> None:
    a = Answer(Ask(ChatRequest("k", [], "s"), both, ("x", "y")))
    assert _absorb(a, _result('{"x": 1}'), ["x", "y"]) == {"y": "x and y wanted"}
    assert _absorb(a, _result('{"x": 7, "y": 2}'), ["y"]) == {}
    assert a.values == {"x": 1, "y": 2} and a.calls == 2 and a.input_tokens == 20
    assert _absorb(a, _result(None, status="error"), ["x"]) == {}
    assert a.errors == ["HTTP 500 after 6 retries"]


def test_repair_request_shows_the_answer_and_the_problem() -> None:
    repair = load_prompt("pipeline/benchmarks/summhay/prompts/judge_repair.txt", ROOT)
    first = ChatRequest("g#a", [{"role": "user", "content": "task"}], "sha", 0, None, None)
    r = repair_request(first, "garbage", "it is not valid JSON", repair)
    assert r.key == "g#a#repair" and r.prompt_sha == "sha"
    assert [m["role"] for m in r.messages] == ["user", "assistant", "user"]
    assert r.messages[1]["content"] == "garbage"
    assert "it is not valid JSON" in r.messages[2]["content"]
