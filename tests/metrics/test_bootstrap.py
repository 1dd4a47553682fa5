"""Paired bootstrap: hand-enumerated resamples, seeded determinism, edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.metrics.bootstrap import paired_bootstrap, resample_indices
from pipeline.results.compare import bootstrap_metrics, item_sums

# Every resample of two items (n^n = 4), each equally likely.
ALL_OF_TWO = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.int64)


def test_means_enumerated_by_hand() -> None:
    # A scores 1 then 0, B scores 1 and 1: deltas per resample 0, .5, .5, 1
    r = paired_bootstrap([1, 0], [1, 1], [1, 1], [1, 1], indices=ALL_OF_TWO)
    assert (r.a, r.b, r.delta) == (0.5, 1.0, 0.5)
    # numpy's linear percentiles of [0, .5, .5, 1]: 0 + .075 * .5 and .5 + .925 * .5
    assert r.ci_low == pytest.approx(0.0375) and r.ci_high == pytest.approx(0.9625)
    # one delta of four is <= 0, all are >= 0: p = 2 * 1/4
    assert r.p_value == pytest.approx(0.5)
    assert r.n_items == 2 and r.resamples == 4


def test_ratios_pool_numerators_and_denominators() -> None:
    # item 1: two insights, A 2/2, B 1/2; item 2: one insight, A 0/1, B 1/1
    r = paired_bootstrap([2, 0], [2, 1], [1, 1], [2, 1], indices=ALL_OF_TWO)
    assert r.a == pytest.approx(2 / 3) and r.b == pytest.approx(2 / 3) and r.delta == 0
    # resamples: (1,1): A 4/4, B 2/4 -> -.5; (1,2), (2,1): 2/3 vs 2/3 -> 0; (2,2): 0 vs 1 -> 1
    assert r.ci_low == pytest.approx(-0.5 + 0.075 * 0.5)
    assert r.p_value == 1.0  # 3 of 4 on each side of zero: 2 * 3/4, capped at 1


def test_resamples_without_a_denominator_are_dropped() -> None:
    # item 2 has no covered insight for A (denominator 0): resample (2,2) has no A score
    r = paired_bootstrap([1, 0], [1, 0], [0, 1], [1, 1], indices=ALL_OF_TWO)
    assert r.resamples == 3
    # (1,1): 0-1 = -1; (1,2),(2,1): 1/2 - 2/2 = -.5
    assert r.a == 1.0 and r.b == 0.5 and r.delta == -0.5
    assert r.p_value == pytest.approx(0.0)


def test_a_constant_improvement_is_significant_and_exact() -> None:
    n = 50
    a = [float(i % 7) for i in range(n)]
    b = [x + 2.0 for x in a]
    r = paired_bootstrap(a, [1.0] * n, b, [1.0] * n, resamples=2000, seed=3)
    assert r.delta == pytest.approx(2.0)
    assert r.ci_low == pytest.approx(2.0) and r.ci_high == pytest.approx(2.0)
    assert r.p_value == 0.0


def test_identical_systems_are_not_significant() -> None:
    a = [0.0, 1.0, 0.5, 1.0, 0.0]
    r = paired_bootstrap(a, [1] * 5, a, [1] * 5, resamples=500, seed=0)
    assert r.delta == 0 and r.ci_low == 0 and r.ci_high == 0 and r.p_value == 1.0


def test_seeded_and_checked() -> None:
    assert np.array_equal(resample_indices(5, 10, 7), resample_indices(5, 10, 7))
    assert not np.array_equal(resample_indices(5, 10, 7), resample_indices(5, 10, 8))
    with pytest.raises(ValueError, match="one value per item"):
        paired_bootstrap([1, 2], [1, 1], [1], [1])
    with pytest.raises(ValueError, match="at least one item"):
        resample_indices(0, 10, 0)


def _ins(item: str, cov: float, f1: float | None, status: str = "ok") -> dict[str, object]:
    return {
        "item_id": item,
        "status": status,
        "covered": cov > 0,
        "coverage": cov,
        "f1": f1,
        "precision": f1,
        "recall": f1,
    }


def test_item_sums_follow_summhay_pooling() -> None:
    recs = [
        _ins("s1", 1.0, 0.5),
        _ins("s1", 0.5, 1.0),
        _ins("s1", 0.0, None),
        _ins("s2", 1.0, 0.0),
        _ins("s2", 1.0, 1.0, status="invalid"),  # left out everywhere
    ]
    s = item_sums(recs, "x")
    assert s["s1"]["coverage"] == [150.0, 3.0]
    assert s["s1"]["joint"] == [100.0, 3.0]  # 100*(1*.5) + 100*(.5*1)
    assert s["s1"]["citation"] == [150.0, 2.0]  # covered ones only
    assert s["s2"]["coverage"] == [100.0, 1.0]


def test_bootstrap_metrics_pairs_shared_items_only() -> None:
    a = [_ins("s1", 1.0, 1.0), _ins("s2", 0.0, None), _ins("only-a", 1.0, 1.0)]
    b = [_ins("s1", 1.0, 1.0), _ins("s2", 1.0, 1.0)]
    res, shared = bootstrap_metrics(a, b, resamples=200, seed=0)
    assert shared == 2
    assert res["coverage"]["a"] == 50.0 and res["coverage"]["b"] == 100.0
    assert res["coverage"]["delta"] == 50.0
