"""CRUX's metrics, pure: answerability, the oracle context, Coverage, alpha-nDCG, Density, and
Kendall's tau between context and answer metrics.

A retrieval context Z is a ranked list of passages; `R[p][i]` is passage p's graded rating
(0-5) of sub-question i. A sub-question is answered by Z when max over p in Z of R[p][i] >= eta.

- Coverage(Z) = answered sub-questions / answerable sub-questions (of the query).
- alpha-nDCG@k (Clarke et al., 2008, sub-questions as subtopics): the gain at rank r sums, over
  the sub-questions p_r answers, (1 - alpha)^(times they were answered above r); the discount is
  log2(1 + r); normalised by the same sum for the ideal ranking, built greedily (the passage of
  largest gain next) over the query's relevant passages, cut at k.
- Density(Z) = ((Coverage(Z) / tokens(Z)) / (Coverage(Z*) / tokens(Z*)))^w.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

Ratings = Mapping[str, Sequence[int]]  # passage -> rating per sub-question


def answered_by(ratings: Sequence[int], eta: int) -> set[int]:
    return {i for i, r in enumerate(ratings) if r >= eta}


def answerable(ratings: Ratings, n: int, eta: int) -> list[int]:
    """The sub-questions (indices) some passage answers."""
    hit: set[int] = set()
    for row in ratings.values():
        hit |= answered_by(row, eta)
    return [i for i in range(n) if i in hit]


def greedy_cover(ratings: Ratings, order: Sequence[str], eta: int) -> list[str]:
    """Z*: repeatedly the passage answering the most not-yet-answered sub-questions (ties: the
    earlier in `order`), until no passage adds one."""
    left = set().union(*(answered_by(r, eta) for r in ratings.values())) if ratings else set()
    chosen: list[str] = []
    rank = {p: n for n, p in enumerate(order)}
    candidates = sorted((p for p in ratings), key=lambda p: rank.get(p, len(rank)))
    while left:
        best, gain = None, 0
        for p in candidates:
            g = len(answered_by(ratings[p], eta) & left)
            if g > gain:
                best, gain = p, g
        if best is None:
            break
        chosen.append(best)
        left -= answered_by(ratings[best], eta)
    return chosen


def coverage(context: Sequence[str], rate: Callable[[str, int], int], n: int, eta: int) -> float:
    """Share of the n sub-questions that some passage of the context answers (n > 0)."""
    return sum(1 for i in range(n) if any(rate(p, i) >= eta for p in context)) / n


def _dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(1 + r) for r, g in enumerate(gains, start=1))


def novelty_gains(
    context: Sequence[str], rate: Callable[[str, int], int], n: int, eta: int, alpha: float
) -> list[float]:
    seen = [0] * n
    gains = []
    for p in context:
        g = 0.0
        for i in range(n):
            if rate(p, i) >= eta:
                g += (1 - alpha) ** seen[i]
                seen[i] += 1
        gains.append(g)
    return gains


def ideal_gains(
    relevant: Sequence[str], rate: Callable[[str, int], int], n: int, eta: int, alpha: float, k: int
) -> list[float]:
    """The greedy ideal: at each rank the relevant passage of largest novelty gain (ties: the
    earlier in `relevant`), k ranks at most."""
    seen = [0] * n
    left = list(relevant)
    # the sub-questions each passage answers, in order (rated once, summed in the same order)
    answers = {p: [i for i in range(n) if rate(p, i) >= eta] for p in dict.fromkeys(left)}
    gains: list[float] = []
    while left and len(gains) < k:
        best, best_gain = 0, -1.0
        for j, p in enumerate(left):
            g = sum((1 - alpha) ** seen[i] for i in answers[p])
            if g > best_gain:
                best, best_gain = j, g
        p = left.pop(best)
        for i in answers[p]:
            seen[i] += 1
        gains.append(best_gain)
    return gains


def alpha_ndcg(
    context: Sequence[str],
    rate: Callable[[str, int], int],
    relevant: Sequence[str],
    ideal_rate: Callable[[str, int], int],
    n: int,
    eta: int,
    alpha: float,
    k: int,
) -> float:
    """alpha-nDCG@k of the context (rated by `rate`) against the greedy ideal over the relevant
    passages (rated by `ideal_rate`, the dataset's ratings)."""
    ideal = _dcg(ideal_gains(relevant, ideal_rate, n, eta, alpha, k))
    if ideal == 0:
        return 0.0
    return _dcg(novelty_gains(list(context)[:k], rate, n, eta, alpha)) / ideal


def density(cov: float, tokens: int, cov_star: float, tokens_star: int, w: float) -> float:
    """((cov / tokens) / (cov_star / tokens_star)) ** w; 0 for an empty or useless context."""
    if cov <= 0 or tokens <= 0:
        return 0.0
    return float(((cov / tokens) / (cov_star / tokens_star)) ** w)


def binary_kappa(x: npt.NDArray[np.int_], y: npt.NDArray[np.int_]) -> float:
    """Cohen's kappa of two 0/1 vectors (closed form, for bootstrap resamples); NaN when
    chance agreement is 1."""
    px, py = float(np.mean(x)), float(np.mean(y))
    expected = px * py + (1 - px) * (1 - py)
    if expected == 1.0:
        return math.nan
    return (float(np.mean(x == y)) - expected) / (1 - expected)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties in either variable accounted for); NaN when undefined."""
    from scipy.stats import kendalltau

    if len(x) < 2:
        return math.nan
    tau: float = float(kendalltau(x, y, variant="b").statistic)
    return tau


def kendall_tau_b_rows(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Kendall's tau-b of each row pair (x[b], y[b]) at once, for bootstrap resamples (the same
    value as `kendall_tau_b` on each row; NaN where a row is constant)."""
    dx = np.sign(x[:, :, None] - x[:, None, :])
    dy = np.sign(y[:, :, None] - y[:, None, :])
    upper = np.triu(np.ones(x.shape[1], dtype=bool), k=1)
    s = (dx * dy)[:, upper].sum(axis=1)
    n1 = (dx != 0)[:, upper].sum(axis=1)
    n2 = (dy != 0)[:, upper].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: npt.NDArray[np.float64] = s / np.sqrt(n1.astype(float) * n2)
    return out
