"""Agreement statistics: hand-computed cases, then the libraries' results on random data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats import inter_rater

from pipeline.metrics.agreement import (
    bootstrap_ci,
    cohen_kappa,
    confusion,
    exact_agreement,
    fleiss_kappa,
    pearson,
    randolph_kappa,
    spearman,
)

# Two raters, 10 items, categories no < partial < full.
A = ["no", "no", "no", "partial", "partial", "full", "full", "full", "full", "no"]
B = ["no", "no", "partial", "partial", "full", "full", "full", "no", "full", "no"]
ORDER = ["no", "partial", "full"]


def test_cohen_kappa_by_hand() -> None:
    # Confusion (rows A, cols B): no: [3,1,0] partial: [0,1,1] full: [1,0,3]. p_o = 7/10.
    m, cats = confusion(A, B, ORDER)
    assert cats == ORDER
    assert m.tolist() == [[3, 1, 0], [0, 1, 1], [1, 0, 3]]
    # Marginals A: 4, 2, 4; B: 4, 2, 4. p_e = (16 + 4 + 16) / 100 = 0.36.
    assert cohen_kappa(A, B, categories=ORDER) == pytest.approx((0.7 - 0.36) / (1 - 0.36))
    # Linear weights |i-j|: observed disagreement 1*1 + 1*1 + 2*1 = 4 (per 10 items);
    # expected sum_ij |i-j| * rowA_i * colB_j / 10 = (4*2*1 + 4*4*2 + 2*4*1 + 2*4*1 + 4*4*2
    # + 4*2*1) / 10 = 96 / 10.
    assert cohen_kappa(A, B, "linear", ORDER) == pytest.approx(1 - 4 / 9.6)
    # Quadratic: observed 1 + 1 + 4 = 6; expected (8 + 64 + 8 + 8 + 64 + 8) / 10 = 16.
    assert cohen_kappa(A, B, "quadratic", ORDER) == pytest.approx(1 - 6 / 16)


def test_cohen_kappa_matches_scikit_learn() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = rng.integers(0, 3, size=200)
        b = np.where(rng.random(200) < 0.6, a, rng.integers(0, 3, size=200))
        for w in (None, "linear", "quadratic"):
            ours = cohen_kappa(a.tolist(), b.tolist(), w, categories=[0, 1, 2])
            assert ours == pytest.approx(cohen_kappa_score(a, b, weights=w, labels=[0, 1, 2]))


def test_cohen_kappa_undefined_and_errors() -> None:
    assert math.isnan(cohen_kappa(["x", "x"], ["x", "x"]))  # one category: undefined, not 1
    assert cohen_kappa(["x", "y"], ["x", "y"]) == 1.0
    with pytest.raises(ValueError, match="pair up"):
        cohen_kappa(["x"], ["x", "y"])
    with pytest.raises(ValueError, match="not among the categories"):
        cohen_kappa(["x", "maybe"], ["x", "y"], categories=["x", "y"])
    with pytest.raises(ValueError, match="weights"):
        cohen_kappa(["x", "y"], ["x", "y"], weights="cubic")  # type: ignore[arg-type]


RATINGS = [[1, 1, 2], [2, 2, 2], [1, 2, 3]]


def test_fleiss_and_randolph_by_hand() -> None:
    # Per-item agreement: (1+4-3)/6 = 1/3, (9-3)/6 = 1, (1+1+1-3)/6 = 0; mean 4/9.
    # Category shares 3/9, 5/9, 1/9 -> p_e = 35/81.
    p_o, p_e = 4 / 9, 35 / 81
    assert fleiss_kappa(RATINGS) == pytest.approx((p_o - p_e) / (1 - p_e))
    # Free-marginal with 4 possible categories (one never chosen): p_e = 1/4.
    assert randolph_kappa(RATINGS, categories=[1, 2, 3, 4]) == pytest.approx((4 / 9 - 0.25) / 0.75)
    # Without the category list, k is the number observed (3).
    assert randolph_kappa(RATINGS) == pytest.approx((4 / 9 - 1 / 3) / (2 / 3))


def test_multi_rater_kappa_matches_statsmodels() -> None:
    rng = np.random.default_rng(2)
    for _ in range(10):
        truth = rng.integers(0, 3, size=50)
        ratings = np.where(rng.random((50, 4)) < 0.7, truth[:, None], rng.integers(0, 3, (50, 4)))
        table, _ = inter_rater.aggregate_raters(ratings, n_cat=3)
        cats = [0, 1, 2]
        assert fleiss_kappa(ratings.tolist(), cats) == pytest.approx(
            inter_rater.fleiss_kappa(table, method="fleiss")
        )
        assert randolph_kappa(ratings.tolist(), cats) == pytest.approx(
            inter_rater.fleiss_kappa(table, method="randolph")
        )


def test_multi_rater_errors() -> None:
    with pytest.raises(ValueError, match="same number of ratings"):
        fleiss_kappa([[1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match="at least two ratings"):
        randolph_kappa([[1], [2]])
    with pytest.raises(ValueError, match="no items"):
        fleiss_kappa([])


def test_correlations_and_exact_agreement() -> None:
    x = [1.0, 0.5, 0.0, 1.0, 0.0]
    y = [1.0, 1.0, 0.0, 0.5, 0.0]
    assert pearson(x, y) == pytest.approx(scipy_stats.pearsonr(x, y).statistic)
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    # By hand: means 0.5 and 0.5; products .25, 0, .25, 0, .25 sum to 0.75; var sums 1 and 1.
    assert pearson(x, y) == pytest.approx(0.75 / 1.0)
    assert exact_agreement(x, y) == pytest.approx(3 / 5)
    assert math.isnan(pearson([1.0, 1.0, 1.0], [0.0, 1.0, 0.5]))  # constant rater


def test_correlations_are_scipys_to_the_bit() -> None:
    """pearson and spearman redo scipy's arithmetic without its per-call overhead: on random
    labels (many ties), scores and two-item cases they return scipy's exact floats, so the
    committed bootstrap intervals did not move."""
    rng = np.random.default_rng(7)
    compared = 0
    for trial in range(3000):
        k = int(rng.integers(2, 50))
        if trial % 3 == 0:
            x, y = rng.integers(0, 3, k) / 2, rng.integers(0, 5, k) / 4
        elif trial % 3 == 1:
            x = rng.normal(size=k)
            y = x * rng.normal() + rng.normal(size=k)
        else:
            x, y = rng.choice([0.0, 0.5, 1.0], k), rng.random(k).round(2)
        if np.all(x == x[0]) or np.all(y == y[0]):
            continue
        compared += 1
        assert pearson(x, y) == float(scipy_stats.pearsonr(x, y).statistic), (x, y)
        assert spearman(x, y) == float(scipy_stats.spearmanr(x, y).statistic), (x, y)
    assert compared > 2500
    assert pearson([0.0, 1.0], [3.0, 2.0]) == -1.0
    with np.errstate(invalid="ignore"):
        assert math.isnan(spearman([0.0, 1.0, math.nan], [1.0, 0.0, 0.5]))  # as scipy's


def test_bootstrap_ci_is_paired_and_reproducible() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 3, size=300).tolist()
    b = [x if r < 0.8 else (x + 1) % 3 for x, r in zip(a, rng.random(300), strict=True)]
    ci = bootstrap_ci(cohen_kappa, a, b, n_resamples=300, seed=7)
    again = bootstrap_ci(cohen_kappa, a, b, n_resamples=300, seed=7)
    assert ci == again
    assert ci.estimate == pytest.approx(cohen_kappa(a, b))
    assert ci.low < ci.estimate < ci.high
    # Paired resampling keeps perfect agreement perfect: every resample has kappa 1.
    perfect = bootstrap_ci(cohen_kappa, a, a, n_resamples=50)
    assert perfect.low == perfect.high == 1.0
    # The interval of a mean of 0/1 values is close to the normal approximation.
    ones = [1] * 60 + [0] * 40
    mean_ci = bootstrap_ci(lambda v: float(np.mean(v)), ones, n_resamples=2000, seed=1)
    half = 1.96 * math.sqrt(0.6 * 0.4 / 100)
    assert mean_ci.low == pytest.approx(0.6 - half, abs=0.02)
    assert mean_ci.high == pytest.approx(0.6 + half, abs=0.02)
