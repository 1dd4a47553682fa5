"""`lfbench report`: every benchmark's section from its metrics file, agreement, lineage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.summhay.aggregate import ROW_KEYS
from pipeline.core.errors import DataError
from pipeline.tools.report import build_report, md_to_html


def row(system: str, setting: str, joint: float, **kw: Any) -> dict[str, Any]:
    return {
        **dict.fromkeys(ROW_KEYS, 0),
        "words_per_bullet": 20.0,
        "coverage_macro": None,
        "citation_macro": None,
        "joint_macro": None,
        "benchmark": "summhay",
        "domain": "news",
        "system": system,
        "setting": setting,
        "judge": "j",
        "mode": "paper",
        "model": "published",
        "coverage": 60.0,
        "citation": 40.0,
        "joint": joint,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_usd": 0.25,
        **kw,
    }


# GPT-4o and Gemini-1.5-pro in the paper's Table 3 (Top, Bottom, Random), plus a system
# without the orderings.
ROWS = [
    row("gpt-4o", "full-sort", 13.8),
    row("gpt-4o", "full-rev-sort", 24.1),
    row("gpt-4o", "full", 11.4),
    row("gpt-4o", "oracle", 50.0),
    row("gemini-1.5-pro", "full-sort", 47.1),
    row("gemini-1.5-pro", "full-rev-sort", 38.9),
    row("gemini-1.5-pro", "full-middle", 40.0),
    row("gemini-1.5-pro", "full", 37.9),
    row("other", "full", 10.0),
    row("other", "full-sort", 12.0),  # no Bottom: no sensitivity
]


L2R = [
    {
        "benchmark": "long2rag",
        "system": "m1",
        "setting": "default",
        "judge": "j",
        "kpr": 0.5,
        "kpr_by_domain": {"AI": 0.6, "Law": 0.4},
        "kpr_by_category": {"Comparative": {"kpr": 0.7}, "Factual": {"kpr": 0.3}},
    },
    {
        "benchmark": "long2rag",
        "system": "m2",
        "setting": "default",
        "judge": "j",
        "kpr": 0.4,
        "breakdowns": {"domain": {"AI": 0.5}, "category": {"Factual": 0.2}},
    },
]


def _write(root: Path, name: str, rows: list[dict[str, Any]]) -> None:
    (root / "metrics").mkdir(exist_ok=True)
    (root / "metrics" / name).write_text(json.dumps({"rows": rows}))


def test_report_reads_whatever_metrics_exist(tmp_path: Path) -> None:
    _write(tmp_path, "summhay.json", ROWS)
    html_path, md_path = build_report(tmp_path, Path("out"))
    md = md_path.read_text()
    assert "## SummHay" in md and "## Judge agreement" not in md and "Long²RAG" not in md
    assert "| gpt-4o | 13.8 | 24.1 | - | 11.4 | 12.7 |" in md  # Table 3 layout
    assert "| published | j | 100 | 50 | 2.5000 |" in md  # cost: 10 rows x 0.25 USD
    assert "## Lineage" in md and "git commit" in md
    page = html_path.read_text()
    assert page.count("data:image/png;base64,") == 2  # position + joint-by-setting, inlined
    assert "<td>gpt-4o</td>" in page and 'src="report-fig' not in page

    _write(
        tmp_path,
        "agreement.json",
        [
            {
                "judge": "local",
                "reference": "human",
                "n": 100,
                "pearson": 0.71,
                "pearson_ci_low": 0.6,
                "pearson_ci_high": 0.8,
                "cohen_kappa": 0.5,
            }
        ],
    )
    _write(tmp_path, "long2rag.json", L2R)
    _, md_path = build_report(tmp_path, Path("out"))
    md = md_path.read_text()
    assert "| local | human | 100 | 0.710 [0.600, 0.800] |" in md
    assert "| m1 | default | j | 0.500 |" in md
    assert "Long²RAG KPR by domain and category" in md


def test_report_errors_name_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no results of any benchmark"):
        build_report(tmp_path, Path("out"))
    _write(tmp_path, "summhay.json", [{"system": "x"}])
    with pytest.raises(DataError, match="row 1, field benchmark"):
        build_report(tmp_path, Path("out"))
    (tmp_path / "metrics" / "summhay.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        build_report(tmp_path, Path("out"))


def test_md_to_html_tables_and_escaping() -> None:
    out = md_to_html("# T\n\n| a | b |\n|---|---|\n| <x> | `c` |\n\ntext **b**")
    assert "<h1>T</h1>" in out and "<th>a</th>" in out
    assert "<td>&lt;x&gt;</td><td><code>c</code></td>" in out and "<b>b</b>" in out
