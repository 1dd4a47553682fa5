"""A new benchmark from the template, end to end: `lfbench new-benchmark toy` touches only its
package, params.yaml and dvc.yaml; `lfbench check` finds its stages' code dependencies complete;
`dvc repro toy-aggregate` constructs, generates (a baseline, and a model behind the test server),
judges (an LLM judge through the test server, and the local judge) and aggregates, with one
MLflow run per row. The LLM judge's recall is recomputed here from the scripted verdicts."""

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


def _status(proj: Path) -> list[str]:
    out = run(["git", "status", "--porcelain", "--untracked-files=normal"], proj).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_benchmark_from_the_template_runs_end_to_end(project: Path, tmp_path: Path) -> None:
    # The copy's own code runs (the new package is there, not in this checkout).
    env = {"PYTHONPATH": str(project)}
    out = run(["lfbench", "new-benchmark", "toy"], project, env).stdout
    assert "created pipeline/benchmarks/toy/" in out
    assert _status(project) == [" M dvc.yaml", " M params.yaml", "?? pipeline/benchmarks/toy/"]
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
    outputs = ("datasets/", "generations/", "judgements/", "metrics/", "reports/", "dvc.lock")
    modified = [line[3:] for line in status if line.startswith(" M")]
    assert [m for m in modified if not m.endswith(".gitignore") and not m.startswith(outputs)] == [
        "dvc.yaml",
        "params.yaml",
    ]
    untracked = [line[3:] for line in status if line.startswith("??")]
    assert [u for u in untracked if not u.startswith(outputs)] == ["pipeline/benchmarks/toy/"]
