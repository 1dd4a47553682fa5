"""An audit of a judge by people, on one run's own outputs: pure functions, no I/O.

A person labels a sample of n of the N verdicts a judge gave on one run (see
`pipeline/results/audit.py`). From those labels:

- `systematic_sample`: which n of the N verdicts to show. The verdicts are ordered by stratum
  (the judge's label), then by a seeded shuffle of the items, then of the verdicts inside an
  item, and every (N / n)-th is taken from a seeded random start. Every verdict has the same
  chance n / N of being drawn (so a plain mean over the sample is unbiased), while each of the
  judge's labels gets its share of the sample and the sample spreads over the items.
- `ppi_mean`: the power-tuned prediction-powered estimate of the run's metric (PPI++:
  Angelopoulos, Duchi and Zrnic, "PPI++: efficient prediction-powered inference", 2023, after
  Angelopoulos et al., Science 382, 2023), for a finite population. The target is the mean of
  the person's values over the run's N units, the n labelled ones among them; the judge's value
  is known on all N. With a weight lambda in [0, 1],

      theta = lambda * mean_N(f) + mean_n(h - lambda * f),

  and, the n labelled units being a simple random sample of the N, its variance is
  (1 - n / N) * s2(h - lambda * f) / n (s2: the sample variance, ddof 1; 1 - n / N is the
  finite-population correction, so the interval is 0 wide when every unit is labelled: the
  target is then known). lambda = 1 is the original PPI, lambda = 0 the labels alone (the
  judge ignored); lambda is chosen from the data as the one that minimises s2(h - lambda * f),
  cov(h, f) / var(f) on the labelled units, clipped to [0, 1]. As s2(h - lambda * f) is a
  convex function of lambda equal to s2(h) at 0, the clipped minimiser never gives a wider
  interval than the labels alone (`classical_mean`, the same correction): a judge that does not
  agree with people gets lambda near 0 and is about ignored. (This is survey sampling's
  regression estimator with its slope in [0, 1]. `ppi_py`'s `ppi_mean_ci` treats the judged
  units as an infinite population apart from the labelled ones: its variance adds
  lambda^2 * var(f) / N and has no correction, and its lambda divides by 1 + n / N; it uses
  ddof 0. The two agree when N is large: tests/metrics/test_audit.py.)
  Labels from outside the run (`labelled_in_population=False`: people's labels on other
  outputs of the same system) estimate the mean over the N units as a new sample of the same
  kind: the factor is 1 + n / N instead of 1 - n / N.
  A metric that weights its units (a macro average over items: each unit of an item with k
  units weighs 1/k) passes `weights`; each unit's value is then scaled by N * w / sum(w), which
  gives back the weighted mean and reduces to the formula above when all weights are equal
  (labels from outside the run: their own n * w / sum(w)).
  The interval is estimate +- t * se with Student's t quantile of n - 1 degrees of freedom
  (for both estimators: the normal quantile under-covered at n = 30, 92% in
  `perf/audit_coverage.py`), clipped, with the estimate, to the metric's range (`bounds`).
- `classical_mean`: the interval from the n human labels alone (what an audit without the judge
  would say), with the same finite-population correction, for comparison.
- `audit_kappa`: Cohen's kappa of the judge against the person on the n labelled units, with a
  seeded percentile-bootstrap interval (`pipeline.metrics.agreement.kappa_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A mean with its interval (`confidence`), from n labelled units (and N judged ones);
    `lam`: the judge's weight (None: the labels alone)."""

    estimate: float
    low: float
    high: float
    n: int
    n_all: int
    confidence: float = 0.95
    lam: float | None = None

    @property
    def width(self) -> float:
        return self.high - self.low


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _t(confidence: float, n: int) -> float:
    """Student's t quantile with n - 1 degrees of freedom."""
    _z(confidence)  # checks it
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, n - 1))


def _var(x: np.ndarray) -> float:
    return float(np.var(x, ddof=1)) if len(x) > 1 else 0.0


def _factor(n: int, big_n: int, labelled_in_population: bool) -> float:
    """The finite-population factor of var/n: 1 - n/N for labels on n of the N units, 1 + n/N
    for labels on other units of the same kind."""
    if labelled_in_population:
        if n > big_n:
            raise ValueError(f"{n} labelled units among {big_n}: more than there are")
        return 1.0 - n / big_n
    return 1.0 + n / big_n


def _interval(
    estimate: float,
    se: float,
    confidence: float,
    bounds: tuple[float, float] | None,
    n: int,
    big_n: int,
    lam: float | None,
) -> Estimate:
    q = _t(confidence, n)
    low, high = estimate - q * se, estimate + q * se
    if bounds is not None:
        lo, hi = bounds
        estimate, low, high = (min(max(x, lo), hi) for x in (estimate, low, high))
    return Estimate(estimate, low, high, n, big_n, confidence, lam)


def power_tuning(judge_labelled: np.ndarray, human_labelled: np.ndarray) -> float:
    """The lambda in [0, 1] that minimises the sample variance of h - lambda * f on the
    labelled units: cov(h, f) / var(f), clipped (0 when the judge is constant on them)."""
    var_f = _var(judge_labelled)
    if var_f <= 0.0 or len(judge_labelled) < 2:
        return 0.0
    cov = float(np.cov(human_labelled, judge_labelled, ddof=1)[0, 1])
    return min(max(cov / var_f, 0.0), 1.0)


