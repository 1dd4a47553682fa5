"""`dvc repro` on a copy of the project: outputs, no-op re-runs, MLflow lineage, adding a model.

Runs the real DVC and the real MLflow store (SQLite under mlruns/) on a small slice of the
released data (one haystack, two summarizers, two settings) so it stays fast.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core import registry
from pipeline.core.lineage import stage_md5
from pipeline.core.records import generation_id
from tests.conftest import make_project, run, slice_crud_rag, slice_crux

pytestmark = pytest.mark.slow

SLICE = {
    "haystacks": ["news1"],
    "systems": ["gpt-4o", "claude3-opus"],
    "settings": ["oracle", "random", "full"],  # oracle and random: two retrievers for CRUX
}


def _edit_params(proj: Path, edit: Any) -> None:
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def _slice(params: dict[str, Any]) -> None:
    params["summhay"]["haystacks"] = SLICE["haystacks"]
    params["summhay"]["lengths"]["haystacks"] = []  # no length study here
    params["models"]["published"]["systems"] = SLICE["systems"]
    params["models"]["published"]["settings"] = SLICE["settings"]
    params["summhay"]["models"] = ["published"]
    params["summhay"]["judges"] = ["published-gpt-4o"]
    params["summhay"]["agreement"]["bootstrap_resamples"] = 50  # intervals: fast, still real
    params["long2rag"]["derived"]["haystacks"] = SLICE["haystacks"]
    params["long2rag"]["derived"]["subtopics"] = 3
    params["long2rag"]["settings"] = ["long_context", "rag_512"]
    params["long2rag"]["models"] = ["l2r-lead"]  # the no-model lead and lexical judge: fast
    params["long2rag"]["judges"] = ["l2r-overlap"]
    params["judges"]["local"]["train"]["haystacks"] = ["news1"]  # a small, real training run
    # CRUX on three queries of news1, its contexts against the released summaries' coverage
    slice_crux(
        params,
        subtopics=3,
        answers=["judgements/summhay/published/published-gpt-4o.jsonl"],
    )
    slice_crud_rag(params)


def _commit(proj: Path, msg: str) -> None:
    run(["git", "add", "-A"], proj)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg], proj)


def _ran(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def _client(proj: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{proj / 'mlruns' / 'mlflow.db'}")


def _runs(proj: Path, current_only: bool = True) -> list[Any]:
    client = _client(proj)
    exp = client.get_experiment_by_name("summhay")
    filt = "tags.`lfbench.current` = 'true'" if current_only else ""
    return list(client.search_runs([exp.experiment_id], filter_string=filt, max_results=1000))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, mirror: Path) -> tuple[Path, str]:
    """One sliced `dvc repro` for the whole module (each test gets its own copy: `repro`)."""
    project = make_project(tmp_path_factory.mktemp("built") / "proj", mirror)
    _edit_params(project, _slice)
    _commit(project, "slice")
    out = run(["dvc", "repro"], project)
    return project, out.stdout + out.stderr


@pytest.fixture
def repro(built: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A copy of the module's repro'd project (git, DVC cache, MLflow store and outputs), so a
    test may change it freely. The MLflow experiments keep their artifact folders under the
    original project: new runs of a copy write their artifacts there, under their own run ids."""
    proj = tmp_path / "proj"
    shutil.copytree(built[0], proj, symlinks=True)
    return proj, built[1]


