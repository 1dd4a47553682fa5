"""Agreement statistics between raters (judges, annotators): pure functions.

Two-rater statistics take two equally long sequences of labels (or scores), one entry per item.
Multi-rater statistics take `ratings`: one sequence per item holding each rater's label.

- `cohen_kappa`: Cohen's kappa, unweighted or with linear / quadratic weights. Weighted kappa
  needs ordered categories: pass `categories` in their order (labels are placed by it).
- `fleiss_kappa`: Fleiss' kappa (chance agreement from the observed category marginals).
- `randolph_kappa`: Randolph's free-marginal multi-rater kappa (chance agreement 1/k, where k
  is the number of categories the raters could choose from, observed or not).
- `pearson`, `spearman`, `exact_agreement`.
- `bootstrap_ci`: percentile bootstrap CI of any of these, resampling items (pairs stay paired).

A statistic that is undefined on its input (a constant rater for a correlation, a single
category for kappa) is NaN, never a made-up 0 or 1; callers report it as missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Weights = Literal["linear", "quadratic"] | None


def _pair(a: Sequence[object], b: Sequence[object]) -> None:
    if len(a) != len(b):
        raise ValueError(f"the two raters have {len(a)} and {len(b)} labels; they must pair up")
    if len(a) == 0:
        raise ValueError("no items to compare")


def _categories(values: np.ndarray, categories: Sequence[Hashable] | None) -> list[Hashable]:
    if categories is None:
        return list(np.unique(values).tolist())
    cats = list(categories)
    if len(set(cats)) != len(cats):
        raise ValueError(f"categories repeat: {cats}")
    return cats


def _codes(values: np.ndarray, cats: Sequence[Hashable]) -> np.ndarray:
    """Each value's index in cats; ValueError naming any value that is not a category."""
    k = len(cats)
    if (
        values.dtype.kind in "iu"
        and values.size
        and list(cats) == list(range(k))
        and values.min() >= 0
        and values.max() < k
    ):
        # labels already coded 0..k-1 (a bootstrap's resamples): their own codes, the same
        # numbers the search below finds, without sorting on every resample
        return np.asarray(values, dtype=np.int64)
    cats_arr = np.asarray(cats)
    order = np.argsort(cats_arr, kind="stable")
    ordered = cats_arr[order]
    pos = np.clip(np.searchsorted(ordered, values), 0, len(cats) - 1)
    bad = ordered[pos] != values
    if bad.any():
        unknown = sorted({repr(v) for v in np.asarray(values)[bad].tolist()})
        raise ValueError(f"labels not among the categories {list(cats)}: {', '.join(unknown)}")
    return np.asarray(order[pos], dtype=np.int64)


def confusion(
    a: Sequence[Hashable], b: Sequence[Hashable], categories: Sequence[Hashable] | None = None
) -> tuple[np.ndarray, list[Hashable]]:
    """Counts[i, j] = items rater a put in category i and rater b in category j."""
    _pair(a, b)
    x, y = np.asarray(a), np.asarray(b)
    cats = _categories(np.concatenate([x, y]), categories)
    k = len(cats)
    codes = _codes(x, cats) * k + _codes(y, cats)
    m = np.bincount(codes, minlength=k * k).reshape(k, k).astype(float)
    return m, cats


def cohen_kappa(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    weights: Weights = None,
    categories: Sequence[Hashable] | None = None,
) -> float:
    """Cohen's kappa: (p_o - p_e) / (1 - p_e), with disagreement weights if asked.

    Weighted kappa is 1 - sum(w * observed) / sum(w * expected), with w_ij = |i - j| (linear)
    or (i - j)^2 (quadratic) over the categories' order.
    """
    m, cats = confusion(a, b, categories)
    k = len(cats)
    n = m.sum()
    expected = np.outer(m.sum(axis=1), m.sum(axis=0)) / n
    i, j = np.indices((k, k))
    if weights is None:
        w = (i != j).astype(float)
    elif weights == "linear":
        w = np.abs(i - j).astype(float)
    elif weights == "quadratic":
        w = ((i - j) ** 2).astype(float)
    else:
        raise ValueError(f"weights must be None, 'linear' or 'quadratic', got {weights!r}")
    denominator = float((w * expected).sum())
    if denominator == 0:
        return math.nan  # both raters used one and the same category: kappa is undefined
    return 1.0 - float((w * m).sum()) / denominator


def _count_table(
    ratings: Sequence[Sequence[Hashable]], categories: Sequence[Hashable] | None
) -> tuple[np.ndarray, list[Hashable]]:
    if len(ratings) == 0:
        raise ValueError("no items to compare")
    n_raters = {len(r) for r in ratings}
    if len(n_raters) != 1:
        raise ValueError(f"every item needs the same number of ratings, got {sorted(n_raters)}")
    if n_raters.pop() < 2:
        raise ValueError("multi-rater kappa needs at least two ratings per item")
    grid = np.asarray([list(r) for r in ratings])
    cats = _categories(grid.ravel(), categories)
    codes = _codes(grid.ravel(), cats).reshape(grid.shape)
    table = np.zeros((grid.shape[0], len(cats)), dtype=float)
    np.add.at(table, (np.repeat(np.arange(grid.shape[0]), grid.shape[1]), codes.ravel()), 1)
    return table, cats


def _observed_agreement(table: np.ndarray) -> float:
    n = table.sum(axis=1)[0]
    per_item = ((table * table).sum(axis=1) - n) / (n * (n - 1))
    return float(per_item.mean())


