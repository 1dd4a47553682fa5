"""The judge card (pipeline/core/cards.py) on cases computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.benchmarks.summhay.agreement import Label, Pair, compare, judge_card
from pipeline.core.benchmark import JudgeInfo
from pipeline.core.cards import card, card_metrics, cost_per_1000
from pipeline.core.errors import DataError
from pipeline.metrics.agreement import kappa_interval
from pipeline.stages.timing import (
    per_second,
    read_throughput,
    throughput,
    timing_path,
    write_throughput,
)

# 10 pairs: 4 both yes, 4 both no, 1 judge yes / reference no, 1 judge no / reference yes.
# p_o = 0.8; each rater says yes 5 times in 10, so p_e = 0.5 * 0.5 + 0.5 * 0.5 = 0.5;
# kappa = (0.8 - 0.5) / (1 - 0.5) = 0.6.
JUDGE = ["y"] * 4 + ["n"] * 4 + ["y", "n"]
REFERENCE = ["y"] * 4 + ["n"] * 4 + ["n", "y"]


def test_kappa_by_hand_and_its_seeded_interval_brackets_it() -> None:
    k, lo, hi = kappa_interval(JUDGE * 5, REFERENCE * 5, ["n", "y"], n_resamples=400, seed=7)
    assert k == pytest.approx(0.6)
    assert lo is not None and hi is not None
    assert lo < 0.6 < hi and hi - lo < 0.6
    assert kappa_interval(JUDGE * 5, REFERENCE * 5, ["n", "y"], n_resamples=400, seed=7) == (
        k,
        lo,
        hi,
    )
    assert kappa_interval(JUDGE * 5, REFERENCE * 5, ["n", "y"], n_resamples=400, seed=8) != (
        k,
        lo,
        hi,
    )
    # no resamples: the point, no interval; a single category: undefined, not 0 or 1
    assert kappa_interval(JUDGE, REFERENCE, ["n", "y"], n_resamples=0, seed=0)[1:] == (None, None)
    assert kappa_interval(["y"] * 3, ["y"] * 3, ["n", "y"], n_resamples=0, seed=0)[0] is None


def test_cost_per_1000_from_known_usage() -> None:
    assert cost_per_1000(0.03, 1500) == (
        "measured",
        pytest.approx(0.02),
        "recorded cost of the calls",
    )
    assert cost_per_1000(None, 1500)[:2] == ("unknown", None)
    assert cost_per_1000(0.0, 1500, free=True)[:2] == ("free", 0.0)


def test_throughput_from_a_known_wall_time(tmp_path: Path) -> None:
    assert per_second(300, 12.0) == 25.0
    assert per_second(300, None) is None and per_second(0, 3.0) is None
    t = throughput("local", "summhay-agreement", 300, 12.0, "loading and judging")
    assert t.judgements_per_second == 25.0
    write_throughput(tmp_path, "summhay-agreement", [t])
    assert read_throughput(tmp_path, "summhay-agreement") == {"local": t}
    assert read_throughput(tmp_path, "crux-judge@m-local") == {}  # not run here: nothing
    path = timing_path(tmp_path, "summhay-agreement")
    raw = json.loads(path.read_text())
    del raw["judges"][0]["wall_s"]
    path.write_text(json.dumps(raw))
    with pytest.raises(DataError, match=r"summhay-agreement\.json.*judges\[0\].*wall_s"):
        read_throughput(tmp_path, "summhay-agreement")


def test_summhay_card_linking_kappa_and_cost_by_hand() -> None:
    """Four insights. Linking: the people chose a bullet on the first three; the judge chose
    bullet 1 (right), bullet 2 (people: 1, wrong) and none (left out): 1 of 2 = 50%. Classes
    all agree: kappa 1. Cost: $0.006 over 4 verdicts = $1.50 per 1,000."""
    judge = [Label("FULL", 1), Label("FULL", 2), Label("PARTIAL", None), Label("NO", None)]
    people = [Label("FULL", 1), Label("FULL", 1), Label("PARTIAL", 3), Label("NO", None)]
    pair = Pair(judge, people)
    row = compare(pair, n_resamples=0)
    info = JudgeInfo("judged by lfbench", "openai", "sha", 0.006, n_judgements=4)
    c = judge_card("j", pair, row, info, 0, 0)
    assert (c.linking_accuracy, c.n_linked) == (50.0, 2)
    assert c.kappa == 1.0 and c.n == 4 and c.reference == "human"
    assert c.cost_status == "measured" and c.cost_per_1000 == pytest.approx(1.5)
    blind = judge_card("j", pair, row, JudgeInfo("x", "openai", "s", 0.0, 4, usage_missing=1), 0, 0)
    assert blind.cost_status == "unknown" and blind.cost_per_1000 is None
    assert "without token usage" in blind.cost_note
    released = judge_card("j", pair, row, JudgeInfo("released", "released", "released"), 0, 0)
    assert released.cost_status == "unknown" and released.throughput_stage is None
    local = JudgeInfo(
        "x", "local", "s", n_judgements=4, free=True, timing_stage="summhay-agreement"
    )
    free = judge_card("j", pair, row, local, 0, 0)
    assert (free.cost_status, free.cost_per_1000) == ("free", 0.0)
    assert free.throughput_stage == "summhay-agreement"
    assert card_metrics(free)["card.kappa"] == 1.0 and "card.cost_unknown" not in card_metrics(free)
    assert "card.cost_unknown" in card_metrics(blind)


def test_a_card_refuses_unpaired_labels() -> None:
    with pytest.raises(ValueError, match="3 labels against 2"):
        card(
            judge="j",
            reference="human",
            unit="u",
            judge_labels=["y", "n", "y"],
            reference_labels=["y", "n"],
            categories=["n", "y"],
            kappa_kind="k",
            pearson=None,
            n_resamples=0,
            seed=0,
            cost=cost_per_1000(None, 0),
            throughput_stage=None,
        )