def test_repro_outputs_and_noop(repro: tuple[Path, str]) -> None:
    proj, log = repro
    assert set(_ran(log)) == {
        "image",
        "local-judge-train",  # always in the DAG; every judge stage depends on its model
        "summhay-construct",
        "summhay-generate@published",
        "summhay-judge@published-published-gpt-4o",
        "summhay-agreement",
        "summhay-results@published",  # the model's rows as soon as its stages are done
        "summhay-aggregate",
        "long2rag-construct",
        "long2rag-generate@l2r-lead",
        "long2rag-judge@l2r-lead-l2r-overlap",
        "long2rag-results@l2r-lead",
        "long2rag-aggregate",
        "crux-construct",
        "crux-generate@crux-contexts",
        "crux-judge@crux-contexts-crux-labels",
        "crux-results@crux-contexts",
        "crux-aggregate",
        "crud_rag-construct",
        "crud_rag-generate@lead",
        "crud_rag-judge@lead-crud-text",
        "crud_rag-results@lead",
        "crud_rag-aggregate",
    }
    l2r = json.loads((proj / "metrics" / "long2rag.json").read_text())["rows"]
    assert {r["setting"] for r in l2r} == {"long_context", "rag_512"}
    assert all(r["n_scored"] + r["n_excluded"] == 3 for r in l2r)
    rows = json.loads((proj / "metrics" / "summhay.json").read_text())["rows"]
    assert len(rows) == 6
    assert {(r["system"], r["setting"]) for r in rows} == {
        (s, t) for s in SLICE["systems"] for t in SLICE["settings"]
    }
    for r in rows:
        # news1 has 9 subtopics and 65 insights
        assert (r["domain"], r["mode"], r["n_scored"], r["n_insights"]) == (
            "news",
            "paper",
            9,
            65,
        )
        assert 0 <= r["joint"] <= r["coverage"] <= 100
    report = (proj / "reports" / "summhay.md").read_text()
    assert "| gpt-4o |" in report and "Table 2 layout" in report

    _check_crux(proj)
    _check_crud_rag(proj)

    status = run(["dvc", "status"], proj).stdout
    assert "Data and pipelines are up to date" in status
    again = run(["dvc", "repro"], proj)
    assert _ran(again.stdout) == []
    assert "Data and pipelines are up to date" in again.stdout


def _check_crud_rag(proj: Path) -> None:
    """CRUD-RAG on three released records: the oracle, the base and one more chunking, each a
    row with its knobs and counts, scored by the text metrics; MLflow runs with their lineage."""
    data = json.loads((proj / "metrics" / "crud_rag.json").read_text())
    rows = {r["setting"]: r for r in data["rows"]}
    assert data["source"] == "released:event_summary"
    assert set(rows) == {"oracle", "bm25-c128-o0-k8", "bm25-c256-o0-k4"}
    assert rows["bm25-c128-o0-k8"]["knob"] == "base" and rows["oracle"]["knob"] == "oracle"
    assert rows["bm25-c256-o0-k4"]["chunk_size"] == 256 and rows["bm25-c256-o0-k4"]["top_k"] == 4
    for r in rows.values():
        assert (r["task"], r["system"], r["judge"]) == ("event_summary", "lead", "crud-text")
        counts = ("n_items", "n_scored", "n_invalid", "n_failed_generations", "n_failed_judgements")
        assert tuple(r[k] for k in counts) == (3, 3, 0, 0, 0)
        assert 0 < r["bleu_bp"] <= r["bleu"] <= 100 and 0 < r["rouge_l"] <= 100
    # each row's mean is that of its items' judgements
    judged = [
        json.loads(line)
        for line in (proj / "judgements/crud_rag/lead/crud-text.jsonl").read_text().splitlines()
    ]
    gens = {
        generation_id(g["item_id"], g["system"], g["setting"], g["sample"]): g
        for g in map(
            json.loads, (proj / "generations/crud_rag/lead.jsonl").read_text().splitlines()
        )
    }
    oracle = [
        float(next(v["label"] for v in j["verdicts"] if v["target_id"] == "rouge_l"))
        for j in judged
        if gens[j["generation_id"]]["setting"] == "oracle"
    ]
    assert rows["oracle"]["rouge_l"] == pytest.approx(100 * sum(oracle) / 3, abs=1e-3)
    assert (proj / "reports" / "crud_rag.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        "| chunk size (top-k co-varied) | 256 / 4 |" in (proj / "reports/crud_rag.md").read_text()
    )
    client = _client(proj)
    exp = client.get_experiment_by_name("crud_rag")
    runs = client.search_runs(
        [exp.experiment_id], filter_string="tags.`lfbench.current` = 'true'", max_results=100
    )
    assert len(runs) == 3
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    for mrun in runs:
        tags = mrun.data.tags
        assert tags["dataset.digest"] == _md5(proj / "datasets" / "crud_rag.jsonl")
        assert tags["dvc.stage"] == "crud_rag-judge@lead-crud-text"
        assert tags["dvc.stage_md5"] == stage_md5(lock[tags["dvc.stage"]])
        row = rows[tags["setting"]]
        assert mrun.data.metrics["bleu"] == pytest.approx(row["bleu"])