def fleiss_kappa(
    ratings: Sequence[Sequence[Hashable]], categories: Sequence[Hashable] | None = None
) -> float:
    """Fleiss' kappa: chance agreement from the pooled category proportions."""
    table, _ = _count_table(ratings, categories)
    p_o = _observed_agreement(table)
    p = table.sum(axis=0) / table.sum()
    p_e = float((p * p).sum())
    if p_e == 1.0:
        return math.nan
    return (p_o - p_e) / (1.0 - p_e)


def randolph_kappa(
    ratings: Sequence[Sequence[Hashable]], categories: Sequence[Hashable] | None = None
) -> float:
    """Randolph's free-marginal kappa: chance agreement 1/k over the k possible categories.

    Pass `categories` (all labels a rater could choose): a category nobody chose still counts
    in k. Without it, k is the number of labels observed.
    """
    table, cats = _count_table(ratings, categories)
    k = len(cats)
    if k < 2:
        raise ValueError("free-marginal kappa needs at least two possible categories")
    p_o = _observed_agreement(table)
    return (p_o - 1.0 / k) / (1.0 - 1.0 / k)


def _floats(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    _pair(a, b)
    return np.asarray(a, dtype=float), np.asarray(b, dtype=float)


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    x, y = _floats(a, b)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan  # undefined for fewer than 2 items or a constant rater
    return _pearson_r(x, y)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    x, y = _floats(a, b)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    if np.isnan(x).any() or np.isnan(y).any():
        from scipy import stats  # here: scipy.stats takes a second to import

        return float(stats.spearmanr(x, y).statistic)
    ranked = np.column_stack((_average_ranks(x), _average_ranks(y)))
    return float(np.corrcoef(ranked, rowvar=False)[1, 0])


# scipy.stats' pearsonr and spearmanr cost about 0.3 ms a call in checks and array-API dispatch,
# and a bootstrap interval calls them 1,000 times: these do the same arithmetic, operation for
# operation (scipy 1.17, NumPy arrays, one dimension), so they return the same bits
# (tests/metrics/test_agreement.py compares them on random data, ties included).


def _pearson_r(x: np.ndarray, y: np.ndarray) -> float:
    """scipy.stats.pearsonr(x, y).statistic for non-constant 1-D float64 arrays."""
    xmean = np.mean(x, axis=-1, keepdims=True)
    ymean = np.mean(y, axis=-1, keepdims=True)
    xm = x - xmean
    ym = y - ymean
    xmax = np.max(np.abs(xm), axis=-1, keepdims=True)
    ymax = np.max(np.abs(ym), axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        normxm = xmax * np.linalg.norm(xm / xmax, ord=2, axis=-1, keepdims=True)
        normym = ymax * np.linalg.norm(ym / ymax, ord=2, axis=-1, keepdims=True)
        r = np.vecdot(xm / normxm, ym / normym)  # over the last (only) axis
    r = np.clip(r, -1.0, 1.0)
    if len(x) == 2:
        r = np.round(r)  # exactly 1 or -1 for two items, as scipy promises
    return float(r)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """scipy.stats.rankdata(x) (method "average"): 1-based ranks, ties sharing their mean rank
    (a whole or half number, exact in floating point)."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]  # the first of each run of equal values
    group = np.cumsum(first) - 1
    bounds = np.r_[np.flatnonzero(first), len(x)]  # where each run starts, then the end
    mean_rank = (bounds[:-1] + 1 + bounds[1:]) / 2.0
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = mean_rank[group]
    return ranks


def exact_agreement(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Fraction of items where both raters gave the same label (0-1)."""
    _pair(a, b)
    return float(np.mean(np.asarray(a) == np.asarray(b)))


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n_resamples: int


def bootstrap_ci(
    statistic: Callable[..., float],
    *columns: Any,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval for statistic(*columns), resampling items with replacement.

    All columns are indexed by item and resampled together (paired); the statistic receives
    numpy arrays. Resamples on which the
    statistic is undefined (NaN) are dropped; if more than half are, the bounds are NaN.
    """
    if not columns:
        raise ValueError("bootstrap_ci needs at least one column")
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError("bootstrap columns must have the same length")
    if n == 0:
        raise ValueError("no items to resample")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    arrays = [np.asarray(c) for c in columns]
    estimate = statistic(*arrays)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_resamples):
        idx = rng.integers(0, n, size=n)
        values.append(statistic(*(c[idx] for c in arrays)))
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if len(arr) < n_resamples / 2:
        return Interval(estimate, math.nan, math.nan, n_resamples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(arr, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high), n_resamples)


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def kappa_interval(
    judge: Sequence[Hashable],
    reference: Sequence[Hashable],
    categories: Sequence[Hashable],
    *,
    n_resamples: int,
    seed: int,
) -> tuple[float | None, float | None, float | None]:
    """Cohen's kappa (unweighted) and its 95% percentile-bootstrap interval, resampling the
    label pairs with a seeded generator. None where undefined (a single category)."""
    code = {c: i for i, c in enumerate(categories)}
    a = np.asarray([code[x] for x in judge])
    b = np.asarray([code[x] for x in reference])
    cats = list(range(len(categories)))

    def stat(x: np.ndarray, y: np.ndarray) -> float:
        return cohen_kappa(x, y, categories=cats)  # type: ignore[arg-type]

    if n_resamples == 0:
        return _num(stat(a, b)), None, None
    ci = bootstrap_ci(stat, a, b, n_resamples=n_resamples, seed=seed)
    return _num(ci.estimate), _num(ci.low), _num(ci.high)
