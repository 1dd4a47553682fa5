"""MLflow sync with binary artifacts: created once, skipped when unchanged, plots re-logged in
place when only they changed, a new run when the result changed (a real SQLite store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.stages.tracking import RunSpec, sync
from tests.conftest import ROOT


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


# ---------------------------------------------------------------- concurrent syncs

_SYNC = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pipeline.stages.tracking import DatasetRef, RunSpec, sync
    root, start, rows, joint = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    specs = [
        RunSpec(row_key=f"row-{i}", name=f"row {i}", metrics={"joint": float(joint) + i},
                params={"i": str(i)}, tags={"git.commit": sys.argv[5]},
                artifacts={"row.json": {"i": i}},
                dataset=DatasetRef("t/data.jsonl", "0123456789abcdef", "datasets/data.jsonl"))
        for i in range(rows)
    ]
    while time.time() < start:  # both start at the same moment
        time.sleep(0.001)
    print(sync("t", specs, root))
    """
)


def _syncs_at_once(
    root: Path, rows: int, joints: tuple[str, str], env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    start = time.time() + 4.0  # both interpreters are up by then
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SYNC, str(root), str(start), str(rows), joint, f"c{n}"],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, joint in enumerate(joints)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def current_runs(client: Any, name: str = "t") -> Counter[str]:
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs(
        [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
    )
    return Counter(r.data.tags["lfbench.row_key"] for r in runs)


def check_one_current_run_per_row(
    client: Any, procs: list[subprocess.CompletedProcess[str]], rows: int
) -> None:
    for p in procs:
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert current_runs(client) == Counter({f"row-{i}": 1 for i in range(rows)})


def test_two_syncs_into_one_sqlite_store_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clones' `lfbench track` into one SQLite store at the same moment: on a fresh store
    (MLflow's migrations would race), then on the filled store with changed results."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    fresh = _syncs_at_once(tmp_path, 30, ("1", "1"))
    check_one_current_run_per_row(client, fresh, 30)
    exp = client.get_experiment_by_name("t")
    assert len(client.search_runs([exp.experiment_id], max_results=5000)) == 30
    filled = _syncs_at_once(tmp_path, 30, ("2", "2"))
    check_one_current_run_per_row(client, filled, 30)
    (run,) = client.search_runs(
        [exp.experiment_id], "tags.`lfbench.row_key` = 'row-3' and tags.`lfbench.current` = 'true'"
    )
    assert run.data.metrics["joint"] == 5.0
    # MLflow's own conventions: the commit and the dataset the run was scored on
    assert run.data.tags["mlflow.source.git.commit"] in ("c0", "c1")
    (ds,) = run.inputs.dataset_inputs
    assert (ds.dataset.name, ds.dataset.digest) == ("t/data.jsonl", "0123456789abcdef")
    assert json.loads(ds.dataset.source) == {"uri": "datasets/data.jsonl"}


def test_a_tag_set_by_a_concurrent_sync_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two syncs converging on one row set the same tag on the same run; the loser of the insert
    fails in the store (PostgreSQL: UniqueViolation on tag_pk). A real SQLite store; the loser's
    failure is the store's own error raised after the other sync's write has landed."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipeline.stages import tracking

    real = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = real.create_experiment("t")
    run_id = real.create_run(exp).info.run_id

    class LosesTheFirstInsert:
        """The real client; its first set_tag races with another sync that sets `other`."""

        def __init__(self, other: str) -> None:
            self.other, self.calls = other, 0

        def set_tag(self, rid: str, key: str, value: str) -> None:
            self.calls += 1
            if self.calls == 1:
                real.set_tag(rid, key, self.other)  # the other sync's insert wins
                raise MlflowException("duplicate key value violates unique constraint tag_pk")
            real.set_tag(rid, key, value)

        def get_run(self, rid: str) -> Any:
            return real.get_run(rid)

    same = LosesTheFirstInsert(other="keep-1")
    tracking._set_tag(same, run_id, "lfbench.superseded_by", "keep-1")
    assert same.calls == 1  # the other sync set the same value: nothing to do
    assert real.get_run(run_id).data.tags["lfbench.superseded_by"] == "keep-1"

    differs = LosesTheFirstInsert(other="keep-1")
    tracking._set_tag(differs, run_id, "lfbench.superseded_by", "keep-2")
    assert differs.calls == 2  # retried as an update
    assert real.get_run(run_id).data.tags["lfbench.superseded_by"] == "keep-2"

    class AlwaysFails(LosesTheFirstInsert):
        def set_tag(self, rid: str, key: str, value: str) -> None:
            self.calls += 1
            raise MlflowException("the store is down")

    down = AlwaysFails(other="")
    with pytest.raises(MlflowException, match="the store is down"):
        tracking._set_tag(down, run_id, "lfbench.superseded_by", "keep-3")
    assert down.calls == 3


def test_a_dataset_inserted_by_a_concurrent_sync_is_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two syncs of one experiment log the same dataset for their runs at once; the loser of the
    insert (PostgreSQL: UniqueViolation on dataset_pk) retries and links the winner's row."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipeline.stages import tracking

    real = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = real.create_experiment("t")
    mine, theirs = (real.create_run(exp).info.run_id for _ in range(2))
    ref = tracking.DatasetRef(
        name="crux/crux.jsonl", digest="623bd261793c70377e60480ae4d73c55", source="x"
    )

    class LosesTheFirstInsert:
        calls = 0

        def log_inputs(self, rid: str, inputs: Any) -> None:
            self.calls += 1
            if self.calls == 1:
                tracking._log_dataset(real, theirs, ref)  # the other sync's insert wins
                raise MlflowException('duplicate key value violates unique constraint "dataset_pk"')
            real.log_inputs(rid, inputs)

    client = LosesTheFirstInsert()
    tracking._log_dataset(client, mine, ref)
    assert client.calls == 2
    for rid in (mine, theirs):
        (only,) = real.get_run(rid).inputs.dataset_inputs
        assert (only.dataset.name, only.dataset.digest) == (ref.name, ref.digest[:36])
