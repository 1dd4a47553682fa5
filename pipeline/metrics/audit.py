"""An audit of a judge by people, on one run's own outputs: pure functions, no I/O.

A person labels a sample of n of the N verdicts a judge gave on one run (see
`pipeline/stages/audit.py`). From those labels:

- `systematic_sample`: which n of the N verdicts to show. The verdicts are ordered by stratum
  (the judge's label), then by a seeded shuffle of the items, then of the verdicts inside an
  item, and every (N / n)-th is taken from a seeded random start. Every verdict has the same
  chance n / N of being drawn (so a plain mean over the sample is unbiased), while each of the
  judge's labels gets its share of the sample and the sample spreads over the items.
- `ppi_mean`: the prediction-powered estimate of the run's metric (Angelopoulos, Bates, Fannjiang,
  Jordan and Zrnic, "Prediction-powered inference", Science 382, 2023): the judge's value on
  every one of the N units, corrected by the mean human-minus-judge difference on the n labelled
  ones,

      theta_PP = mean_N(f) + mean_n(h - f),

  with the normal interval theta_PP +- z * sqrt(var_N(f) / N + var_n(h - f) / n). A metric that
  weights its units (a macro average over items: each unit of an item with k units weighs 1/k)
  passes `weights`; each unit's value is then scaled by N * w / sum(w), which gives back the
  weighted mean and reduces to the formula above when all weights are equal. Variances are
  sample variances (ddof 1; `ppi_py`'s `ppi_mean_ci` uses ddof 0, a factor sqrt(n / (n - 1))
  narrower).
- `classical_mean`: the interval from the n human labels alone (what an audit without the judge
  would say), for comparison.
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
    """A mean with its interval (`confidence`), from n labelled units (and N judged ones)."""

    estimate: float
    low: float
    high: float
    n: int
    n_all: int
    confidence: float = 0.95

    @property
    def width(self) -> float:
        return self.high - self.low


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _var(x: np.ndarray) -> float:
    return float(np.var(x, ddof=1)) if len(x) > 1 else 0.0


def ppi_mean(
    judge_all: Sequence[float],
    judge_labelled: Sequence[float],
    human_labelled: Sequence[float],
    *,
    weights_all: Sequence[float] | None = None,
    weights_labelled: Sequence[float] | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """The prediction-powered mean (module docstring). `judge_all`: the judge's value on each of
    the N units; `judge_labelled`, `human_labelled`: the judge's and the person's values on the
    n labelled ones, paired; optional `weights_*`: each unit's weight in the metric."""
    f = np.asarray(judge_all, dtype=float)
    fl = np.asarray(judge_labelled, dtype=float)
    hl = np.asarray(human_labelled, dtype=float)
    if len(fl) != len(hl):
        raise ValueError(f"{len(fl)} judge values against {len(hl)} human labels")
    if len(hl) < 2:
        raise ValueError(f"{len(hl)} labelled unit(s): an interval needs at least 2")
    if len(f) < 2:
        raise ValueError(f"{len(f)} judged unit(s): an interval needs at least 2")
    big_n = len(f)
    if (weights_all is None) != (weights_labelled is None):
        raise ValueError("give weights for all units and for the labelled ones, or neither")
    if weights_all is not None and weights_labelled is not None:
        w = np.asarray(weights_all, dtype=float)
        wl = np.asarray(weights_labelled, dtype=float)
        if len(w) != big_n or len(wl) != len(hl) or (w <= 0).any() or (wl <= 0).any():
            raise ValueError("weights must be positive, one per unit")
        scale = big_n / float(w.sum())
        f, fl, hl = f * w * scale, fl * wl * scale, hl * wl * scale
    rectifier = hl - fl
    estimate = float(f.mean() + rectifier.mean())
    se = math.sqrt(_var(f) / big_n + _var(rectifier) / len(hl))
    z = _z(confidence)
    return Estimate(estimate, estimate - z * se, estimate + z * se, len(hl), big_n, confidence)


def classical_mean(human: Sequence[float], *, confidence: float = 0.95) -> Estimate:
    """The normal interval of the mean of the human labels alone."""
    h = np.asarray(human, dtype=float)
    if len(h) < 2:
        raise ValueError(f"{len(h)} labelled unit(s): an interval needs at least 2")
    estimate = float(h.mean())
    se = math.sqrt(_var(h) / len(h))
    z = _z(confidence)
    return Estimate(estimate, estimate - z * se, estimate + z * se, len(h), len(h), confidence)


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
