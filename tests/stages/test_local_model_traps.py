"""Local models without traps: answers that are mostly empty (a GGUF served without its chat
template) or mostly copied from the context (a base model) are measured (`meta.copy_rate`) and
warned about once per stage, through the generate stage against the test server."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.copying import copy_rate, local_model_traps
from pipeline.core.errors import StageFailed
from pipeline.testing.server import TestServer, last_user_message
from tests.stages.helpers import generate_tiny

ROOT = Path(__file__).resolve().parents[2]


def echo_documents(body: dict[str, Any]) -> str:
    """A base model: the first 60 words of its prompt's documents, as they are."""
    text = last_user_message(body)
    return " ".join(text.split()[-400:][:60])


def summarise(body: dict[str, Any]) -> str:
    return "- The council approved a new budget for the coming year [1]\n- Taxes stay flat [2]"


def empty(body: dict[str, Any]) -> str:
    return ""


def test_copy_rate_by_hand() -> None:
    prompt = "the quick brown fox jumps over the lazy dog near the river bank today"
    # 8 answer words; the first 6 are a run of the prompt: 6/8 copied
    assert copy_rate("the quick brown fox jumps over a cat", prompt) == 0.75
    assert copy_rate("nothing of this sentence is in that prompt at all", prompt) == 0.0
    assert copy_rate("too short", prompt) is None
    assert local_model_traps(10, 6, []) and not local_model_traps(10, 4, [])
    assert local_model_traps(3, 0, [0.9, 0.85, 0.1]) and not local_model_traps(3, 0, [0.9, 0.1])


def _generate(tmp: Path, haystack: dict[str, Any], write: Callable[..., Path], fn: str) -> Path:
    path = write(haystack, "topic_news1.json")
    with TestServer(
        responder=f"tests.stages.test_local_model_traps:{fn}", log_path=tmp / "s.log", cwd=ROOT
    ) as srv:
        return generate_tiny(srv.base_url, path.parent, tmp)


@pytest.mark.parametrize(
    ("fn", "warned"), [("echo_documents", "copy their context"), ("summarise", None)]
)
def test_copied_answers_are_measured_and_warned_once(
    tmp_path: Path,
    haystack: dict[str, Any],
    write_haystack: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
    fn: str,
    warned: str | None,
) -> None:
    with caplog.at_level(logging.WARNING):
        out = _generate(tmp_path, haystack, write_haystack, fn)
    gens = [json.loads(x) for x in out.read_text().splitlines()]
    rates = [g["meta"]["copy_rate"] for g in gens]
    hits = [r.message for r in caplog.records if "copy their context" in r.message]
    if warned:
        assert all(r == 1.0 for r in rates) and len(hits) == 1
        assert "base model" in hits[0]
    else:
        assert all(r < 0.5 for r in rates) and not hits


def test_empty_answers_name_the_chat_template(
    tmp_path: Path,
    haystack: dict[str, Any],
    write_haystack: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING), pytest.raises(StageFailed):
        _generate(tmp_path, haystack, write_haystack, "empty")
    hits = [r.message for r in caplog.records if "answers are empty" in r.message]
    assert len(hits) == 1 and "chat_template" in hits[0]
