"""Answers cut for length (finish_reason: length), through the generate stage against the test
server (which ends an answer at the request's max_tokens, as a real server does): kept and
flagged, retried with a larger budget, or failed, and counted in the usage file; and the warning
names the real cause."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.benchmark import response_format
from pipeline.core.config import OpenAIJudge
from pipeline.core.errors import StageFailed
from pipeline.core.types import ChatResult
from pipeline.stages.generate import truncation_cause
from pipeline.testing.server import TestServer
from tests.stages.helpers import generate_tiny

ROOT = Path(__file__).resolve().parents[2]
ANSWER = "- " + "word " * 99 + "[1]"  # 500 characters: 125 test-server tokens


def long_answer(body: dict[str, Any]) -> str:
    return ANSWER


def _run(
    tmp_path: Path, haystack: dict[str, Any], write: Callable[..., Path], **model: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    path = write(haystack, "topic_news1.json")
    with TestServer(
        responder="tests.stages.test_truncation:long_answer", log_path=tmp_path / "s.log", cwd=ROOT
    ) as srv:
        try:
            out = generate_tiny(srv.base_url, path.parent, tmp_path, max_tokens=50, **model)
        finally:
            log = srv.log()
    gens = [json.loads(line) for line in out.read_text().splitlines()]
    usage = json.loads(out.with_name("tiny.usage.json").read_text())
    return gens, usage, log


def test_kept_and_flagged(
    tmp_path: Path, haystack: dict[str, Any], write_haystack: Callable[..., Path]
) -> None:
    gens, usage, log = _run(tmp_path, haystack, write_haystack)
    assert len(gens) == 2 and all(g["status"] == "ok" for g in gens)
    for g in gens:
        assert g["text"] == ANSWER[:200] and g["meta"]["truncated"] is True
        assert g["meta"]["truncation"] == "stopped at max_tokens (50) after 50 output tokens"
    assert usage["truncated"] == 2 and usage["requests_sent"] == 2
    assert len(log) == 2


def test_retried_with_a_larger_budget(
    tmp_path: Path, haystack: dict[str, Any], write_haystack: Callable[..., Path]
) -> None:
    gens, usage, log = _run(
        tmp_path, haystack, write_haystack, on_truncation="retry", retry_max_tokens=200
    )
    assert [g["text"] for g in gens] == [ANSWER, ANSWER]
    assert all(g["meta"]["retried_max_tokens"] == 200 for g in gens)
    assert all("truncated" not in g["meta"] for g in gens)
    # 2 first answers + 2 retries; nothing left cut
    assert usage["requests_sent"] == 4 and usage["truncated"] == 0 and len(log) == 4
    # each generation's usage counts its cut first answer (50 tokens) and its retry (125)
    assert [(g["usage"]["output_tokens"], g["usage"]["requests"]) for g in gens] == [(175, 2)] * 2
    assert usage["output_tokens"] == 2 * 175


def test_failed(
    tmp_path: Path, haystack: dict[str, Any], write_haystack: Callable[..., Path]
) -> None:
    with pytest.raises(StageFailed, match="2 item"):
        _run(tmp_path, haystack, write_haystack, on_truncation="fail")
    gens = [json.loads(line) for line in (tmp_path / "tiny.jsonl").read_text().splitlines()]
    assert all(g["status"] == "error" for g in gens)
    assert gens[0]["error"].startswith("truncated: stopped at max_tokens (50)")


def test_the_warning_names_the_context_window_when_the_answer_is_short() -> None:
    r = ChatResult(
        key="k", cache_key="c", status="ok", text="x", finish_reason="length",
        input_tokens=8150, output_tokens=42,
    )  # fmt: skip
    cause = truncation_cause(r, 512)
    assert cause.startswith("cut for length after 42 output tokens, below max_tokens (512)")
    assert "prompt (8150 tokens)" in cause and "context window" in cause


SCHEMA = {"type": "object", "properties": {"v": {"type": "string"}}}


@pytest.mark.parametrize(
    ("structured", "json_mode", "want"),
    [
        (None, True, {"type": "json_object"}),
        (None, False, None),
        ("json_object", False, {"type": "json_object"}),
        ("json_object_schema", True, {"type": "json_object", "schema": SCHEMA}),
        (
            "json_schema",
            True,
            {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": SCHEMA, "strict": False},
            },
        ),
    ],
)
def test_structured_output_forms(structured: Any, json_mode: bool, want: Any) -> None:
    spec = OpenAIJudge(
        provider="openai", base_url="http://x/v1", model="m", structured=structured,
        json_mode=json_mode,
    )  # fmt: skip
    assert response_format(spec, SCHEMA, "p") == want
    # a prompt the benchmark gives no schema for: a plain JSON object (or nothing)
    assert response_format(spec, None, "p") == (None if want is None else {"type": "json_object"})


# ---------------------------------------------------------------- cut by a content filter

FILTERED = "- the start of an answer [1]"


def _filtered(
    tmp_path: Path, haystack: dict[str, Any], write: Callable[..., Path], empty: Any, **model: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]], str]:
    """Subtopic one's answer cut by the server's content filter after some text; subtopic two's
    before any (`empty`: "" or null content)."""
    path = write(haystack, "topic_news1.json")
    script = [
        {"match": '"subtopic one"', "reply": FILTERED, "finish_reason": "content_filter"},
        {"match": '"subtopic two"', "reply": empty, "finish_reason": "content_filter"},
    ]
    with TestServer(script=script, log_path=tmp_path / "s.log", cwd=ROOT) as srv:
        failed = ""
        try:
            out = generate_tiny(srv.base_url, path.parent, tmp_path, **model)
        except StageFailed as e:
            failed, out = str(e), tmp_path / "tiny.jsonl"
        log = srv.log()
    gens = [json.loads(line) for line in out.read_text().splitlines()]
    usage = json.loads(out.with_name("tiny.usage.json").read_text())
    return sorted(gens, key=lambda g: g["item_id"]), usage, log, failed


@pytest.mark.parametrize("empty", ["", None])
def test_an_answer_cut_by_a_content_filter_is_flagged_and_counted_as_cut(
    tmp_path: Path,
    haystack: dict[str, Any],
    write_haystack: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
    empty: Any,
) -> None:
    """`finish_reason: content_filter` is a cut answer, as `length` is (issue 36, point 4): with
    text, kept and flagged with the cause; without, an error saying the filter stopped it (not
    "empty answer", no chat-template hint), sent once (not retried); both counted in the usage
    file's `truncated` and named in the stage's warning. Before: the partial answer passed as
    whole (not flagged, not counted) and the empty one was an "empty answer"."""
    caplog.set_level("WARNING")
    (one, two), usage, log, failed = _filtered(tmp_path, haystack, write_haystack, empty)
    assert one["status"] == "ok" and one["text"] == FILTERED
    assert one["meta"]["truncated"] is True and one["meta"]["finish_reason"] == "content_filter"
    assert "content filter" in one["meta"]["truncation"]
    assert two["status"] == "error" and "content filter" in two["error"], two
    assert "empty answer" not in two["error"]
    assert usage["truncated"] == 2 and usage["requests_sent"] == 2 and len(log) == 2
    assert "1 item(s) failed" in failed
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "content filter" in warnings and "chat template" not in warnings, warnings


def test_on_truncation_applies_to_a_content_filter_cut(
    tmp_path: Path, haystack: dict[str, Any], write_haystack: Callable[..., Path]
) -> None:
    """`fail` fails a filtered answer too; `retry` does not resend it (a larger max_tokens does
    not change what a filter stops): kept, flagged, sent once."""
    (one, _), _, _, _ = _filtered(tmp_path, haystack, write_haystack, "", on_truncation="fail")
    assert one["status"] == "error" and one["error"].startswith("truncated: ")
    assert "content filter" in one["error"]
    (tmp_path / "again").mkdir()
    (one, _), usage, log, _ = _filtered(
        tmp_path / "again", haystack, write_haystack, "", on_truncation="retry"
    )
    assert one["status"] == "ok" and one["meta"]["truncated"] is True
    assert "retried_max_tokens" not in one["meta"] and len(log) == 2 == usage["requests_sent"]