def _check_crux(proj: Path) -> None:
    """CRUX on three queries of news1: labels rows for every retriever and cut-off, the Z*
    reference at 100, taus against the released summaries, MLflow runs with their lineage."""
    crux = json.loads((proj / "metrics" / "crux.json").read_text())
    rows = crux["rows"]
    assert crux["source"] == "derived:summhay"
    assert {r["domain"] for r in rows} == {"news"} and {r["judge"] for r in rows} == {"crux-labels"}
    assert {r["retriever"] for r in rows} == {
        "zstar", "oracle", "random", "vector", "longembed", "keywords", "rerank3", "bm25"
    }  # fmt: skip
    assert {r["cutoff"] for r in rows} == {"zstar", "5", "10", "20", "budget"}
    for r in rows:
        assert r["n_scored"] + r["n_excluded"] == 3 and r["n_invalid"] == r["n_unjudged"] == 0
        assert 0 <= r["coverage"] <= 100 and 0 <= r["alpha_ndcg"] <= 100
    ref = next(r for r in rows if (r["retriever"], r["cutoff"]) == ("zstar", "zstar"))
    assert (ref["coverage"], ref["density"]) == (100.0, 100.0)
    taus = {(t["metric"], t["target"], t["level"]): t for t in crux["tau"]}
    t = taus[("coverage", "cov_y", "pipelines")]
    assert (t["n_points"], t["n_queries"], t["answer_judge"]) == (4, 3, "published-gpt-4o")
    assert taus[("coverage", "cov_y", "retrievers")]["n_points"] == 2
    assert ("coverage", "joint", "pipelines") in taus
    assert (proj / "reports" / "crux.png").read_bytes()[:4] == b"\x89PNG"
    assert "![contexts against answers](crux.png)" in (proj / "reports" / "crux.md").read_text()
    client = _client(proj)
    exp = client.get_experiment_by_name("crux")
    runs = client.search_runs(
        [exp.experiment_id], filter_string="tags.`lfbench.current` = 'true'", max_results=1000
    )
    assert len(runs) == len(rows) + 1  # one tau run: news, labels contexts, GPT-4o answers
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    for mrun in runs:
        tags = mrun.data.tags
        assert tags["dataset.digest"] == _md5(proj / "datasets" / "crux.jsonl")
        assert tags["dvc.stage"] == "crux-judge@crux-contexts-crux-labels"
        assert tags["dvc.stage_md5"] == stage_md5(lock[tags["dvc.stage"]])
        assert tags["dvc.construct_stage_md5"] == stage_md5(lock["crux-construct"])
        if tags.get("analysis") != "tau":
            key = (tags["retriever"], tags["cutoff"])
            row = next(r for r in rows if (r["retriever"], r["cutoff"]) == key)
            assert mrun.data.metrics["coverage"] == pytest.approx(row["coverage"])


