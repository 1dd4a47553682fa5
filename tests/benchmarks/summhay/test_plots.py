"""SummHay's plots: deterministic PNG bytes and the position-sensitivity table (Table 3)."""

from __future__ import annotations

import pytest

from pipeline.benchmarks.summhay import plots
from tests.test_report import ROWS, row

PNG = b"\x89PNG\r\n\x1a\n"


def test_position_table_matches_the_paper_definition() -> None:
    t = {r["system"]: r for r in plots.position_table(ROWS)}
    assert set(t) == {"gpt-4o", "gemini-1.5-pro"}
    assert t["gpt-4o"]["sensitivity"] == pytest.approx(12.7)  # max(2.4, 12.7)
    assert t["gemini-1.5-pro"]["sensitivity"] == pytest.approx(9.2)  # max(9.2, 1.0)
    assert t["gemini-1.5-pro"]["Middle"] == 40.0 and t["gpt-4o"]["Middle"] is None


def test_plots_are_deterministic_pngs() -> None:
    a = plots.position_sensitivity(ROWS, "t")
    assert a is not None and a.startswith(PNG)
    assert a == plots.position_sensitivity(ROWS, "t")
    assert b"Software" not in a and b"matplotlib" not in a.lower()
    j = plots.joint_by_setting([r for r in ROWS if r["system"] == "gpt-4o"], "gpt-4o")
    assert j.startswith(PNG) and j == plots.joint_by_setting(
        list(reversed([r for r in ROWS if r["system"] == "gpt-4o"])), "gpt-4o"
    )
    assert plots.position_sensitivity([row("x", "oracle", 1.0)], "t") is None
