"""Issue 44, point 15: the figures the Long²RAG manual quotes for the default run are the
committed results' (`metrics/long2rag.json`), so they cannot drift from the code unseen (before:
0.176 / 0.240 / 0.066 in the manual, 0.138 / 0.216 / 0.047 in the results)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.conftest import ROOT

MANUAL = ROOT / "pipeline/benchmarks/long2rag/README.md"
COLUMNS = {"extractive, local": ("extractive", "local"), "lead, local": ("lead", "local"),
           "extractive, overlap": ("extractive", "l2r-overlap"),
           "lead, overlap": ("lead", "l2r-overlap")}  # fmt: skip
SETTINGS = {"long context": "long_context", "rag_512": "rag_512", "rag_1024": "rag_1024",
            "rag_2048": "rag_2048"}  # fmt: skip


def _results() -> dict[str, Any]:
    return json.loads((ROOT / "metrics/long2rag.json").read_text(encoding="utf-8"))


def _section() -> str:
    """From "Default run (" to the end of the paragraph after its table."""
    text = MANUAL.read_text(encoding="utf-8")
    start = text.index("Default run (")
    table_end = text.index("\n\n", text.index("| setting |", start))
    end = text.find("\n\n", table_end + 2)
    return text[start : end if end >= 0 else len(text)]


def test_the_manual_s_default_run_table_is_the_committed_results() -> None:
    rows = {(r["system"], r["setting"], r["judge"]): r for r in _results()["rows"]}
    lines = [x for x in _section().splitlines() if x.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0] == "setting" and set(header[1:]) == set(COLUMNS)
    seen = 0
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        setting = SETTINGS[cells[0]]
        for name, cell in zip(header[1:], cells[1:], strict=True):
            system, judge = COLUMNS[name]
            assert cell == f"{rows[(system, setting, judge)]['kpr']:.3f}", (setting, name)
            seen += 1
    assert seen == len(rows)


def test_the_manual_s_counts_and_agreement_are_the_committed_results() -> None:
    results = _results()
    section = _section()
    scored = {r["n_scored"] for r in results["rows"]}
    excluded = {r["n_excluded"] for r in results["rows"]}
    assert len(scored) == 1 and len(excluded) == 1
    assert f"({scored.pop()} questions each, {excluded.pop()} excluded" in section
    by_model = {a["model"]: a for a in results["agreement"]}
    m = re.search(
        r"kappa (\d\.\d\d) \(lead\) and\s+(\d\.\d\d) \(extractive\) on entailed-or-not,"
        r" (\d\.\d\d) and (\d\.\d\d) on the three verdicts",
        " ".join(section.split()),
    )
    assert m is not None, section
    quoted = [float(x) for x in m.groups()]
    actual = [
        by_model["lead"]["kappa_free_binary"],
        by_model["extractive"]["kappa_free_binary"],
        by_model["lead"]["kappa_free_three_way"],
        by_model["extractive"]["kappa_free_three_way"],
    ]
    assert quoted == pytest.approx([round(x, 2) for x in actual])
