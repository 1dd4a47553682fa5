"""Paired bootstrap over items for the difference of two systems' pooled scores (pure).

A pooled score is a ratio over items, sum(numerator) / sum(denominator) (SummHay pools insight
scores over subtopics: Coverage = sum of coverages / number of valid insights, ...). Resampling
the shared items with replacement, the same resample for both systems, gives the distribution of
delta = score_B - score_A; its 2.5 / 97.5 percentiles are the 95% interval and the two-sided
p-value is 2 x the smaller share of resampled deltas on either side of zero (capped at 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class PairedResult:
    a: float
    b: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    n_items: int
    resamples: int


def resample_indices(n_items: int, resamples: int, seed: int) -> npt.NDArray[np.int64]:
    """(resamples, n_items) item indices drawn with replacement by numpy's PCG64 from `seed`."""
    if n_items < 1 or resamples < 1:
        raise ValueError("paired bootstrap needs at least one item and one resample")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_items, size=(resamples, n_items), dtype=np.int64)


def _ratio(num: npt.NDArray[np.float64], den: npt.NDArray[np.float64]) -> float:
    d = float(den.sum())
    return float(num.sum()) / d if d else float("nan")


def paired_bootstrap(
    num_a: Sequence[float],
    den_a: Sequence[float],
    num_b: Sequence[float],
    den_b: Sequence[float],
    resamples: int = 10_000,
    seed: int = 0,
    indices: npt.NDArray[np.int64] | None = None,
) -> PairedResult:
    """Paired bootstrap of sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a); position i of every
    sequence is the same item. `indices` replaces the random resamples (tests enumerate them).
    A resample whose denominator is 0 for either system is dropped (it has no score)."""
    na, da, nb, db = (np.asarray(v, dtype=np.float64) for v in (num_a, den_a, num_b, den_b))
    n = len(na)
    if not (len(da) == len(nb) == len(db) == n):
        raise ValueError("paired bootstrap: all four sequences must have one value per item")
    if indices is None:
        indices = resample_indices(n, resamples, seed)
    sa, sb = da[indices].sum(axis=1), db[indices].sum(axis=1)
    ok = (sa > 0) & (sb > 0)
    if not ok.any():
        raise ValueError("paired bootstrap: no resample has a score for both systems")
    deltas = nb[indices].sum(axis=1)[ok] / sb[ok] - na[indices].sum(axis=1)[ok] / sa[ok]
    a, b = _ratio(na, da), _ratio(nb, db)
    low, high = np.percentile(deltas, [2.5, 97.5])
    p = min(1.0, 2.0 * min(float(np.mean(deltas <= 0)), float(np.mean(deltas >= 0))))
    return PairedResult(
        a=a,
        b=b,
        delta=b - a,
        ci_low=float(low),
        ci_high=float(high),
        p_value=p,
        n_items=n,
        resamples=int(ok.sum()),
    )