def test_mlflow_runs_carry_metrics_and_lineage(repro: tuple[Path, str]) -> None:
    proj, _ = repro
    rows = {
        (r["system"], r["setting"]): r
        for r in json.loads((proj / "metrics" / "summhay.json").read_text())["rows"]
    }
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    dataset_md5 = _md5(proj / "datasets" / "summhay.jsonl")
    assert lock["summhay-construct"]["outs"][0]["md5"] == dataset_md5
    data_md5 = yaml.safe_load((proj / "data.dvc").read_text())["outs"][0]["md5"]
    head = run(["git", "rev-parse", "HEAD"], proj).stdout.strip()

    agreement = json.loads((proj / "metrics" / "agreement.json").read_text())["rows"]
    [human] = [r for r in agreement if r["judge"] == "published-gpt-4o"]
    runs = _runs(proj)
    assert len(runs) == 6
    client = _client(proj)
    for mrun in runs:
        tags, metrics = mrun.data.tags, mrun.data.metrics
        row = rows[(tags["model.name"], tags["setting"])]
        for key in (
            "coverage",
            "citation",
            "joint",
            "citation_precision",
            "citation_recall",
            "words_per_bullet",
            "n_insights",
            "n_scored",
        ):
            assert metrics[key] == pytest.approx(row[key])
        assert tags["dataset.digest"] == dataset_md5
        assert tags["data.digest"] == data_md5
        assert tags["judge.name"] == "published-gpt-4o"
        assert tags["judge.prompt_sha"] == "published"
        assert tags["model.prompt_sha"] == "published"
        assert tags["model.entry"] == "published"
        assert tags["git.commit"] == head
        assert tags["git.dirty"] == "false"
        assert tags["dvc.stage"] == "summhay-judge@published-published-gpt-4o"
        assert tags["dvc.stage_md5"] == stage_md5(lock[tags["dvc.stage"]])
        assert tags["dvc.generate_stage_md5"] == stage_md5(lock["summhay-generate@published"])
        assert tags["runtime"] in ("local", "docker")
        assert tags["image.digest"]
        assert tags["benchmark.version"] and tags["lfbench.version"]
        # Item scores are an artifact of the run: one line per scored summary, with its
        # insight-level scores (what `lfbench compare` pairs).
        local = client.download_artifacts(mrun.info.run_id, "items.jsonl")
        lines = [json.loads(x) for x in Path(local).read_text().splitlines()]
        assert len(lines) == row["n_scored"]
        assert (
            sum(len(x["insights"]) for x in lines) == row["n_insights"] + row["n_invalid_insights"]
        )
        assert lines[0]["item_id"].startswith("news1/")
        # The judge's agreement with people rides along with every result it produced.
        assert metrics["judge.kappa_vs_human"] == pytest.approx(human["cohen_kappa"])
        assert tags["judge.kappa_vs_human"] == f"{human['cohen_kappa']:.3f}"


def test_agreement_stage_rows_and_kappa_runs(repro: tuple[Path, str]) -> None:
    """The default repro scores the judges against the 1,419 human labels and logs `kappa`."""
    proj, _ = repro
    rows = json.loads((proj / "metrics" / "agreement.json").read_text())["rows"]
    by_judge = {r["judge"]: r for r in rows if r["reference"] == "human"}
    assert set(by_judge) == {
        "prompted_gpt-4o",
        "prompted_claude3-haiku",
        "prompted_claude3-opus",
        "prompted_gemini-1.5-pro",
        "prompted_gpt3.5",
        "9fs_gpt-4o",
        "published-gpt-4o",
    }
    for r in by_judge.values():
        assert r["n"] == 1419
        assert r["cohen_kappa_ci_low"] < r["cohen_kappa"] < r["cohen_kappa_ci_high"]
        # its judge card: the same kappa and interval (seeded, over the insights), Pearson,
        # linking accuracy; a replayed release's cost and speed were not recorded: unknown
        card = r["card"]
        assert (card["judge"], card["reference"], card["n"]) == (r["judge"], "human", 1419)
        assert card["kappa"] == pytest.approx(r["cohen_kappa"])
        assert card["kappa_ci_low"] == pytest.approx(r["cohen_kappa_ci_low"])
        assert card["kappa_ci_high"] == pytest.approx(r["cohen_kappa_ci_high"])
        assert card["pearson"] == r["pearson"]
        assert card["linking_accuracy"] == r["linking_accuracy"] and card["n_linked"] > 0
        assert (card["cost_status"], card["cost_per_1000"]) == ("unknown", None)
        assert card["throughput_stage"] is None
    assert round(by_judge["prompted_gpt-4o"]["pearson"], 3) == 0.716
    assert by_judge["published-gpt-4o"]["cohen_kappa"] == by_judge["prompted_gpt-4o"]["cohen_kappa"]
    client = _client(proj)
    exp = client.get_experiment_by_name("agreement")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`lfbench.current` = 'true'")
    assert len(runs) == len(rows)
    for mrun in runs:
        row = by_judge[mrun.data.tags["judge.name"]]
        assert mrun.data.metrics["kappa"] == pytest.approx(row["cohen_kappa"])
        assert mrun.data.metrics["pearson"] == pytest.approx(row["pearson"])
        assert mrun.data.metrics["card.kappa"] == pytest.approx(row["card"]["kappa"])
        assert mrun.data.metrics["card.cost_unknown"] == 1.0
        assert mrun.data.tags["labels.digest"] == _md5(
            proj / "data" / "summhay" / "eval_benchmark_data.json"
        )
        assert mrun.data.tags["dvc.stage"] == "summhay-agreement"
        names = {a.path for a in client.list_artifacts(mrun.info.run_id)}
        assert {"row.json", "agreement.png"} <= names
    report = (proj / "reports" / "agreement.md").read_text()
    assert "| prompted_gpt-4o | released predictions | 0.716" in report


