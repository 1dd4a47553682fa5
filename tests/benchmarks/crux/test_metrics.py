"""CRUX's metrics on hand-computed cases and on the paper's Table 5 example."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import kendalltau

from pipeline.benchmarks.crux import metrics as m
from pipeline.benchmarks.crux.derived import ranking

# Table 5 (CRUX-Multi-News-4583): each oracle passage's ratings of the 10 generated
# sub-questions; original #2 and #8 are answered by none and are filtered.
TABLE5 = {
    "P1": [0, 0, 5, 5, 0, 0, 0, 0, 5, 0],
    "P2": [5, 0, 0, 0, 5, 0, 5, 0, 0, 0],
    "P3": [0, 0, 0, 0, 5, 5, 0, 0, 0, 5],
}


def test_table5_answerable_sets_and_zstar() -> None:
    kept = m.answerable(TABLE5, 10, eta=3)
    assert [i + 1 for i in kept] == [1, 3, 4, 5, 6, 7, 9, 10]  # original #2 and #8 dropped
    # renumbered over the 8 kept sub-questions, as the paper lists them
    ratings = {p: [row[i] for i in kept] for p, row in TABLE5.items()}
    sets = {p: sorted(i + 1 for i in m.answered_by(r, 3)) for p, r in ratings.items()}
    assert sets == {"P1": [2, 3, 7], "P2": [1, 4, 6], "P3": [4, 5, 8]}
    zstar = m.greedy_cover(ratings, ["P1", "P2", "P3"], eta=3)
    assert zstar == ["P1", "P2", "P3"]  # marginal gains 3, 3, 2 (#4 already answered by P2)
    rate = lambda p, i: ratings[p][i]  # noqa: E731
    assert m.coverage(zstar, rate, 8, 3) == 1.0
    assert m.coverage(["P3"], rate, 8, 3) == 3 / 8
    # The human summary's vector over the kept questions: {#1, #5, #6, #8} -> Cov(y) = 4/8
    summary = [5, 0, 0, 0, 5, 5, 0, 5]
    assert m.coverage(["y"], lambda _p, i: summary[i], 8, 3) == 0.5


def test_greedy_cover_takes_marginal_gain_and_breaks_ties_by_order() -> None:
    r = {
        "a": [5, 5, 0, 0],  # 2
        "b": [0, 5, 5, 5],  # 3: first
        "c": [5, 0, 0, 0],  # after b: gain 1 (ties with a's gain 1: a is earlier)
    }
    assert m.greedy_cover(r, ["a", "b", "c"], 3) == ["b", "a"]
    assert m.greedy_cover(r, ["c", "b", "a"], 3) == ["b", "c"]
    # ratings below eta answer nothing; nothing answerable: an empty Z*
    assert m.greedy_cover({"a": [2, 2]}, ["a"], 3) == []
    assert m.answerable({"a": [2, 2]}, 2, 3) == []


def test_released_rankings_break_score_ties_by_haystack_position() -> None:
    assert ranking([0.5, 0.9, 0.5, 0.9, 0.1], ["d1", "d2", "d3", "d4", "d5"]) == [
        "d2",
        "d4",
        "d1",
        "d3",
        "d5",
    ]


def test_alpha_ndcg_hand_computed() -> None:
    # A answers q0, q1; B answers q0; C answers q2.
    r = {"A": [5, 5, 0], "B": [4, 0, 0], "C": [0, 0, 3]}
    rate = lambda p, i: r[p][i]  # noqa: E731
    # context B, A, C: gains 1; 0.5 (q0 seen once) + 1; 1
    dcg = 1 / math.log2(2) + 1.5 / math.log2(3) + 1 / math.log2(4)
    # greedy ideal over {A, B, C}: A (2), C (1), B (0.5)
    ideal = 2 / math.log2(2) + 1 / math.log2(3) + 0.5 / math.log2(4)
    got = m.alpha_ndcg(["B", "A", "C"], rate, ["A", "B", "C"], rate, 3, 3, 0.5, 3)
    assert got == pytest.approx(dcg / ideal)
    assert got == pytest.approx(2.446395 / 2.880930, abs=1e-6)  # 0.849168
    # at k = 1 the ideal is A alone
    assert m.alpha_ndcg(["B", "A"], rate, ["A", "B", "C"], rate, 3, 3, 0.5, 1) == 0.5
    # the ideal order itself scores 1; an irrelevant passage scores 0
    assert m.alpha_ndcg(["A", "C", "B"], rate, ["A", "B", "C"], rate, 3, 3, 0.5, 3) == 1.0
    assert m.alpha_ndcg(["X"], lambda p, i: 0, ["A"], rate, 3, 3, 0.5, 1) == 0.0


def test_density_hand_computed() -> None:
    # half the coverage of Z* in twice its tokens: ((0.5/200) / (1/100)) ** 0.5 = 0.5
    assert m.density(0.5, 200, 1.0, 100, 0.5) == pytest.approx(0.5)
    assert m.density(1.0, 100, 1.0, 100, 0.5) == 1.0  # Z* itself
    assert m.density(1.0, 50, 1.0, 100, 0.5) == pytest.approx(math.sqrt(2))  # denser than Z*
    assert m.density(0.0, 100, 1.0, 100, 0.5) == 0.0
    assert m.density(0.5, 0, 1.0, 100, 0.5) == 0.0


def test_kendall_tau_b_with_ties() -> None:
    # 5 concordant pairs, none discordant, one pair tied in x only: 5 / sqrt(5 * 6)
    assert m.kendall_tau_b([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(5 / math.sqrt(30))
    assert math.isnan(m.kendall_tau_b([1], [1]))


def test_batched_tau_b_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, (200, 12)).astype(float)  # many ties
    y = rng.integers(0, 4, (200, 12)).astype(float)
    got = m.kendall_tau_b_rows(x, y)
    want = [kendalltau(a, b, variant="b").statistic for a, b in zip(x, y, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    const = m.kendall_tau_b_rows(np.ones((1, 5)), np.arange(5.0)[None, :])
    assert math.isnan(const[0])


def test_binary_kappa_matches_the_project_kappa() -> None:
    from pipeline.metrics.agreement import cohen_kappa

    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.integers(0, 2, 50)
        y = np.where(rng.random(50) < 0.8, x, 1 - x)
        want = cohen_kappa(list(x), list(y), categories=[0, 1])
        assert m.binary_kappa(x, y) == pytest.approx(want)
    assert math.isnan(m.binary_kappa(np.ones(5, dtype=int), np.ones(5, dtype=int)))
