"""SummHay judge validation: the paper's Table 1 from the released labels, hand-computed cases,
and the errors a malformed labels file gets."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.summhay import paper_tables as paper
from pipeline.benchmarks.summhay.agreement import (
    Label,
    Pair,
    bias,
    compare,
    human_pair,
    judge_pairs,
    parse_labels,
    published_judges,
    published_predictions,
)
from pipeline.core.errors import DataError
from pipeline.stages.common import FileInputs


def load_labels(path: Path) -> list[Any]:
    """The labels file read as the agreement stage reads it."""
    return parse_labels(FileInputs(Path("/")).json(str(path)), str(path))


@pytest.fixture(scope="module")
def released(mirror: Path) -> list[Any]:
    return load_labels(mirror / "summhay" / "eval_benchmark_data.json")


def test_table1_is_reproduced_for_the_six_published_judges(released: list[Any]) -> None:
    assert len(released) == 200
    assert sum(len(s.insights) for s in released) == 1419
    assert published_judges(released) == sorted(paper.TABLE1)
    for judge, (corr, link) in paper.TABLE1.items():
        row = compare(human_pair(released, published_predictions(released, judge)), 0)
        assert row["n"] == 1419
        assert round(row["pearson"], 3) == corr, judge
        assert round(row["linking_accuracy"], 1) == link, judge
    # Claude 3 Haiku sometimes names several bullets at once: those link to no single bullet.
    haiku = compare(
        human_pair(released, published_predictions(released, "prompted_claude3-haiku")), 0
    )
    assert haiku["n_multi_link"] == 47


def test_table4_cells_that_the_release_pins_down(released: list[Any]) -> None:
    """Three summarizers' deltas match the paper for all three judges (see the report's note)."""
    for j, judge in enumerate(paper.TABLE4_JUDGES):
        got = bias(released, published_predictions(released, judge))["delta_by_summarizer"]
        for summarizer in ("claude3-sonnet", "command-r-plus", "gpt3.5"):
            assert round(got[summarizer], 3) == paper.TABLE4_DELTA[summarizer][j]


F, P, N = Label("FULL", 1), Label("PARTIAL", 2), Label("NO", None)


def test_compare_by_hand() -> None:
    # judge vs reference on 6 insights
    judge = [F, P, N, Label("FULL", 3), Label("PARTIAL", None, multi_link=True), N]
    ref = [F, Label("FULL", 2), N, Label("PARTIAL", 1), Label("FULL", 4), Label("PARTIAL", 1)]
    row = compare(Pair(judge, ref), n_resamples=0)
    # classes (0 no, 1 partial, 2 full): judge 2,1,0,2,1,0 ref 2,2,0,1,2,1
    # p_o = 2/6; marginals judge (2,2,2) ref (1,2,3): p_e = (2*1 + 2*2 + 2*3)/36 = 1/3 -> 0
    assert row["cohen_kappa"] == pytest.approx(0.0)
    assert row["exact_agreement"] == pytest.approx(2 / 6)
    # linking: reference links on 5 insights; judge multi-link on one (left out), no link on
    # one (the 6th); of the other 3, bullets 1=1, 2=2, 3!=1 -> 2/3
    assert row["n_linked"] == 3 and row["n_multi_link"] == 1
    assert row["linking_accuracy"] == pytest.approx(200 / 3)
    assert row["coverage_judge"] == pytest.approx(50.0)
    assert row["coverage_reference"] == pytest.approx(100 * 4 / 6)  # 1+1+0+.5+1+.5
    assert row["pearson_ci_low"] is None  # no resamples asked


def test_judge_pairs_align_on_shared_insights_and_count_invalid() -> None:
    a = {("g1", "i1"): F, ("g1", "i2"): N, ("g2", "i1"): None, ("g3", "i9"): F}
    b = {("g1", "i1"): F, ("g1", "i2"): P, ("g2", "i1"): F}
    [(x, y, pair)] = judge_pairs({"a": a, "b": b})
    assert (x, y) == ("a", "b")
    assert pair.judge == [F, N] and pair.reference == [F, P] and pair.n_invalid == 1


# ---------------------------------------------------------------- malformed labels

SAMPLE: dict[str, Any] = {
    "topic_fn": None,
    "subtopic_id": "s1",
    "summkey": "summary_subtopic_oracle_sysA",
    "summary": ["Title", "* one [1]", "* two [2]"],
    "reference_insights": [
        {"insight_id": "i1", "insight": "One."},
        {"insight_id": "i2", "insight": "Two."},
    ],
    "annotation": [
        {"insight_id": "i1", "coverage": "fully_covered", "candidate_id": "1"},
        {"insight_id": "i2", "coverage": "not_covered", "candidate_id": "no_selection"},
    ],
    "predictions_judgeA": [
        {"insight_id": "i1", "coverage": "FULL_COVERAGE", "bullet_id": 2},
        {"insight_id": "i2", "coverage": "NO_COVERAGE", "bullet_id": "NA"},
    ],
}


def _write(tmp_path: Path, samples: list[dict[str, Any]]) -> Path:
    path = tmp_path / "labels.json"
    path.write_text(json.dumps(samples), encoding="utf-8")
    return path


def test_a_well_formed_file_loads(tmp_path: Path) -> None:
    [s] = load_labels(_write(tmp_path, [SAMPLE]))
    assert s.human["i1"] == Label("FULL", 2)  # 0-based candidate 1 is bullet 2
    assert s.predictions["judgeA"]["i1"] == Label("FULL", 2)
    row = compare(human_pair([s], published_predictions([s], "judgeA")), 0)
    assert row["linking_accuracy"] == 100.0 and row["exact_agreement"] == 1.0


def _broken(edit: Any) -> list[dict[str, Any]]:
    good = copy.deepcopy(SAMPLE)
    bad = copy.deepcopy(SAMPLE)
    bad["subtopic_id"] = "s2"
    edit(bad)
    return [good, bad]


@pytest.mark.parametrize(
    ("edit", "field", "message"),
    [
        (lambda s: s["annotation"][1].pop("coverage"), "annotation[1].coverage", "missing field"),
        (
            lambda s: s["annotation"][0].update(coverage="mostly_covered"),
            "annotation[0].coverage",
            "unknown label 'mostly_covered'",
        ),
        (
            lambda s: s["predictions_judgeA"][1].update(coverage="COVERED"),
            "predictions_judgeA[1].coverage",
            "unknown label 'COVERED'",
        ),
        (
            lambda s: s["annotation"][1].update(insight_id="i7"),
            "annotation[1].insight_id",
            "not among the sample's reference_insights",
        ),
        (
            lambda s: s["predictions_judgeA"][0].update(insight_id="zz"),
            "predictions_judgeA[0].insight_id",
            "not among the sample's reference_insights",
        ),
        (lambda s: s["annotation"].pop(), "annotation", "have no annotation"),
        (
            lambda s: s["annotation"][0].update(candidate_id="7"),
            "annotation[0].candidate_id",
            "0-based bullet index (0..2)",
        ),
        (lambda s: s.pop("summary"), "summary", "missing field"),
        (
            lambda s: s["reference_insights"][1].pop("insight"),
            "reference_insights[1].insight",
            "missing field",
        ),
    ],
)
def test_malformed_labels_name_the_sample_and_field(
    tmp_path: Path, edit: Any, field: str, message: str
) -> None:
    path = _write(tmp_path, _broken(edit))
    with pytest.raises(DataError) as err:
        load_labels(path)
    assert err.value.file == str(path)
    assert err.value.item == "sample 1 (s2, summary_subtopic_oracle_sysA)"
    assert err.value.field == field
    assert message in err.value.reason


def test_labels_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_labels(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match="not valid JSON"):
        load_labels(bad)
    other = copy.deepcopy(SAMPLE)
    other["subtopic_id"] = "s3"
    other["predictions_judgeB"] = other.pop("predictions_judgeA")
    with pytest.raises(DataError, match="different judges' predictions: judgeA, judgeB"):
        load_labels(_write(tmp_path, [SAMPLE, other]))


def _params_with(judges: dict[str, Any]) -> Any:
    from pipeline.core.config import load_yaml
    from pipeline.core.params import validate_params

    raw = load_yaml(Path(__file__).resolve().parents[3] / "params.yaml")
    raw["judges"] = judges
    raw["summhay"]["judges"] = list(judges)
    raw["summhay"]["models"] = ["published"]
    del raw["long2rag"]
    raw["summhay"]["agreement"] = {"bootstrap_resamples": 0, "judge_vs_judge": False}
    return validate_params(raw, benchmarks=["summhay"])


def test_a_replayed_judge_is_rated_by_its_proxy(mirror: Path, tmp_path: Path) -> None:
    """published-gpt-4o cannot score the annotated summaries; its row is that of the released
    predictions its `agreement_proxy` names, and a proxy the file lacks is an error."""
    from pipeline.core import registry
    from pipeline.stages.agreement import agreement

    def run(params: Any, labels: Path, out: Path) -> list[dict[str, Any]]:
        bench = registry.get("summhay")
        return agreement(bench, params, labels, out, root=Path.cwd(), track=False)

    labels = mirror / "summhay" / "eval_benchmark_data.json"
    spec = {"provider": "published", "benchmark": "summhay", "agreement_proxy": "prompted_gpt-4o"}
    rows = run(_params_with({"pub": spec}), labels, tmp_path / "a.json")
    by_judge = {r["judge"]: r for r in rows}
    mine, released = by_judge["pub"], by_judge["prompted_gpt-4o"]
    assert mine["cohen_kappa"] == released["cohen_kappa"] and mine["n"] == 1419
    assert round(mine["pearson"], 3) == paper.TABLE1["prompted_gpt-4o"][0]
    assert "prompted_gpt-4o" in mine["source"]
    bad = {**spec, "agreement_proxy": "prompted_gpt-5"}
    with pytest.raises(DataError, match="prompted_gpt-5"):
        run(_params_with({"pub": bad}), labels, tmp_path / "b.json")