def ppi_mean(
    judge_all: Sequence[float],
    judge_labelled: Sequence[float],
    human_labelled: Sequence[float],
    *,
    weights_all: Sequence[float] | None = None,
    weights_labelled: Sequence[float] | None = None,
    confidence: float = 0.95,
    lam: float | None = None,
    labelled_in_population: bool = True,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """The power-tuned prediction-powered mean (module docstring). `judge_all`: the judge's
    value on each of the N units; `judge_labelled`, `human_labelled`: the judge's and the
    person's values on the n labelled ones, paired; optional `weights_*`: each unit's weight in
    the metric; `lam`: a fixed weight of the judge (default: chosen from the data); `bounds`:
    the metric's range, which the interval is clipped to."""
    f = np.asarray(judge_all, dtype=float)
    fl = np.asarray(judge_labelled, dtype=float)
    hl = np.asarray(human_labelled, dtype=float)
    if len(fl) != len(hl):
        raise ValueError(f"{len(fl)} judge values against {len(hl)} human labels")
    if len(hl) < 2:
        raise ValueError(f"{len(hl)} labelled unit(s): an interval needs at least 2")
    if len(f) < 2:
        raise ValueError(f"{len(f)} judged unit(s): an interval needs at least 2")
    if lam is not None and not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    big_n, n = len(f), len(hl)
    factor = _factor(n, big_n, labelled_in_population)
    if (weights_all is None) != (weights_labelled is None):
        raise ValueError("give weights for all units and for the labelled ones, or neither")
    if weights_all is not None and weights_labelled is not None:
        w = np.asarray(weights_all, dtype=float)
        wl = np.asarray(weights_labelled, dtype=float)
        if len(w) != big_n or len(wl) != n or (w <= 0).any() or (wl <= 0).any():
            raise ValueError("weights must be positive, one per unit")
        # labels on n of the N units: each drawn with the same chance, so sum(wl) / n estimates
        # sum(w) / N; labels from outside the run are weighted among themselves
        scale = big_n / float(w.sum())
        scale_l = scale if labelled_in_population else n / float(wl.sum())
        f, fl, hl = f * w * scale, fl * wl * scale_l, hl * wl * scale_l
    lam = power_tuning(fl, hl) if lam is None else lam
    rectifier = hl - lam * fl
    estimate = float(lam * f.mean() + rectifier.mean())
    se = math.sqrt(factor * _var(rectifier) / n)
    return _interval(estimate, se, confidence, bounds, n, big_n, lam)


def classical_mean(
    human: Sequence[float],
    *,
    n_all: int | None = None,
    confidence: float = 0.95,
    labelled_in_population: bool = True,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """The normal interval of the mean of the human labels alone, with the finite-population
    factor of n labelled units among `n_all` (None: an infinite population)."""
    h = np.asarray(human, dtype=float)
    if len(h) < 2:
        raise ValueError(f"{len(h)} labelled unit(s): an interval needs at least 2")
    big_n = len(h) if n_all is None else n_all
    factor = 1.0 if n_all is None else _factor(len(h), n_all, labelled_in_population)
    se = math.sqrt(factor * _var(h) / len(h))
    return _interval(float(h.mean()), se, confidence, bounds, len(h), big_n, None)


def systematic_sample(
    strata: Sequence[Hashable], items: Sequence[Hashable], n: int, seed: int
) -> list[int]:
    """The indices (sorted) of n of the units, each drawn with probability n / N: ordered by
    stratum, then by a seeded shuffle of the items and of the units inside each item, then every
    (N / n)-th from a seeded start (module docstring). `strata[i]`, `items[i]`: unit i's."""
    big_n = len(strata)
    if len(items) != big_n:
        raise ValueError(f"{big_n} strata for {len(items)} units")
    if not 1 <= n <= big_n:
        raise ValueError(f"cannot draw {n} of {big_n} units")
    rng = np.random.default_rng(seed)
    item_names = sorted({repr(i) for i in items})
    ranks = rng.permutation(len(item_names))
    item_rank = {name: int(r) for name, r in zip(item_names, ranks, strict=True)}
    stratum_names = sorted({repr(s) for s in strata})
    stratum_rank = {name: r for r, name in enumerate(stratum_names)}
    inner = rng.permutation(big_n)  # the order of the units inside one item
    order = sorted(
        range(big_n),
        key=lambda i: (stratum_rank[repr(strata[i])], item_rank[repr(items[i])], int(inner[i])),
    )
    step = big_n / n
    start = float(rng.uniform(0.0, step))
    picked = {order[min(int(start + k * step), big_n - 1)] for k in range(n)}
    return sorted(picked)


@dataclass(frozen=True)
class Kappa:
    kappa: float | None
    low: float | None
    high: float | None
    n: int
    exact: float  # share of units where judge and person gave the same label


def audit_kappa(
    judge: Sequence[Hashable],
    human: Sequence[Hashable],
    scale: Sequence[Hashable],
    *,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Kappa:
    """Cohen's kappa (unweighted, over the labels of `scale`) of the judge against the person,
    with its seeded 95% percentile-bootstrap interval; None where undefined (one label only)."""
    from pipeline.metrics.agreement import kappa_interval

    if len(judge) != len(human):
        raise ValueError(f"{len(judge)} judge labels against {len(human)} human labels")
    if not judge:
        raise ValueError("no labelled units")
    k, lo, hi = kappa_interval(judge, human, scale, n_resamples=n_resamples, seed=seed)
    exact = float(np.mean([a == b for a, b in zip(judge, human, strict=True)]))
    return Kappa(k, lo, hi, len(judge), exact)
