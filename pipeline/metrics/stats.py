"""Small statistics helpers (pure)."""

from __future__ import annotations

from collections.abc import Sequence


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("spearman needs two sequences of the same length >= 2")
    from scipy import stats  # imported when used: a second of every stage's start otherwise

    result = stats.spearmanr(x, y)
    return float(result.statistic)
