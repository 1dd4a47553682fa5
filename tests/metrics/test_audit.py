"""The audit's statistics on hand-computed cases: kappa and the prediction-powered estimate of a
10-item audit, the human-only interval, the weighted (macro) form, and the sampler's design."""

from __future__ import annotations

import math
from collections import Counter
from statistics import NormalDist

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from pipeline.metrics.audit import audit_kappa, classical_mean, ppi_mean, systematic_sample

VALUE = {"F": 100.0, "P": 50.0, "N": 0.0}
# A 10-unit audit: the judge's labels and the person's on the same units.
JUDGE = list("FFFPPNNNFP")
HUMAN = list("FPFPNNNFFN")
# The judge's labels on the run's 10 other units (20 units in all).
OTHERS = list("FFPNNNPFFN")
Z = NormalDist().inv_cdf(0.975)


def test_kappa_of_a_ten_unit_audit_by_hand() -> None:
    # confusion (judge rows F P N x person columns F P N): F: 3 1 0; P: 0 1 2; N: 1 0 2
    # p_o = 6/10; marginals judge F4 P3 N3, person F4 P2 N4: p_e = (16 + 6 + 12) / 100 = 0.34
    k = audit_kappa(JUDGE, HUMAN, ["F", "P", "N"], n_resamples=200, seed=0)
    assert k.kappa == pytest.approx((0.6 - 0.34) / (1 - 0.34))
    assert k.kappa == pytest.approx(cohen_kappa_score(JUDGE, HUMAN, labels=["F", "P", "N"]))
    assert k.n == 10
    assert k.exact == pytest.approx(0.6)
    assert k.low is not None and k.high is not None
    assert k.low < k.kappa < k.high


def test_kappa_of_one_label_only_is_undefined_not_zero() -> None:
    k = audit_kappa(["F"] * 4, ["F"] * 4, ["F", "P", "N"], n_resamples=50)
    assert k.kappa is None
    assert k.exact == 1.0


def test_prediction_powered_estimate_of_a_ten_unit_audit_by_hand() -> None:
    f_all = [VALUE[x] for x in JUDGE + OTHERS]
    est = ppi_mean(f_all, [VALUE[x] for x in JUDGE], [VALUE[x] for x in HUMAN])
    # judge mean over 20 units: (550 + 500) / 20 = 52.5; person - judge on the 10 labelled:
    # 0, -50, 0, 0, -50, 0, 0, +100, 0, -50 -> mean -5; theta = 52.5 - 5 = 47.5
    assert est.estimate == pytest.approx(47.5)
    # var_N(f) = (8 * 47.5^2 + 5 * 2.5^2 + 7 * 52.5^2) / 19 = 37375 / 19
    # var_n(h - f) = (6 * 5^2 + 3 * 45^2 + 105^2) / 9 = 17250 / 9
    se = math.sqrt(37375 / 19 / 20 + 17250 / 9 / 10)
    assert est.low == pytest.approx(47.5 - Z * se)
    assert est.high == pytest.approx(47.5 + Z * se)
    assert (est.n, est.n_all) == (10, 20)


def test_human_only_interval_by_hand() -> None:
    est = classical_mean([VALUE[x] for x in HUMAN])
    # 100 x4, 50 x2, 0 x4: mean 50, variance 4 * 2 * 50^2 / 9
    se = math.sqrt(20000 / 9 / 10)
    assert est.estimate == pytest.approx(50.0)
    assert est.width == pytest.approx(2 * Z * se)


def test_a_judge_that_agrees_with_the_person_is_not_corrected() -> None:
    f_all = [VALUE[x] for x in JUDGE + OTHERS]
    est = ppi_mean(f_all, [VALUE[x] for x in JUDGE], [VALUE[x] for x in JUDGE])
    assert est.estimate == pytest.approx(52.5)
    assert est.width == pytest.approx(2 * Z * math.sqrt(37375 / 19 / 20))


def test_weighted_form_gives_the_macro_average_and_reduces_to_the_plain_one() -> None:
    # two items: item a has 1 unit (judge 1), item b has 3 units (judge 0, 0, 1): the metric
    # averages items: (1 + 1/3) / 2 = 2/3; the person labels b's units 1, 0, 1 and a's 1
    f = [1.0, 0.0, 0.0, 1.0]
    w = [1.0, 1 / 3, 1 / 3, 1 / 3]
    est = ppi_mean(f, f, [1.0, 1.0, 0.0, 1.0], weights_all=w, weights_labelled=w)
    assert est.estimate == pytest.approx((1 + 2 / 3) / 2)  # every unit labelled: the truth
    plain = ppi_mean(f, f[:2], [1.0, 1.0])
    same = ppi_mean(f, f[:2], [1.0, 1.0], weights_all=[2.0] * 4, weights_labelled=[2.0] * 2)
    assert (same.estimate, same.low, same.high) == pytest.approx(
        (plain.estimate, plain.low, plain.high)
    )


def test_bad_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ppi_mean([1.0, 0.0], [1.0], [0.0])
    with pytest.raises(ValueError, match="judge values against"):
        ppi_mean([1.0, 0.0, 1.0], [1.0, 0.0], [0.0])
    with pytest.raises(ValueError, match="neither"):
        ppi_mean([1.0, 0.0], [1.0, 0.0], [0.0, 1.0], weights_all=[1.0, 1.0])


def test_systematic_sample_is_seeded_proportional_and_equal_chance() -> None:
    rng = np.random.default_rng(1)
    strata = [str(x) for x in rng.choice(["F", "P", "N"], size=300, p=[0.5, 0.2, 0.3])]
    items = [f"g{i // 7}" for i in range(300)]
    a = systematic_sample(strata, items, 30, seed=3)
    assert a == systematic_sample(strata, items, 30, seed=3)
    assert a != systematic_sample(strata, items, 30, seed=4)
    assert len(a) == 30 and len(set(a)) == 30
    share = Counter(strata)
    for seed in range(20):
        got = Counter(strata[i] for i in systematic_sample(strata, items, 30, seed))
        for label, count in share.items():  # each label gets its share of the sample, +-1
            assert abs(got[label] - 30 * count / 300) <= 1
    # every unit has the same chance n/N = 0.1 of being drawn
    hits = Counter(i for s in range(2000) for i in systematic_sample(strata, items, 30, s))
    freq = np.asarray([hits[i] / 2000 for i in range(300)])
    assert abs(freq.mean() - 0.1) < 1e-9
    assert freq.min() > 0.05 and freq.max() < 0.15


def test_sample_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="cannot draw"):
        systematic_sample(["F"] * 3, ["a"] * 3, 4, 0)
    assert systematic_sample(["F", "N"], ["a", "b"], 2, 0) == [0, 1]