def test_rerunning_aggregate_does_not_duplicate_runs(repro: tuple[Path, str]) -> None:
    proj, _ = repro
    before = {r.info.run_id for r in _runs(proj, current_only=False)}
    forced = run(["dvc", "repro", "-f", "summhay-aggregate"], proj)
    assert "mlflow summhay: 0 runs created, 6 unchanged" in forced.stderr
    assert {r.info.run_id for r in _runs(proj, current_only=False)} == before

    # A changed result gets a new run; the old one is kept but no longer current.
    _edit_params(proj, lambda p: p["summhay"]["scoring"].update(partial_credit=25))
    changed = run(["dvc", "repro"], proj)
    # CRUX compares its contexts with SummHay's Joint: its aggregate follows
    # (through its results stage, which reads SummHay's released answers)
    assert _ran(changed.stdout) == [
        "summhay-results@published",
        "summhay-aggregate",
        "crux-results@crux-contexts",
        "crux-aggregate",
    ]
    current = _runs(proj)
    assert len(current) == 6 and not ({r.info.run_id for r in current} & before)
    assert len(_runs(proj, current_only=False)) == 12


def test_adding_a_model_runs_only_its_stages(repro: tuple[Path, str]) -> None:
    proj, _ = repro

    def add(params: dict[str, Any]) -> None:
        params["models"]["gemini-oracle"] = {
            "provider": "published",
            "systems": ["gemini-1.5-pro"],
            "settings": ["oracle"],
        }
        params["summhay"]["models"].append("gemini-oracle")

    _edit_params(proj, add)
    out = run(["dvc", "repro"], proj)
    assert sorted(_ran(out.stdout)) == [
        "crux-aggregate",  # a new released system's coverage: CRUX correlates with it
        "crux-results@crux-contexts",
        "summhay-aggregate",
        # not summhay-agreement: it reads the human-labelled systems' judgements only
        # (construction reads no model entry: the model's own stage checks its settings)
        "summhay-generate@gemini-oracle",
        "summhay-judge@gemini-oracle-published-gpt-4o",
        "summhay-results@gemini-oracle",  # and not summhay-results@published
    ]
    rows = json.loads((proj / "metrics" / "summhay.json").read_text())["rows"]
    assert len(rows) == 7
    [new] = [r for r in rows if r["model"] == "gemini-oracle"]
    assert (new["system"], new["setting"]) == ("gemini-1.5-pro", "oracle")


