"""MLflow sync with binary artifacts: created once, skipped when unchanged, plots re-logged in
place when only they changed, a new run when the result changed (a real SQLite store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.stages.tracking import RunSpec, sync


def _spec(plot: bytes, joint: float = 1.0) -> RunSpec:
    import hashlib

    return RunSpec(
        row_key="k",
        name="n",
        metrics={"joint": joint},
        params={"p": "1"},
        tags={"lfbench.plots_sha": hashlib.sha256(plot).hexdigest()[:16]},
        artifacts={"row.json": {"joint": joint}, "plots/a.png": plot},
    )


def test_plots_are_relogged_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    first = sync("t", [_spec(b"one")], tmp_path)
    assert (first.created, first.skipped) == (1, 0)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("t")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([exp.experiment_id])

    def plot(run_id: str) -> bytes:
        return Path(client.download_artifacts(run_id, "plots/a.png", str(tmp_path))).read_bytes()

    assert plot(run.info.run_id) == b"one"
    same = sync("t", [_spec(b"one")], tmp_path)
    assert (same.created, same.skipped, same.refreshed) == (0, 1, 0)

    redrawn = sync("t", [_spec(b"two")], tmp_path)
    assert (redrawn.created, redrawn.skipped, redrawn.refreshed) == (0, 1, 1)
    (again,) = client.search_runs([exp.experiment_id])
    assert again.info.run_id == run.info.run_id and plot(run.info.run_id) == b"two"

    changed = sync("t", [_spec(b"two", joint=2.0)], tmp_path)
    assert (changed.created, changed.superseded) == (1, 1)
