"""A server that answers without `usage` (issue 26 point 4): through the generate stage against
the test server (`--no-usage`): the answers are kept, counted (`usage_missing`), warned about
once for the stage, and the cost is unknown (null in the usage file, `cost_unknown` for MLflow),
never $0."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.stages.common import no_usage, read_usage, usage_path
from pipeline.testing.server import TestServer
from tests.stages.helpers import generate_tiny

ROOT = Path(__file__).resolve().parents[2]


def answer(body: dict[str, Any]) -> str:
    return "- a bullet [1]"


@pytest.mark.parametrize("usage", [False, True], ids=["no-usage", "with-usage"])
def test_answers_without_usage_are_counted_warned_once_and_cost_unknown(
    tmp_path: Path,
    haystack: dict[str, Any],
    write_haystack: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
    usage: bool,
) -> None:
    path = write_haystack(haystack, "topic_news1.json")
    with (
        TestServer(
            responder="tests.stages.test_usage_missing:answer",
            log_path=tmp_path / "s.log",
            cwd=ROOT,
            usage=usage,
        ) as srv,
        caplog.at_level(logging.WARNING),
    ):
        out = generate_tiny(
            srv.base_url, path.parent, tmp_path, price_input_per_1m=1.0, price_output_per_1m=2.0
        )
    gens = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(gens) == 2 and all(g["status"] == "ok" for g in gens)
    report = json.loads(usage_path(out).read_text())
    warnings = [r for r in caplog.records if "without token usage" in r.getMessage()]
    metrics = read_usage(usage_path(out))
    if usage:
        assert report["usage_missing"] == 0 and report["cost_usd"] > 0
        assert not warnings and "cost_unknown" not in metrics
        return
    assert report["usage_missing"] == 2 and report["requests_sent"] == 2
    assert report["cost_usd"] is None  # unknown, not $0
    assert len(warnings) == 1 and "2 answers" in warnings[0].getMessage()
    assert metrics["cost_unknown"] == 1.0 and metrics["usage_missing"] == 2.0
    assert "cost_usd" not in metrics


def test_a_stage_without_model_calls_still_costs_zero() -> None:
    """Published and baseline stages call no model: their cost is a known $0 (the committed
    metrics do not change)."""
    report = no_usage("x")
    assert report.cost_usd == 0 and report.usage_missing == 0
    assert report.merged(report).cost_usd == 0
    unknown = report.model_copy(update={"cost_usd": None, "usage_missing": 1})
    assert report.merged(unknown).cost_usd is None and unknown.merged(report).usage_missing == 1


def test_the_per_model_summary_says_unknown_not_zero() -> None:
    """The per-model summary (aggregate log, lfbench report) sums the stages' usage files: a
    stage whose cost is unknown makes the model's cost unknown."""
    from pipeline.stages.aggregate import model_summary, summary_lines

    bench = registry.get("summhay")
    main = bench.metrics[0].name
    rows = [{"model": "tiny", main: 0.5, "system": "s", "setting": "o", "judge": "j"}]
    known = {("generate", "tiny", ""): {"requests_sent": 2.0, "cost_usd": 0.25, "wall_s": 1.0}}
    unknown = {
        ("generate", "tiny", ""): {"requests_sent": 2.0, "usage_missing": 2.0, "wall_s": 1.0}
        | {"cost_unknown": 1.0}
    }
    assert model_summary(bench, rows, known, [])[0]["cost_usd"] == 0.25
    summary = model_summary(bench, rows, unknown, [])
    assert summary[0]["cost_usd"] is None
    assert "| unknown |" in "\n".join(summary_lines(summary))
