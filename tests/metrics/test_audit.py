"""The audit's statistics on hand-computed cases: kappa and the prediction-powered estimate of a
10-item audit, the human-only interval, the weighted (macro) form, and the sampler's design."""

from __future__ import annotations

import math
from collections import Counter

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
T9 = 2.262157  # Student's t, 97.5% quantile, 9 degrees of freedom (n = 10): a table's value


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
    # labelled: judge f = 100 100 100 50 50 0 0 0 100 50 (mean 55), person h = 100 50 100 50 0
    # 0 0 100 100 0 (mean 50); deviations f: 45 45 45 -5 -5 -55 -55 -55 45 -5, h: 50 0 50 0 -50
    # -50 -50 50 50 -50: cov = 10000 / 9, var f = 17250 / 9, var h = 20000 / 9
    lam = 10000 / 17250
    assert est.lam == pytest.approx(lam)
    # judge mean over the 20 units: (550 + 500) / 20 = 52.5; theta = lam * 52.5 + 50 - lam * 55
    assert est.estimate == pytest.approx(50 - 2.5 * lam)
    # var(h - lam f) = var h - cov^2 / var f; 10 of the 20 units labelled: factor 1 - 10/20
    var_r = (20000 - 10000**2 / 17250) / 9
    se = math.sqrt((1 - 10 / 20) * var_r / 10)
    assert est.low == pytest.approx(est.estimate - T9 * se)
    assert est.high == pytest.approx(est.estimate + T9 * se)
    assert (est.n, est.n_all) == (10, 20)
    # lambda = 1 is the original PPI: 52.5 - 5, the same correction on var(h - f) = 17250 / 9
    plain = ppi_mean(f_all, [VALUE[x] for x in JUDGE], [VALUE[x] for x in HUMAN], lam=1.0)
    assert plain.estimate == pytest.approx(47.5)
    assert plain.width == pytest.approx(2 * T9 * math.sqrt(0.5 * 17250 / 9 / 10))


def test_human_only_interval_by_hand() -> None:
    est = classical_mean([VALUE[x] for x in HUMAN])
    # 100 x4, 50 x2, 0 x4: mean 50, variance 4 * 2 * 50^2 / 9
    se = math.sqrt(20000 / 9 / 10)
    assert est.estimate == pytest.approx(50.0)
    assert est.width == pytest.approx(2 * T9 * se)
    # 10 of a run's 20 units: the finite-population factor 1 - 10/20 on the variance
    part = classical_mean([VALUE[x] for x in HUMAN], n_all=20)
    assert part.width == pytest.approx(2 * T9 * math.sqrt(0.5 * 20000 / 9 / 10))


def test_a_judge_that_agrees_with_the_person_is_not_corrected() -> None:
    f_all = [VALUE[x] for x in JUDGE + OTHERS]
    est = ppi_mean(f_all, [VALUE[x] for x in JUDGE], [VALUE[x] for x in JUDGE])
    assert est.lam == pytest.approx(1.0)
    assert est.estimate == pytest.approx(52.5)
    assert est.width == pytest.approx(0.0)  # the person is the judge: nothing left to estimate


def test_weighted_form_gives_the_macro_average_and_reduces_to_the_plain_one() -> None:
    # two items: item a has 1 unit (judge 1), item b has 3 units (judge 0, 0, 1): the metric
    # averages items: (1 + 1/3) / 2 = 2/3; the person labels b's units 1, 0, 1 and a's 1
    f = [1.0, 0.0, 0.0, 1.0]
    w = [1.0, 1 / 3, 1 / 3, 1 / 3]
    est = ppi_mean(f, f, [1.0, 1.0, 0.0, 1.0], weights_all=w, weights_labelled=w)
    assert est.estimate == pytest.approx((1 + 2 / 3) / 2)  # every unit labelled: the truth
    assert est.width == pytest.approx(0.0)
    plain = ppi_mean(f, f[:2], [1.0, 1.0])
    same = ppi_mean(f, f[:2], [1.0, 1.0], weights_all=[2.0] * 4, weights_labelled=[2.0] * 2)
    assert (same.estimate, same.low, same.high) == pytest.approx(
        (plain.estimate, plain.low, plain.high)
    )


