"""CRUX's report figure."""

from __future__ import annotations

from pipeline.benchmarks.crux.report import figures


def _tau(tau: float, lo: float, hi: float, level: str) -> dict[str, object]:
    return {
        "metric": "coverage",
        "target": "cov_y",
        "level": level,
        "domain": "news",
        "context_judge": "crux-labels",
        "answer_judge": "published-gpt-4o",
        "tau": tau,
        "ci_low": lo,
        "ci_high": hi,
    }


def test_a_tau_outside_its_interval_is_drawn_not_refused() -> None:
    # A per-summarizer tau is a mean of taus: its bootstrap interval can miss it. matplotlib's
    # errorbar refused the negative error ('xerr' must not contain negative values) and the
    # whole aggregate stage failed on it.
    rows = [
        {"judge": "crux-labels", "domain": "news", "cutoff": c, "retriever": r, "coverage": v}
        for c, v in (("5", 0.4), ("10", 0.6))
        for r in ("bm25", "oracle")
    ]
    taus = [_tau(0.5, 0.55, 0.9, "per_summarizer"), _tau(0.4, 0.1, 0.7, "retrievers")]
    out = figures(rows, taus)
    assert out and all(png.startswith(b"\x89PNG") for png in out.values())
