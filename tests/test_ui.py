"""`lfbench ui` opens the benchmarks' runs, not MLflow's GenAI home page (issue 36, point 25):
it writes each benchmark experiment's shared view (the current runs, sorted by the main metric,
the main metrics as columns and charts) and prints a link to each. The browser side is
tests/e2e/test_mlflow_ui.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import cli


def _store(tmp_path: Path) -> str:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    (tmp_path / "mlruns").mkdir()
    client = MlflowClient(tracking_uri=uri)
    for name in ("summhay", "long2rag", "agreement", "my-notebook"):
        exp = client.create_experiment(name)
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "cost_usd", 0.0)
    return uri


class Exec(Exception):
    pass


def test_lfbench_ui_prints_a_link_to_each_benchmark_s_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    uri = _store(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        started.append(argv)
        raise Exec

    monkeypatch.setattr(os, "execv", execv)
    done = CliRunner().invoke(cli, ["ui", "--port", "5123"])
    assert isinstance(done.exception, Exec), done.output
    assert started and started[0][-6:] == [
        "--host",
        "127.0.0.1",
        "--port",
        "5123",
        "--workers",
        "1",
    ]
    client = MlflowClient(tracking_uri=uri)
    ids = {e.name: e.experiment_id for e in client.search_experiments()}
    for name in ("summhay", "long2rag", "agreement"):
        link = (
            f"  {name}: http://127.0.0.1:5123/#/experiments/{ids[name]}/runs"
            "?viewStateShareKey=lfbench&workflowType=machine_learning"
        )
        assert link in done.output.splitlines(), done.output
    assert "my-notebook" not in done.output  # not lfbench's: left as it is
    assert "mlflow.sharedViewState.lfbench" not in client.get_experiment(ids["my-notebook"]).tags

    state = json.loads(client.get_experiment(ids["summhay"]).tags["mlflow.sharedViewState.lfbench"])
    cols = ["joint", "coverage", "citation", "joint_ci_low", "joint_ci_high", "n_items", "cost_usd"]
    assert state["selectedColumns"] == [f"metrics.`{c}`" for c in cols]
    assert state["orderByKey"] == "metrics.`joint`" and state["orderByAsc"] is False
    assert state["searchFilter"] == "tags.`lfbench.current` = 'true'"
    assert [c["metricKey"] for c in state["compareRunCharts"]] == ["joint", "coverage", "citation"]
    l2r = json.loads(client.get_experiment(ids["long2rag"]).tags["mlflow.sharedViewState.lfbench"])
    assert l2r["orderByKey"] == "metrics.`kpr`"
    assert l2r["compareRunCharts"][0]["metricKey"] == "kpr"  # not cost_usd, MLflow's first


def test_a_store_without_results_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def execv(path: str, argv: list[Any]) -> None:
        raise Exec

    monkeypatch.setattr(os, "execv", execv)
    done = CliRunner().invoke(cli, ["ui"])
    assert isinstance(done.exception, Exec)
    assert "No lfbench results in this store yet (dvc repro logs them): http://127.0.0.1:5000" in (
        done.output
    )