def test_malformed_haystack_stops_construct_with_a_named_error(project: Path) -> None:
    """A haystack file that does not parse as one (outside data/: a file of data/ that is not
    the pinned one is refused before it is read, tests/data/test_verify.py)."""
    shutil.copytree(project / "data" / "summhay", project / "mine" / "summhay")
    path = project / "mine" / "summhay" / "topic_news2.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["subtopics"][3]["insights"][1]["insight"]
    path.write_text(json.dumps(data), encoding="utf-8")
    proc = run(
        [
            "lfbench",
            "stage",
            "construct",
            "--benchmark",
            "summhay",
            "--data",
            "mine/summhay",
            "--out",
            "datasets/summhay.jsonl",
        ],
        project,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    sid = data["subtopics"][3]["subtopic_id"]
    assert (
        f"error: file mine/summhay/topic_news2.json, item subtopic '{sid}' (subtopics[3]), "
        "field insights[1].insight: Field required"
    ) in proc.stderr
    assert not (project / "datasets" / "summhay.jsonl").exists()


def test_colleague_pulls_and_gets_the_same_numbers_without_rerunning(
    repro: tuple[Path, str], tmp_path: Path
) -> None:
    """Share through a DVC remote: push, clone, pull, repro -> nothing runs, same metrics."""
    proj, _ = repro
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-d", "store", str(remote)], proj)
    _commit(proj, "results")
    run(["dvc", "push"], proj)

    colleague = tmp_path / "colleague"
    run(["git", "clone", "-q", str(proj), str(colleague)], tmp_path)
    run(["dvc", "pull"], colleague)
    assert "Data and pipelines are up to date" in run(["dvc", "status"], colleague).stdout
    again = run(["dvc", "repro"], colleague)
    assert _ran(again.stdout) == []
    for rel in (
        "metrics/summhay.json",
        "reports/summhay.md",
        "judgements/summhay/published/published-gpt-4o.jsonl",
    ):
        assert (colleague / rel).read_bytes() == (proj / rel).read_bytes()
    # Their MLflow store is filled from the pulled outputs, no stage re-run.
    tracked = run(["lfbench", "track", "summhay"], colleague)
    assert "mlflow summhay: 6 runs created" in tracked.stderr
    assert len(_runs(colleague)) == 6


def test_dvc_plots_show_the_headline_figures(repro: tuple[Path, str]) -> None:
    """`dvc plots show` renders dvc.yaml's plots from the repro's outputs: every judge's kappa
    (the agreement file's rows) and the report images, byte for byte."""
    proj, _ = repro
    shown = json.loads(run(["dvc", "plots", "show", "--json"], proj).stdout)
    assert not shown.get("errors"), shown.get("errors")
    data = shown["data"]
    (agreement,) = data["judge agreement"]
    values = agreement["content"]["data"]["values"]
    rows = json.loads((proj / "metrics" / "agreement.json").read_text())["rows"]
    assert [(v["judge"], v["cohen_kappa"]) for v in values] == [
        (r["judge"], r["cohen_kappa"]) for r in rows
    ]
    assert agreement["content"]["encoding"]["y"]["type"] == "nominal"  # the project's template
    # each benchmark's headline number: one point per result row, named as its MLflow run
    for plot, bench, metric in (
        ("summhay joint", "summhay", "joint"),
        ("long2rag kpr", "long2rag", "kpr"),
        ("crux coverage", "crux", "coverage"),
        ("crud_rag rouge_l", "crud_rag", "rouge_l"),
    ):
        (shown_plot,) = data[plot]
        got = sorted(v[metric] for v in shown_plot["content"]["data"]["values"])
        rows = json.loads((proj / "metrics" / f"{bench}.json").read_text())["rows"]
        want = sorted(r[metric] for r in rows if r.get(metric) is not None)
        assert got and got == pytest.approx(want), plot
    for png in ("summhay_length", "agreement", "crux", "crud_rag"):
        (img,) = data[f"reports/{png}.png"]
        assert img["type"] == "image"
        assert Path(img["url"]).read_bytes() == (proj / "reports" / f"{png}.png").read_bytes()


def _current_ids(proj: Path, experiment: str) -> dict[str, str]:
    """row key -> run id of the experiment's current runs."""
    client = _client(proj)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs(
        [exp.experiment_id], filter_string="tags.`lfbench.current` = 'true'", max_results=1000
    )
    return {r.data.tags["lfbench.row_key"]: r.info.run_id for r in runs}


def _rows_by_key(proj: Path, benchmark: str) -> dict[tuple[str, ...], dict[str, Any]]:
    rows = json.loads((proj / "metrics" / f"{benchmark}.json").read_text())["rows"]
    ident = ("domain", "collection", "mode", "system", "setting", "judge", "model")
    return {tuple(str(r.get(k)) for k in ident): r for r in rows}


def test_own_models_on_their_own_slices(repro: tuple[Path, str]) -> None:
    """Issue 25, as a user would: two models behind an OpenAI-compatible server, each on its own
    slice (one SummHay subtopic, two Long²RAG questions), beside the published and baseline rows;
    then one model's temperature changed, then one removed."""
    from pipeline.testing.server import TestServer

    proj, _ = repro
    before = {b: _rows_by_key(proj, b) for b in ("summhay", "long2rag")}
    ids_before = {b: _current_ids(proj, b) for b in ("summhay", "long2rag")}
    with TestServer(log_path=proj / "server.log", cwd=proj) as srv:

        def add(params: dict[str, Any]) -> None:
            for name in ("mine-a", "mine-b"):
                params["models"][name] = {
                    "provider": "openai",
                    "base_url": srv.base_url,
                    "model": name,
                    "api_key_env": None,
                    "settings": ["oracle"],
                    "max_tokens": 64,
                    "slice": {
                        "summhay": {"items": ["news1"], "first": 1},
                        "long2rag": {"first": 2},
                    },
                }
                params["summhay"]["models"].append(name)
                params["long2rag"]["models"].append(name)
            params["summhay"]["judges"].append("local")  # judges any model, offline

        _edit_params(proj, add)
        # the spend preview counts each model's own slice, as its generate stage sends it
        plan = json.loads(run(["lfbench", "plan", "--json"], proj).stdout)
        out = run(["dvc", "repro"], proj)
        ran = set(_ran(out.stdout))
        assert "summhay-construct" not in ran and "long2rag-construct" not in ran
        # (published's results stage runs: its rows gain the new local judge's)
        assert {s for s in ran if "@published" in s and "local" not in s} == {
            "summhay-results@published"
        }
        assert not {s for s in ran if "l2r-lead" in s}
        # one subtopic x 1 setting per model on SummHay; 2 questions x 2 settings on Long²RAG
        sent = srv.log()
        assert len(sent) == 2 * (1 + 2 * 2)
        assert plan["totals"]["requests"] == len(sent)
        after = {b: _rows_by_key(proj, b) for b in ("summhay", "long2rag")}
        ids_after = {b: _current_ids(proj, b) for b in ("summhay", "long2rag")}
        for b in ("summhay", "long2rag"):
            for key, row in before[b].items():
                assert after[b][key] == row, f"{b} row {key} changed"
            # every run of before is still current, with the same id
            assert ids_before[b].items() <= ids_after[b].items()
        mine = [r for r in after["summhay"].values() if r["model"] == "mine-a"]
        assert mine and all(r["n_items"] == 1 and r["slice"] == "news1 first 1" for r in mine)
        l2r = [r for r in after["long2rag"].values() if r["model"] == "mine-b"]
        assert l2r and all(r["n_items"] == 2 and r["slice"] == "first 2" for r in l2r)

        # compare by name, on both benchmarks: too few paired items to test anything
        for bench, extra in (("summhay", ["--judge", "local"]), ("long2rag", [])):
            res = json.loads(
                run(
                    ["lfbench", "compare", "--benchmark", bench, "mine-a", "mine-b", "--json",
                     "--setting", "oracle" if bench == "summhay" else "long_context", *extra],
                    proj,
                ).stdout
            )  # fmt: skip
            assert res["n_shared_items"] >= 1 and "too few" in res["note"]
            assert not any(m.get("significant") for m in res["metrics"].values())

        # one model's temperature: only its stages run, only its runs are new
        def warmer(params: dict[str, Any]) -> None:
            params["models"]["mine-a"]["temperature"] = 0.7

        _edit_params(proj, warmer)
        ids_mid = {b: _current_ids(proj, b) for b in ("summhay", "long2rag")}
        out = run(["dvc", "repro"], proj)
        ran = set(_ran(out.stdout))
        model_stages = {s for s in ran if s.split("@")[0].endswith(("-generate", "-judge"))}
        # its generate stages re-run; its judges only if the answers changed (the test server
        # ignores temperature: DVC sees the same generations and skips them)
        assert {"summhay-generate@mine-a", "long2rag-generate@mine-a"} <= model_stages
        assert all("@mine-a" in s for s in model_stages), model_stages
        for b in ("summhay", "long2rag"):
            now = _current_ids(proj, b)
            changed = {k for k in now if ids_mid[b].get(k) != now[k]}
            assert changed and all("mine-a" in k for k in changed), changed

    # remove a model: its rows are no longer current
    def remove(params: dict[str, Any]) -> None:
        for b in ("summhay", "long2rag"):
            params[b]["models"].remove("mine-b")
        del params["models"]["mine-b"]

    _edit_params(proj, remove)
    run(["dvc", "repro"], proj)
    for b in ("summhay", "long2rag"):
        assert not [k for k in _current_ids(proj, b) if "mine-b" in k]
        assert not [r for r in _rows_by_key(proj, b).values() if r["model"] == "mine-b"]


def _run_of(proj: Path, experiment: str, **params: str) -> tuple[str, dict[str, Any]]:
    """The id and metrics of the one current run of the experiment with these params."""
    client = _client(proj)
    exp = client.get_experiment_by_name(experiment)
    filt = " and ".join(
        ["tags.`lfbench.current` = 'true'", *(f"params.{k} = '{v}'" for k, v in params.items())]
    )
    (r,) = client.search_runs([exp.experiment_id], filter_string=filt)
    return str(r.info.run_id), dict(r.data.metrics)


@pytest.mark.parametrize(
    ("bench", "a", "b", "main"),
    [
        ("long2rag", {"setting": "long_context"}, {"setting": "rag_512"}, "kpr"),
        ("crux", {"setting": "oracle@zstar"}, {"setting": "random@zstar"}, "coverage"),
        (
            "crud_rag",
            {"setting": "bm25-c128-o0-k8"},
            {"setting": "bm25-c256-o0-k4"},
            "rouge_l",
        ),
    ],
)
def test_compare_on_every_benchmark(
    repro: tuple[Path, str], bench: str, a: dict[str, str], b: dict[str, str], main: str
) -> None:
    """Issue 24: `lfbench compare` pairs the items of two rows of any benchmark; the point
    estimate is the difference of the rows; a run against itself differs by 0; the slice's three
    items are too few for the default minimum of 10."""
    proj, _ = repro
    (ida, ma), (idb, mb) = _run_of(proj, bench, **a), _run_of(proj, bench, **b)
    res = json.loads(
        run(["lfbench", "compare", ida, idb, "--json", "--min-items", "2"], proj).stdout
    )
    got = res["metrics"][main]
    assert res["n_shared_items"] == 3 and got["n_items"] == 3
    if bench == "long2rag":  # read by a child of the warm sync server, or here: the same answer
        here = run(
            ["lfbench", "compare", ida, idb, "--json", "--min-items", "2"],
            proj,
            env={"LFBENCH_WARM_SYNC": "0"},
        )
        assert json.loads(here.stdout) == res
    # the rows hold the pooled values rounded to the metric's declared digits (CRUD-RAG: 4)
    digits = next(m.digits for m in registry.get(bench).metrics if m.name == main)
    tol = 1e-6 if digits is None else 10.0**-digits
    assert got["paired_delta"] == pytest.approx(mb[main] - ma[main], abs=tol)
    assert got["ci_low"] <= got["paired_delta"] <= got["ci_high"]
    same = json.loads(
        run(["lfbench", "compare", ida, ida, "--json", "--min-items", "2"], proj).stdout
    )
    assert same["metrics"][main]["paired_delta"] == 0
    assert not any(m.get("significant") for m in same["metrics"].values())
    refused = json.loads(run(["lfbench", "compare", ida, idb, "--json"], proj).stdout)
    assert "too few" in refused["note"] and "ci_low" not in refused["metrics"][main]