def _judges(rng: np.random.Generator, big_n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """People's values on N units (0 / 50 / 100) and judges of every quality on them."""
    human = rng.choice([0.0, 50.0, 100.0], size=big_n, p=[0.4, 0.2, 0.4])
    flip = rng.random(big_n) < 0.3
    flipped = np.where(flip, rng.choice([0.0, 50.0, 100.0], size=big_n), human)
    return {
        "good": (human, np.where(rng.random(big_n) < 0.1, 50.0, human)),
        "30% flipped": (human, flipped),
        "random": (human, rng.permutation(human)),
        "contrary": (human, 100.0 - human),
        "constant": (human, np.full(big_n, 50.0)),
    }


@pytest.mark.parametrize("n", [2, 5, 30, 200])
def test_the_corrected_interval_is_never_wider_than_the_labels_alone(n: int) -> None:
    """Issue 44, point 11. Before (lambda = 1): a 30%-flipped judge's interval was wider than
    the people-alone one at n = 30, an uninformative one about 40% wider. With lambda chosen on
    the labelled units in [0, 1], var(h - lambda f) <= var(h) on every sample, so the interval
    is never wider (both with the same finite-population factor)."""
    rng = np.random.default_rng(n)
    for name, (human, judge) in _judges(rng, 1000).items():
        for _ in range(50):
            idx = rng.choice(len(human), size=n, replace=False)
            ppi = ppi_mean(judge, judge[idx], human[idx])
            alone = classical_mean(human[idx], n_all=len(human))
            assert ppi.width <= alone.width + 1e-9, (name, n, ppi, alone)
            assert ppi.lam is not None and 0.0 <= ppi.lam <= 1.0


def test_every_unit_labelled_gives_the_people_s_mean_with_no_width() -> None:
    """Issue 44, point 12. Before: 5.27 points wide at n = N (the judge's variance over N and
    the rectifier's over n, as if both were samples of an infinite population)."""
    rng = np.random.default_rng(0)
    for human, judge in _judges(rng, 300).values():
        est = ppi_mean(judge, judge, human)
        alone = classical_mean(human, n_all=len(human))
        assert est.estimate == pytest.approx(float(human.mean()))
        assert est.width == pytest.approx(0.0, abs=1e-9)
        assert alone.width == pytest.approx(0.0, abs=1e-9)


def test_the_interval_is_clipped_to_the_metric_s_range() -> None:
    """Issue 44, point 12. Before: `[-7.52, 18.63]` for a coverage (0-100)."""
    judge = [0.0] * 95 + [100.0] * 5
    human = [0.0, 0.0, 0.0, 100.0]  # the person finds coverage where the judge found little
    est = ppi_mean(judge, [0.0, 0.0, 0.0, 0.0], human, bounds=(0.0, 100.0))
    raw = ppi_mean(judge, [0.0, 0.0, 0.0, 0.0], human)
    assert raw.low < 0.0  # what the normal interval says
    assert est.low == 0.0 and est.high == pytest.approx(min(raw.high, 100.0))
    alone = classical_mean(human, n_all=100, bounds=(0.0, 100.0))
    assert alone.low == 0.0 and 0.0 <= alone.estimate <= alone.high <= 100.0


def test_labels_from_outside_the_run_get_no_correction_but_its_own_sampling() -> None:
    f_all = [VALUE[x] for x in JUDGE + OTHERS]
    inside = ppi_mean(f_all, [VALUE[x] for x in JUDGE], [VALUE[x] for x in HUMAN])
    outside = ppi_mean(
        f_all, [VALUE[x] for x in JUDGE], [VALUE[x] for x in HUMAN], labelled_in_population=False
    )
    assert outside.estimate == pytest.approx(inside.estimate)
    # (1 + 10/20) against (1 - 10/20) on the same variance
    assert outside.width == pytest.approx(inside.width * math.sqrt(1.5 / 0.5))


def test_it_agrees_with_ppi_py_on_a_large_run() -> None:
    """The reference implementation (ppi_py's `ppi_mean_ci` with lambda chosen from the data,
    PPI++): on a run of N = 200,000 units with n = 400 labelled, its infinite-population
    interval and ours differ only by what N makes negligible (the correction 1 - n/N, its
    lambda^2 var(f) / N term and 1 + n/N in its lambda) and by ddof (0 against 1)."""
    from ppi_py import ppi_mean_ci, ppi_mean_pointestimate

    rng = np.random.default_rng(7)
    for name, (human, judge) in _judges(rng, 200_400).items():
        if name == "constant":  # ppi_py divides by the judge's variance: nan
            continue
        idx = rng.choice(len(human), size=400, replace=False)
        rest = np.setdiff1d(np.arange(len(human)), idx)
        ours = ppi_mean(judge[rest], judge[idx], human[idx], labelled_in_population=False)
        low, high = ppi_mean_ci(human[idx], judge[idx], judge[rest], alpha=0.05)
        theirs = (float(np.ravel(low)[0]), float(np.ravel(high)[0]))
        assert ours.low == pytest.approx(theirs[0], abs=0.01 * ours.width), name
        assert ours.high == pytest.approx(theirs[1], abs=0.01 * ours.width), name
        # with the same lambda, the same point estimate (the judge's mean over the run)
        assert ours.lam is not None
        same = ppi_mean_pointestimate(human[idx], judge[idx], judge, lam=ours.lam)
        mine = ppi_mean(judge, judge[idx], human[idx], lam=ours.lam)
        assert mine.estimate == pytest.approx(float(np.ravel(same)[0]))


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


def test_the_readme_s_coverage_study_is_the_stored_result() -> None:
    """Issue 44, point 15. Before: the README's table was typed in by hand and drifted from the
    code (the local judge's mean 56.34 in the README, 56.06 from the code; coverage 94.5%
    against 96.5% at n = 30). The table between the README's markers is what
    `perf/audit_coverage.py --write-readme` makes of the stored `perf/audit_coverage.json`."""
    import importlib.util
    import json

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("audit_coverage", ROOT / "perf/audit_coverage.py")
    assert spec is not None and spec.loader is not None
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    results = json.loads((ROOT / "perf/audit_coverage.json").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert study.readme_table(readme) == study.readme_block(results)
    # and what the README says of it holds: every judge's corrected interval covers in at
    # least 93% of the draws, never wider on average than the people-alone one
    for r in results:
        assert r["ppi"]["coverage"] >= 0.93, r
        assert r["ppi"]["mean_width"] <= r["human"]["mean_width"], r
