"""The released SummHay news data, scored in paper mode, against the paper's tables.

The paper's Table 2 pools both domains and the release only carries the news summaries and
judgements, so the check is: the counts add up to the paper's, the 69 Table 2 cells are ranked
as the paper ranks them, and the paper's qualitative findings hold. The full news table is a
golden file (tests/benchmarks/summhay/test_published/test_news_table_golden.yml), written by this
code from the mirror data (pytest --force-regen): it pins the scorer's output, so any change to
scoring shows up as a reviewed diff. Its paper-mode cells equal an independent re-computation
with a 40-line script following the authors' released scorer (same numbers to 0.1).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.benchmarks.summhay import paper_tables as paper
from pipeline.benchmarks.summhay import published
from pipeline.benchmarks.summhay.benchmark import SummHay
from pipeline.benchmarks.summhay.report import position_sensitivity
from pipeline.core import aggregation
from pipeline.core.benchmark import Run
from pipeline.core.config import PublishedModel
from pipeline.data.haystacks import Haystack, load_raw_haystack, normalise
from pipeline.metrics.stats import spearman
from pipeline.stages.common import FileInputs

NEWS = [f"news{i}" for i in range(1, 6)]
CONV = [f"conv{i}" for i in range(1, 6)]


def _load(mirror: Path, ids: list[str]) -> list[Haystack]:
    out = []
    for hid in ids:
        name = f"topic_{hid}.json" if hid.startswith("news") else f"topic_{hid}.cleaned.json"
        out.append(normalise(hid, load_raw_haystack(mirror / "summhay" / name), name))
    return out


@pytest.fixture(scope="module")
def news(mirror: Path) -> list[Haystack]:
    return _load(mirror, NEWS)


@pytest.fixture(scope="module")
def rows(mirror: Path, news: list[Haystack]) -> list[dict[str, Any]]:
    files, data_dir = FileInputs(Path("/")), str(mirror / "summhay")
    spec = PublishedModel(provider="published")
    gens = list(published.generations("published", spec, files, data_dir, news))
    js = list(published.judgements("published-gpt-4o", files, data_dir, gens))
    scoring = SimpleNamespace(modes=["paper", "corrected"], partial_credit=50)
    params = SimpleNamespace(seed=0, models={})
    ctx: Any = SimpleNamespace(section=SimpleNamespace(scoring=scoring), params=params)
    out, _ = aggregation.score(
        SummHay(), ctx, news, [Run("published", "published-gpt-4o", gens, js)]
    )
    return [r.flat() for r in out]


def _cell(
    rows: list[dict[str, Any]], system: str, setting: str, mode: str = "paper"
) -> dict[str, Any]:
    [row] = [r for r in rows if (r["system"], r["setting"], r["mode"]) == (system, setting, mode)]
    return row


def test_counts_match_the_paper(mirror: Path, news: list[Haystack]) -> None:
    conv = _load(mirror, CONV)
    n_sub = sum(len(h.subtopics) for h in news + conv)
    n_ins = sum(len(s.insights) for h in news + conv for s in h.subtopics)
    # 42 news + 50 conversation subtopics = the paper's 92 tasks; 336 + 285 = 621 insights.
    assert (sum(len(h.subtopics) for h in news), n_sub) == (42, paper.N_SUBTOPICS_BOTH_DOMAINS)
    assert n_ins == paper.N_INSIGHTS_BOTH_DOMAINS
    assert all(len(h.documents) == 100 for h in news + conv)


def test_78_published_systems(rows: list[dict[str, Any]]) -> None:
    paper_rows = [r for r in rows if r["mode"] == "paper"]
    assert len(paper_rows) == 78
    assert {r["system"] for r in paper_rows} == set(paper.SUMMARIZERS)
    # 10 summarizers x 6 retrievers + 9 full-context + 3 models x 3 position orders = 78
    assert sum(r["setting"] == "full" for r in paper_rows) == 9
    assert all(r["n_scored"] == 42 and r["n_insights"] == 336 for r in paper_rows)
    assert all(r["n_invalid_insights"] == r["n_bad_links"] == 0 for r in rows)


def test_quoted_cells(rows: list[dict[str, Any]]) -> None:
    # News, paper mode: the numbers quoted in the closing note.
    expected = {
        ("claude3-opus", "oracle"): 52.2,
        ("claude3-opus", "full"): 25.2,
        ("gpt-4o", "oracle"): 49.8,
        ("gpt-4o", "full"): 16.3,
        ("gemini-1.5-pro", "oracle"): 51.1,
        ("gemini-1.5-pro", "full"): 50.1,
    }
    got = {key: round(_cell(rows, *key)["joint"], 1) for key in expected}
    assert got == expected


@pytest.mark.parametrize("metric", ["coverage", "citation", "joint"])
def test_ranking_agrees_with_table2(rows: list[dict[str, Any]], metric: str) -> None:
    pairs = [(v, _cell(rows, *key)[metric]) for key, v in paper.TABLE2[metric].items()]
    assert len(pairs) == 69
    rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
    # Measured: coverage 0.951, citation 0.982, joint 0.974 (news-only vs both domains).
    assert rho >= {"coverage": 0.93, "citation": 0.96, "joint": 0.96}[metric]


def test_papers_findings_hold_on_news(rows: list[dict[str, Any]]) -> None:
    for system in paper.SUMMARIZERS:
        # Oracle retrieval beats random retrieval for every summarizer (Table 2).
        assert _cell(rows, system, "oracle")["joint"] > _cell(rows, system, "random")["joint"]
    # Gemini-1.5-pro is the only model whose full-context Joint is competitive (paper §5.2).
    full = {
        r["system"]: r["joint"] for r in rows if r["setting"] == "full" and r["mode"] == "paper"
    }
    assert max(full, key=lambda s: full[s]) == "gemini-1.5-pro"
    # Table 3: relevant documents at the bottom help GPT-4o and Claude 3 Opus most; at the top,
    # Gemini-1.5-pro; every order beats the default (Random) order.
    for system, best, other in [
        ("gpt-4o", "full-rev-sort", "full-sort"),
        ("claude3-opus", "full-rev-sort", "full-sort"),
        ("gemini-1.5-pro", "full-sort", "full-rev-sort"),
    ]:
        j = {s: _cell(rows, system, s)["joint"] for s in ("full", "full-sort", "full-rev-sort")}
        assert j[best] > j[other] > j["full"]
        sens = position_sensitivity(j)
        assert sens is not None and sens > 5


def test_corrected_mode_equals_paper_mode_on_clean_judgements(rows: list[dict[str, Any]]) -> None:
    # The release has no unparseable or out-of-range bullet id, so the pooled numbers agree;
    # corrected rows add the per-summary (macro) averages.
    for r in (r for r in rows if r["mode"] == "paper"):
        c = _cell(rows, r["system"], r["setting"], "corrected")
        assert c["joint"] == pytest.approx(r["joint"])
        assert c["coverage"] == pytest.approx(r["coverage"])
        assert c["joint_macro"] is not None and r["joint_macro"] is None


def test_news_table_golden(rows: list[dict[str, Any]], data_regression: Any) -> None:
    table = {
        f"{r['system']}/{r['setting']}/{r['mode']}": {
            k: round(r[k], 4) if isinstance(r[k], float) else r[k]
            for k in (
                "coverage",
                "citation",
                "joint",
                "citation_precision",
                "citation_recall",
                "words_per_bullet",
                "n_covered",
                "coverage_macro",
                "joint_macro",
            )
        }
        for r in rows
    }
    data_regression.check(table)
