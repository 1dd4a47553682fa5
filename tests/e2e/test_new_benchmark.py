"""A new benchmark from the template, end to end: `lfbench new-benchmark toy --local-judge`
touches only its package, its tests, params.yaml and dvc.yaml; `lfbench check` finds its stages'
code dependencies complete; `dvc repro toy-aggregate` constructs, generates (a baseline, and a
model behind the test server), judges (an LLM judge through the test server, and the local judge)
and aggregates, with one MLflow run per row. The LLM judge's recall is recomputed here from the
scripted verdicts. Without the local judge, a fresh scaffold runs with no edit at all and no
dependency on the local judge (nor on data/), and its scaffolded test passes."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import ROOT, run
from tests.e2e.template_responder import verdict

pytestmark = pytest.mark.slow


@pytest.fixture
def project(shared_project: Path) -> Path:
    """This module's projects share the session's DVC cache (`conftest.share_dvc_cache`): the
    stages every sliced DAG holds run once, not in each test."""
    return shared_project


def _status(proj: Path) -> list[str]:
    out = run(["git", "status", "--porcelain", "--untracked-files=normal"], proj).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_benchmark_from_the_template_runs_end_to_end(project: Path, tmp_path: Path) -> None:
    # The copy's own code runs (the new package is there, not in this checkout).
    env = {"PYTHONPATH": str(project)}
    out = run(["lfbench", "new-benchmark", "toy", "--local-judge"], project, env).stdout
    assert "created pipeline/benchmarks/toy/" in out
    assert _status(project) == [
        " M dvc.yaml",
        " M params.yaml",
        "?? inputs/toy/",
        "?? pipeline/benchmarks/toy/",
        "?? retrievals/lineage/toy/",
        "?? retrievals/toy/",
        "?? tests/benchmarks/toy/",
    ]
    assert (
        "every stage depends on the code it runs" in run(["lfbench", "check"], project, env).stdout
    )
    with TestServer(
        responder="tests.e2e.template_responder:respond", log_path=tmp_path / "s.log", cwd=ROOT
    ) as srv:
        path = project / "params.yaml"
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
        endpoint = {"provider": "openai", "base_url": srv.base_url, "api_key_env": None}
        params["runtime"] = "local"
        params["models"]["toy-llm"] = {**endpoint, "model": "tiny"}
        # the baseline `lead` too (an LLM judge judges the models with calls unless asked)
        params["judges"]["toy-judge"] = {**endpoint, "model": "tiny-judge", "models": "all"}
        params["judges"]["local"]["train"]["haystacks"] = ["news1"]  # a small training run
        params["toy"]["models"] = ["lead", "toy-llm"]
        params["toy"]["judges"] = ["toy-judge", "local"]
        path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        run(["dvc", "repro", "toy-aggregate"], project, env)
        n_calls = len(srv.log())
    # 3 answers from the model, then one call per (answer, fact): 8 facts x 2 systems
    assert n_calls == 3 + 2 * 8
    dataset = {r["item_id"]: r for r in _jsonl(project / "datasets" / "toy.jsonl")}
    rows = {
        (r["system"], r["judge"]): r
        for r in json.loads((project / "metrics/toy.json").read_text())["rows"]
    }
    assert set(rows) == {(s, j) for s in ("lead", "toy-llm") for j in ("toy-judge", "local")}
    score = {"yes": 1.0, "partial": 0.5, "no": 0.0}
    for system in ("lead", "toy-llm"):
        gens = _jsonl(project / "generations" / "toy" / f"{system}.jsonl")
        expected = fmean(
            fmean(score[verdict(g["text"], f["text"])] for f in dataset[g["item_id"]]["facts"])
            for g in gens
        )
        row = rows[(system, "toy-judge")]
        assert row["recall"] == pytest.approx(expected, abs=1e-6)
        assert row["n_items"] == row["n_scored"] == 3 and row["n_invalid"] == 0
        local = rows[(system, "local")]
        assert local["n_scored"] == 3 and 0.0 <= local["recall"] <= 1.0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("toy")
    runs = client.search_runs([exp.experiment_id], "tags.`lfbench.current` = 'true'")
    assert len(runs) == 4
    for r in runs:
        assert r.data.tags["benchmark"] == "toy" and r.data.tags["dvc.stage"].startswith(
            "toy-judge@"
        )
        assert r.data.metrics["recall"] == pytest.approx(
            rows[(r.data.tags["model.name"], r.data.tags["judge.name"])]["recall"]
        )
    # no source file outside the package but params.yaml and dvc.yaml (DVC writes its lock,
    # the outputs and the .gitignore files beside them)
    status = _status(project)
    outputs = (
        "datasets/", "generations/", "judgements/", "results/", "metrics/", "reports/", "dvc.lock",
    )  # fmt: skip
    modified = [line[3:] for line in status if line.startswith(" M")]
    assert [m for m in modified if not m.endswith(".gitignore") and not m.startswith(outputs)] == [
        "dvc.yaml",
        "params.yaml",
    ]
    untracked = [line[3:] for line in status if line.startswith("??")]
    assert [u for u in untracked if not u.startswith(outputs)] == [
        "inputs/toy/",
        "pipeline/benchmarks/toy/",
        "retrievals/lineage/toy/",
        "retrievals/toy/",
        "tests/benchmarks/toy/",
    ]
    # its plot (dvc.yaml's `toy recall`): the main metric of each result run
    points = json.loads((project / "reports" / "toy.points.json").read_text())["points"]
    by_run = {r.info.run_name: r.data.metrics["recall"] for r in runs}
    assert {p["run"]: p["recall"] for p in points} == pytest.approx(by_run)
    assert " passed" in run(["pytest", "-q", "-p", "no:cacheprovider", "tests/benchmarks/toy"],
                            project, env).stdout  # fmt: skip


def test_a_fresh_scaffold_runs_with_no_edit_and_no_local_judge(project: Path) -> None:
    """The issue-35 case: the stage snippet made every judge stage depend on the local judge's
    model (SummHay's data and training), so a benchmark without it did not run. data/ is
    removed here: nothing of the new benchmark may need it."""
    import shutil

    env = {"PYTHONPATH": str(project)}
    run(["lfbench", "new-benchmark", "bare"], project, env)
    shutil.rmtree(project / "data")
    assert (
        "every stage depends on the code it runs" in run(["lfbench", "check"], project, env).stdout
    )
    out = run(["dvc", "repro", "bare-aggregate"], project, env)
    assert "local-judge-train" not in out.stdout + out.stderr
    assert not (project / "models" / "local-judge" / "model.json").exists()
    rows = json.loads((project / "metrics" / "bare.json").read_text())["rows"]
    assert {(r["system"], r["judge"]) for r in rows} == {
        ("lead", "bare-match"),
        ("extractive", "bare-match"),
    }
    for r in rows:
        assert r["n_items"] == 3 and r["n_scored"] == 3 and 0.0 < r["recall"] <= 1.0
    # Its test runs under a plain pytest too, without the xdist plugin `make test` uses.
    plain = ["-p", "no:cacheprovider", "-p", "no:xdist"]
    assert "2 passed" in run(["pytest", "-q", *plain, "tests/benchmarks/bare"], project, env).stdout


def test_a_keyword_recall_benchmark_in_under_100_lines(project: Path, tmp_path: Path) -> None:
    """Issue 35's acceptance: a fresh scaffold filled in as a user would for keyword recall with
    an LLM judge (tests/e2e/kwrecall/: its benchmark.py, judge prompt and items replace the
    template's) is at most 100 lines of Python, runs end to end with no edit outside its package
    and params.yaml, and its scaffolded test passes."""
    import shutil

    env = {"PYTHONPATH": str(project)}
    run(["lfbench", "new-benchmark", "kwrecall"], project, env)
    user = ROOT / "tests" / "e2e" / "kwrecall"
    package = project / "pipeline" / "benchmarks" / "kwrecall"
    for rel in ("benchmark.py", "prompts/judge.txt", "examples.jsonl"):
        shutil.copy(user / rel, package / rel)
    written = (user / "benchmark.py").read_text(encoding="utf-8").splitlines()
    assert len(written) <= 100
    with TestServer(
        responder="tests.e2e.kwrecall_responder:respond", log_path=tmp_path / "s.log", cwd=ROOT
    ) as srv:
        path = project / "params.yaml"
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
        endpoint = {"provider": "openai", "base_url": srv.base_url, "api_key_env": None}
        params["runtime"] = "local"
        params["models"]["kw-llm"] = {**endpoint, "model": "tiny"}
        # `models: all`: the LLM judge also judges the baseline (by default only models with calls)
        params["judges"]["kw-judge"] = {**endpoint, "model": "tiny-judge", "models": "all"}
        params["kwrecall"]["models"] = ["lead", "kw-llm"]
        params["kwrecall"]["judges"] = ["kwrecall-match", "kw-judge"]
        path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        assert (
            "every stage depends on the code it runs"
            in run(["lfbench", "check"], project, env).stdout
        )
        run(["dvc", "repro", "kwrecall-aggregate"], project, env)
        n_calls = len(srv.log())
    # 2 answers from the model, then one call per (answer, keyword): 5 keywords x 2 systems
    assert n_calls == 2 + 2 * 5
    rows = {
        (r["system"], r["judge"]): r
        for r in json.loads((project / "metrics/kwrecall.json").read_text())["rows"]
    }
    assert set(rows) == {(s, j) for s in ("lead", "kw-llm") for j in ("kwrecall-match", "kw-judge")}
    for system in ("lead", "kw-llm"):  # the scripted LLM judge decides as the match does
        assert rows[(system, "kw-judge")]["recall"] == rows[(system, "kwrecall-match")]["recall"]
    assert rows[("kw-llm", "kw-judge")]["recall"] == 1.0  # the answer repeats the documents
    passed = run(
        ["pytest", "-q", "-p", "no:cacheprovider", "tests/benchmarks/kwrecall"], project, env
    )
    assert "2 passed" in passed.stdout
    status = _status(project)
    outputs = (
        "datasets/", "generations/", "judgements/", "results/", "metrics/", "reports/", "dvc.lock",
    )  # fmt: skip
    changed = [line[3:] for line in status if not line[3:].startswith(outputs)]
    # by path (git's porcelain lines sort modified files before untracked ones)
    assert sorted(c for c in changed if not c.endswith(".gitignore")) == sorted(
        [
            "dvc.yaml",
            "inputs/kwrecall/",
            "params.yaml",
            "pipeline/benchmarks/kwrecall/",
            "retrievals/lineage/kwrecall/",
            "retrievals/kwrecall/",
            "tests/benchmarks/kwrecall/",
        ]
    )
