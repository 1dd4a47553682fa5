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

    first = sync("t", [_spec(b"one")], tmp_path, producer="p")
    assert (first.created, first.skipped) == (1, 0)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("t")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([exp.experiment_id])

    def plot(run_id: str) -> bytes:
        return Path(client.download_artifacts(run_id, "plots/a.png", str(tmp_path))).read_bytes()

    assert plot(run.info.run_id) == b"one"
    same = sync("t", [_spec(b"one")], tmp_path, producer="p")
    assert (same.created, same.skipped, same.refreshed) == (0, 1, 0)

    redrawn = sync("t", [_spec(b"two")], tmp_path, producer="p")
    assert (redrawn.created, redrawn.skipped, redrawn.refreshed) == (0, 1, 1)
    (again,) = client.search_runs([exp.experiment_id])
    assert again.info.run_id == run.info.run_id and plot(run.info.run_id) == b"two"

    changed = sync("t", [_spec(b"two", joint=2.0)], tmp_path, producer="p")
    assert (changed.created, changed.superseded) == (1, 1)


def _counted_png(log: str, label: str) -> bytes:
    """A 'plot' that records each drawing in a file (a forked child's draw counts too)."""
    with Path(log).open("a", encoding="utf-8") as fh:
        fh.write(label + "\n")
    return f"png of {label}".encode()


def test_a_plot_is_drawn_only_when_its_run_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lfbench.plots_sha` of a lazy `Plot` is its key (function, code, inputs), known without
    drawing: an unchanged run draws nothing; a new run, or new inputs, draw once each."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    from pipeline.core import drawing
    from pipeline.core.benchmark import RunRow
    from pipeline.core.config import Params
    from pipeline.stages.aggregate import run_spec

    log = tmp_path / "drawn.log"
    monkeypatch.setattr(drawing, "_DRAWN", {})  # what this process drew: none yet
    params = Params.model_validate(yaml_params())

    def specs(label: str, joint: float = 1.0) -> list[RunSpec]:
        out = []
        for i in range(3):
            plot = drawing.Plot(_counted_png, (str(log), f"{label}-{i}"))
            row = RunRow(key=f"r{i}", name=f"r{i}", metrics={"joint": joint + i}, params={},
                         tags={}, plots={"plots/a.png": plot})  # fmt: skip
            out.append(run_spec(_Bench(), params, row, lineage={}))
        return out

    def drawings() -> list[str]:
        return sorted(log.read_text().split()) if log.exists() else []

    first = sync("t", specs("one"), tmp_path, producer="p")
    assert first.created == 3 and drawings() == ["one-0", "one-1", "one-2"]
    monkeypatch.setattr(drawing, "_DRAWN", {})  # a later stage: a new process
    again = sync("t", specs("one"), tmp_path, producer="p")
    assert (again.created, again.skipped, again.refreshed) == (0, 3, 0)
    assert drawings() == ["one-0", "one-1", "one-2"]  # nothing drawn to compare

    redrawn = sync("t", specs("two"), tmp_path, producer="p")  # same rows, other plot inputs
    assert (redrawn.created, redrawn.refreshed) == (0, 3)
    assert drawings().count("two-0") == 1 and len(drawings()) == 6
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("t")
    (run,) = client.search_runs([exp.experiment_id], "tags.`lfbench.row_key` = 'r1'")
    path = client.download_artifacts(run.info.run_id, "plots/a.png", str(tmp_path))
    assert Path(path).read_bytes() == b"png of two-1"


class _Bench:
    name = "toy"
    version = "1"


def yaml_params() -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8")))


def test_a_plots_key_follows_its_inputs_not_its_drawing() -> None:
    from pipeline.core.drawing import Plot

    a = Plot(_counted_png, ("/nonexistent/log", "x"))
    assert a.key == Plot(_counted_png, ("/nonexistent/log", "x")).key
    assert a.key != Plot(_counted_png, ("/nonexistent/log", "y")).key
    assert a.key != Plot(_pngs_twin, ("/nonexistent/log", "x")).key  # another function


def _pngs_twin(log: str, label: str) -> bytes:
    return _counted_png(log, label)


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
    print(sync("t", specs, root, producer="t-aggregate"))
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


# ---------------------------------------------------------------- identity, retirement, healing


def _row(key: str, joint: float = 1.0, model: str = "m1", **tags: str) -> RunSpec:
    """A row with the lineage an aggregate gives it: provenance and bookkeeping tags."""
    lineage = {
        "benchmark": "b",
        "benchmark.version": "1",
        "model.entry": model,
        "judge.name": "j",
        "judge.prompt_sha": "p1",
        "model.prompt_sha": "g1",
        "dataset.digest": "d1",
        "image.recipe": "r1",
        "dvc.stage": f"b-judge@{model}-j",
        "dvc.stage_md5": "s1",
        "dvc.generate_stage_md5": "g1",
        "dvc.construct_stage_md5": "c1",
        "git.commit": "commit1",
        "git.dirty": "false",
        "lfbench.version": "0.1",
        "data.digest": "dd1",
        "runtime": "local",
        "image.digest": "none",
    }
    return RunSpec(
        row_key=key,
        name=key,
        metrics={"joint": joint},
        params={"model": model},
        tags=lineage | tags,
        artifacts={"row.json": {"joint": joint}},
    )


def _client(root: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def _current_ids(client: Any, name: str = "t") -> dict[str, str]:
    """row key -> run id of its current run (one per row: checked)."""
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs(
        [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
    )
    ids = {r.data.tags["lfbench.row_key"]: r.info.run_id for r in runs}
    assert len(ids) == len(runs), Counter(r.data.tags["lfbench.row_key"] for r in runs)
    return ids


def _counts(report: Any) -> tuple[int, int, int]:
    return report.created, report.skipped, report.superseded


def test_bookkeeping_alone_keeps_the_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose DVC stage digests, commit, lfbench version, data digest or runtime changed
    (an unrelated model's entry changed the construct stage's md5) keeps its run; the new
    values are recorded as `<tag>.latest`. A metric or a provenance tag makes a new run."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = _client(tmp_path)
    rows = ("r0", "r1", "r2")
    first = sync("t", [_row(k) for k in rows], tmp_path, producer="b-aggregate")
    assert _counts(first) == (3, 0, 0)
    before = _current_ids(client)

    moved = {
        "dvc.stage_md5": "s2",
        "dvc.generate_stage_md5": "g2",
        "dvc.construct_stage_md5": "c2",
        "git.commit": "commit2",
        "git.dirty": "true",
        "lfbench.version": "0.2",
        "data.digest": "dd2",
        "runtime": "docker",
        "image.digest": "sha256:x",
    }
    again = sync("t", [_row(k, **moved) for k in rows], tmp_path, producer="b-aggregate")
    assert _counts(again) == (0, 3, 0) and again.retagged == 3
    assert _current_ids(client) == before
    tags = client.get_run(before["r1"]).data.tags
    assert tags["dvc.construct_stage_md5"] == "c1"  # as made
    assert tags["dvc.construct_stage_md5.latest"] == "c2"  # as last re-made
    assert tags["git.commit.latest"] == "commit2"
    # the same bookkeeping once more: nothing to write
    same = sync("t", [_row(k, **moved) for k in rows], tmp_path, producer="b-aggregate")
    assert _counts(same) == (0, 3, 0) and same.retagged == 0

    metric = sync(
        "t",
        [_row("r0", joint=2.0, **moved), *(_row(k, **moved) for k in rows[1:])],
        tmp_path,
        producer="b-aggregate",
    )
    assert _counts(metric) == (1, 2, 1)
    after = _current_ids(client)
    assert after["r0"] != before["r0"] and {k: after[k] for k in rows[1:]} == {
        k: before[k] for k in rows[1:]
    }
    old = client.get_run(before["r0"]).data.tags
    assert (old["lfbench.current"], old["lfbench.superseded_by"]) == ("false", after["r0"])

    prompt = sync(
        "t",
        [
            _row("r0", joint=2.0, **moved),
            _row("r1", **moved, **{"judge.prompt_sha": "p2"}),
            _row("r2", **moved),
        ],
        tmp_path,
        producer="b-aggregate",
    )
    assert _counts(prompt) == (1, 2, 1)
    print(
        "bookkeeping:",
        [_counts(r) for r in (first, again, same, metric, prompt)],
        "(created, skipped, superseded)",
    )


def test_a_run_of_an_older_fingerprint_rule_is_adopted_not_remade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store filled before provenance and bookkeeping were told apart: its runs' fingerprint
    tags hash the bookkeeping too, and they carry no producer or workspace. Recognised from
    their stored metrics and tags (a tag added since is not a change), re-tagged, kept."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from pipeline.stages import tracking

    client = _client(tmp_path)
    sync("t", [_row("r0"), _row("r1")], tmp_path, producer="b-aggregate")
    before = _current_ids(client)
    for run_id in before.values():  # as the previous version logged it
        client.set_tag(run_id, tracking.FINGERPRINT, "0123456789abcdef")
        # and a provenance tag the older version did not log
        for tag in (tracking.PRODUCER, tracking.WORKSPACE, "image.recipe"):
            if tag in client.get_run(run_id).data.tags:
                client.delete_tag(run_id, tag)
    again = sync(
        "t", [_row("r0", **{"dvc.stage_md5": "s9"}), _row("r1")], tmp_path, producer="b-aggregate"
    )
    assert _counts(again) == (0, 2, 0) and again.adopted == 2
    assert _current_ids(client) == before
    tags = client.get_run(before["r0"]).data.tags
    assert tags[tracking.FINGERPRINT] == tracking.fingerprint({"joint": 1.0}, _row("r0").tags)
    assert tags[tracking.PRODUCER] == "b-aggregate" and tags[tracking.WORKSPACE]
    assert tags["image.recipe"] == "r1"  # the tag it lacked, added
    assert tags["dvc.stage_md5"] == "s1" and tags["dvc.stage_md5.latest"] == "s9"


def test_rows_no_longer_produced_are_retired_in_their_workspace_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each sync, exactly the rows it was given are current among its producer's runs in
    its workspace; another producer's runs (the agreement stage in the same experiment) and
    another workspace's (a teammate's models in a shared store) are left to their own syncs."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = _client(tmp_path)

    def as_(ws: str, producer: str, specs: list[RunSpec]) -> Any:
        monkeypatch.setenv("LFBENCH_WORKSPACE", ws)
        return sync("t", specs, tmp_path, producer=producer)

    shared = [_row("shared-x", model="shared"), _row("shared-y", model="shared")]
    a, b = _row("a-x", model="a"), _row("b-x", model="b")
    agreement = _row("agree-j", model="none")
    steps = {
        "A syncs shared+a": as_("A", "b-aggregate", [*shared, a]),
        "A's agreement": as_("A", "b-agreement", [agreement]),
        "B syncs shared+b": as_("B", "b-aggregate", [*shared, b]),
        "A syncs shared+a again": as_("A", "b-aggregate", [*shared, a]),
    }
    assert set(_current_ids(client)) == {"shared-x", "shared-y", "a-x", "b-x", "agree-j"}
    assert [r.retired for r in steps.values()] == [0, 0, 0, 0]
    assert steps["B syncs shared+b"].created == 1  # shared rows: B confirms A's runs
    before = _current_ids(client)

    # A drops its model a and one shared row (say, its slice changed): retired; B's row, the
    # agreement row and the other shared row stay
    steps["A drops a, shared-y"] = dropped = as_("A", "b-aggregate", [shared[0]])
    assert (dropped.retired, dropped.created, dropped.superseded) == (2, 0, 0)
    now = _current_ids(client)
    assert set(now) == {"shared-x", "b-x", "agree-j"}
    assert now == {k: before[k] for k in now}
    gone = client.get_run(before["a-x"]).data.tags
    assert (gone["lfbench.current"], gone["lfbench.retired"], gone["lfbench.superseded_by"]) == (
        "false",
        "true",
        "none",
    )
    # an aggregate producing nothing in A: the agreement stage's run is another producer's
    steps["A's aggregate: no rows"] = empty = as_("A", "b-aggregate", [])
    assert empty.retired == 1  # shared-x, last confirmed by A
    assert set(_current_ids(client)) == {"b-x", "agree-j"}
    # B still produces shared-x and shared-y: its next sync makes their runs current again
    steps["B syncs shared+b again"] = back = as_("B", "b-aggregate", [*shared, b])
    assert (back.created, back.revived, back.skipped, back.retired) == (0, 2, 1, 0)
    assert _current_ids(client) == {
        k: before[k] for k in ("shared-x", "shared-y", "b-x", "agree-j")
    }
    revived = client.get_run(before["shared-x"]).data.tags
    assert (revived["lfbench.retired"], revived["lfbench.workspace"]) == ("false", "B")
    assert "lfbench.superseded_by" not in revived
    # A adds its model back: the same result is its old run; a new result a new run
    steps["A adds a back"] = readd = as_("A", "b-aggregate", [a])
    assert (readd.created, readd.revived, readd.retired) == (0, 1, 0)
    assert _current_ids(client)["a-x"] == before["a-x"]
    steps["A's a changes"] = moved = as_("A", "b-aggregate", [_row("a-x", joint=5.0, model="a")])
    assert (moved.created, moved.superseded) == (1, 1)
    for name, r in steps.items():
        print(
            f"{name}: created {r.created}, skipped {r.skipped}, superseded {r.superseded},"
            f" retired {r.retired}, revived {r.revived}, adopted {r.adopted}"
        )


def test_a_models_early_sync_then_the_aggregates_log_each_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42: a per-model results stage logs its model's rows as the aggregate's producer,
    retiring nothing (the other models' rows, a dropped model's, stay for the aggregate); the
    aggregate then finds them unchanged (skipped, not logged twice) and retires what no model
    produces any more."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = _client(tmp_path)
    old = [_row("old-x", model="old")]
    first = sync("t", [*old, _row("slow-x", model="slow")], tmp_path, producer="b-aggregate")
    assert first.created == 2
    # the fast model's stage: its rows, nothing else touched
    fast = [_row("fast-x", model="fast"), _row("fast-y", model="fast")]
    early = sync("t", fast, tmp_path, producer="b-aggregate", retire=False)
    assert (early.created, early.retired) == (2, 0)
    ids = _current_ids(client)
    assert set(ids) == {"old-x", "slow-x", "fast-x", "fast-y"}
    # the aggregate, after every model's stage (model old removed from params meanwhile)
    final = sync("t", [*fast, _row("slow-x", model="slow")], tmp_path, producer="b-aggregate")
    assert (final.created, final.skipped, final.superseded, final.retired) == (0, 3, 0, 1)
    assert _current_ids(client) == {k: ids[k] for k in ("slow-x", "fast-x", "fast-y")}


def test_a_sync_that_creates_nothing_heals_a_killed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync stopped between making a row's new run current and superseding the old one (the
    fault injected in the real code path: the first write of `lfbench.current=false` fails)
    leaves two current runs; the next sync, with the same rows, creates nothing and leaves one,
    the new result's."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from pipeline.stages import tracking

    client = _client(tmp_path)
    rows = ("r0", "r1", "r2")
    sync("t", [_row(k) for k in rows], tmp_path, producer="b-aggregate")
    before = _current_ids(client)

    real = tracking._set_tag
    calls = {"n": 0}

    def killed(c: Any, run_id: str, key: str, value: str) -> None:
        if key == tracking.CURRENT and value == "false" and calls["n"] == 0:
            calls["n"] += 1
            raise KeyboardInterrupt("killed between the two writes")
        real(c, run_id, key, value)

    monkeypatch.setattr(tracking, "_set_tag", killed)
    changed = [_row("r0", joint=2.0), *(_row(k) for k in rows[1:])]
    with pytest.raises(KeyboardInterrupt):
        sync("t", changed, tmp_path, producer="b-aggregate")
    exp = client.get_experiment_by_name("t")
    assert current_runs(client)["r0"] == 2, "the fault left two current runs"
    monkeypatch.setattr(tracking, "_set_tag", real)

    healed = sync("t", changed, tmp_path, producer="b-aggregate")
    assert (healed.created, healed.skipped, healed.superseded, healed.healed) == (0, 3, 0, 1)
    now = _current_ids(client)
    assert set(now) == set(rows) and now["r0"] != before["r0"]
    assert client.get_run(now["r0"]).data.metrics["joint"] == 2.0
    old = client.get_run(before["r0"]).data.tags
    assert (old["lfbench.current"], old["lfbench.superseded_by"]) == ("false", now["r0"])
    assert len(client.search_runs([exp.experiment_id], max_results=100)) == 4

    # the same kill, then the previous result comes back: the older current run has it, but
    # convergence keeps the latest, so a new run is made and both others superseded
    monkeypatch.setattr(tracking, "_set_tag", killed)
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        sync(
            "t",
            [_row("r0", joint=3.0), *(_row(k) for k in rows[1:])],
            tmp_path,
            producer="b-aggregate",
        )
    monkeypatch.setattr(tracking, "_set_tag", real)
    reverted = sync("t", changed, tmp_path, producer="b-aggregate")
    assert (reverted.created, reverted.superseded) == (1, 2)
    final = _current_ids(client)
    assert client.get_run(final["r0"]).data.metrics["joint"] == 2.0
    print(
        f"killed sync healed by: created {healed.created}, skipped {healed.skipped}, "
        f"superseded {healed.superseded}, healed {healed.healed}; after a second kill and a "
        f"revert: created {reverted.created}, superseded {reverted.superseded}"
    )


def test_another_producers_row_of_the_same_key_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stages logging into one experiment (the agreement stages of several benchmarks):
    a row key they both use is two rows, each current, neither superseding the other."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = _client(tmp_path)
    one = sync("t", [_row("k", joint=1.0)], tmp_path, producer="x-agreement")
    two = sync("t", [_row("k", joint=2.0)], tmp_path, producer="y-agreement")
    again = sync("t", [_row("k", joint=1.0)], tmp_path, producer="x-agreement")
    assert [_counts(r) for r in (one, two, again)] == [(1, 0, 0), (1, 0, 0), (0, 1, 0)]
    assert current_runs(client)["k"] == 2


def test_usage_counters_are_relogged_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's stage re-ran with the same result (all answers from the cache): its usage
    counters (requests sent, cache hits, wall time) are re-logged in its run, not a new run."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from dataclasses import replace

    client = _client(tmp_path)
    made = {"generate.requests_sent": 3.0, "generate.cache_hits": 0.0, "generate.wall_s": 4.2}
    cached = {"generate.requests_sent": 0.0, "generate.cache_hits": 3.0, "generate.wall_s": 0.1}
    first = sync("t", [replace(_row("r0"), counters=made)], tmp_path, producer="b-aggregate")
    (run_id,) = _current_ids(client).values()
    again = sync("t", [replace(_row("r0"), counters=cached)], tmp_path, producer="b-aggregate")
    assert [_counts(r) for r in (first, again)] == [(1, 0, 0), (0, 1, 0)]
    assert again.recounted == 1 and _current_ids(client) == {"r0": run_id}
    metrics = client.get_run(run_id).data.metrics
    assert {k: metrics[k] for k in cached} == cached and metrics["joint"] == 1.0
    history = client.get_metric_history(run_id, "generate.cache_hits")
    assert [m.value for m in history] == [0.0, 3.0]


def test_entry_sha_follows_what_an_entry_answers_not_how_it_is_reached() -> None:
    """A model entry's temperature is part of its rows' provenance; its port, pace and price
    are not (a server moved, a rate limit raised: the same rows, the same runs)."""
    from pipeline.core.config import OpenAIModel
    from pipeline.stages.aggregate import entry_sha

    base = {"provider": "openai", "base_url": "http://127.0.0.1:8080/v1", "model": "m"}
    base["slice"] = {"summhay": {"first": 1}, "long2rag": {"first": 2}}
    sha = entry_sha(OpenAIModel.model_validate(base), "summhay")
    for moved in (
        {"base_url": "http://127.0.0.1:9090/v1"},
        {"max_concurrency": 2, "requests_per_minute": 60.0, "timeout_s": 5.0},
        {"price_input_per_1m": 1.0, "api_key_env": None},
        {"slice": {"summhay": {"first": 1}, "long2rag": {"first": 3}}},  # another benchmark's
    ):
        assert entry_sha(OpenAIModel.model_validate(base | moved), "summhay") == sha, moved
    for changed in (
        {"temperature": 0.7},
        {"max_tokens": 64},
        {"model": "n"},
        {"slice": {"summhay": {"first": 2}, "long2rag": {"first": 2}}},
    ):
        assert entry_sha(OpenAIModel.model_validate(base | changed), "summhay") != sha, changed


def test_a_rows_sampling_settings_are_params_beside_entry_sha(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, point 5: the model's and the judge's temperature, top_p, max_tokens and seed
    were only inside `model.entry_sha`. They are params of each row's run; a run logged before
    (same result) gets them added in place, no new run."""
    from dataclasses import replace

    from pipeline.core.benchmark import RunRow
    from pipeline.core.params import load_params
    from pipeline.stages.aggregate import run_spec, sampling

    params = load_params(ROOT / "params.yaml", [])
    from pipeline.core.config import OpenAIJudge, OpenAIModel

    endpoint = {"provider": "openai", "base_url": "http://127.0.0.1:1/v1"}
    model = OpenAIModel.model_validate({**endpoint, "model": "qwen", "temperature": 0.7})
    judge = OpenAIJudge.model_validate({**endpoint, "model": "gpt", "seed": None, "top_p": 0.9})
    params = params.model_copy(
        update={"models": {"m1": model}, "judges": {"j": judge, **params.judges}}
    )
    got = sampling(params, "m1", "j")
    assert got == {
        "model.served": "qwen",
        "model.temperature": "0.7",
        "model.top_p": "none",
        "model.max_tokens": "1024",
        "model.seed": "0",
        "judge.served": "gpt",
        "judge.temperature": "0.0",
        "judge.top_p": "0.9",
        "judge.max_tokens": "1024",
        "judge.seed": "none",
    }
    assert sampling(params, "lead", "local") == {}  # no endpoint, nothing sampled
    row = RunRow("k", "n", {"m": 1.0}, {"system": "s"}, {}, model="m1", judge="j")
    spec = run_spec(SimpleBench(), params, row, lineage={"model.entry_sha": "e1"})
    assert spec.params["model.temperature"] == "0.7" and spec.params["system"] == "s"

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = _client(tmp_path)
    older = replace(spec, params={"system": "s"})  # logged by an lfbench without them
    assert _counts(sync("t", [older], tmp_path, producer="b-aggregate")) == (1, 0, 0)
    (run_id,) = _current_ids(client).values()
    assert _counts(sync("t", [spec], tmp_path, producer="b-aggregate")) == (0, 1, 0)
    assert client.get_run(run_id).data.params["judge.top_p"] == "0.9"


class SimpleBench:
    name = "b"
    version = "1"


# ---------------------------------------------------------------- syncs stopped half-way

# A sync whose writing of one run's artifacts is where it stops: by a real signal to its own
# process (`kill`: SIGINT or SIGKILL), or by waiting for a file (a sync in progress, `wait`).
_STOPPED = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from pipeline.stages import tracking
    # Ctrl-C raises KeyboardInterrupt here even when the parent ignores SIGINT (a job started
    # with `&` by a non-interactive shell inherits SIG_IGN, and Python then keeps it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root, how, stop_at, flag = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    shift = float(sys.argv[5])
    real, calls = tracking._log_artifacts, []

    def stopping(client, run_id, artifacts):
        calls.append(run_id)
        if len(calls) == stop_at:
            flag.write_text(run_id)
            if how == "wait":
                while not flag.with_suffix(".go").exists():
                    time.sleep(0.05)
            else:
                os.kill(os.getpid(), getattr(signal, how))
                time.sleep(5)
        real(client, run_id, artifacts)

    tracking._log_artifacts = stopping
    specs = [
        tracking.RunSpec(row_key=f"r{i}", name=f"r{i}", metrics={"joint": i + shift},
                         params={}, tags={}, artifacts={"row.json": {"i": i}})
        for i in range(3)
    ]
    print(tracking.sync("t", specs, root, producer="b-aggregate"))
    """
)


def _stopped_sync(
    root: Path,
    how: str,
    flag: Path,
    stop_at: int = 2,
    env: dict[str, str] | None = None,
    shift: float = 0.0,
) -> subprocess.Popen[str]:
    """A sync of three rows (joint i + shift) stopped as `_STOPPED` says."""
    return subprocess.Popen(
        [sys.executable, "-c", _STOPPED, str(root), how, str(stop_at), str(flag), str(shift)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _specs3() -> list[RunSpec]:
    return [
        RunSpec(
            row_key=f"r{i}",
            name=f"r{i}",
            metrics={"joint": float(i)},
            params={},
            tags={},
            artifacts={"row.json": {"i": i}},
        )
        for i in range(3)
    ]


def _pending(client: Any, name: str = "t", *, deleted: bool = False) -> dict[str, str]:
    """run id -> status of the experiment's runs still tagged `lfbench.current=pending`: the
    live ones, or with `deleted` the deleted ones."""
    from mlflow.entities import ViewType

    view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], "tags.`lfbench.current` = 'pending'", view)
    return {r.info.run_id: r.info.status for r in runs}


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_sync_stopped_half_way_leaves_no_pending_run_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_name: str
) -> None:
    """A sync (a real process, a real SQLite store) stopped by a real signal while it writes a
    new run leaves that run `lfbench.current=pending` (FINISHED after Ctrl-C, RUNNING after a
    kill); the next sync deletes it and leaves one current run per row, none pending. Before
    the fix the pending run stayed for good."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    flag = tmp_path / "stopped"
    proc = _stopped_sync(tmp_path, signal_name, flag)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and flag.exists(), (proc.returncode, out, err[-2000:])
    client = _client(tmp_path)
    left = _pending(client)
    assert list(left) == [flag.read_text()], left
    print(f"after {signal_name}: pending run {flag.read_text()}, status {left[flag.read_text()]}")

    again = sync("t", _specs3(), tmp_path, producer="b-aggregate")
    assert _pending(client) == {}, "the stopped sync's run is still pending"
    assert again.abandoned == 1
    assert set(_current_ids(client)) == {"r0", "r1", "r2"}
    assert client.get_run(flag.read_text()).info.lifecycle_stage == "deleted"
    assert sync("t", _specs3(), tmp_path, producer="b-aggregate").abandoned == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_store_keeps_a_live_syncs_pending_run_and_cleans_a_dead_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workspaces syncing into one MLflow server (a real `mlflow server`; no lock): a sync
    must not delete the run another workspace's live sync is writing, and must delete one left
    by a sync that was killed (a process of this machine that is gone), or by another machine's
    sync (not checkable from here) once it is an hour old."""
    import requests

    from pipeline.stages import tracking

    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--default-artifact-root", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if requests.get(f"{uri}/health", timeout=10).ok:
                    break
            except requests.RequestException:  # not up yet
                pass
            assert time.monotonic() < deadline and server.poll() is None, "no mlflow server"
            time.sleep(0.5)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        ws_a, ws_b = tmp_path / "a", tmp_path / "b"
        ws_a.mkdir(), ws_b.mkdir()

        # A's sync is writing its second run while B syncs the same rows
        flag = tmp_path / "live"
        live = _stopped_sync(ws_a, "wait", flag, env={"LFBENCH_WORKSPACE": "A"})
        while not flag.exists():
            assert live.poll() is None, live.communicate()
            time.sleep(0.05)
        monkeypatch.setenv("LFBENCH_WORKSPACE", "B")
        b = sync("t", _specs3(), ws_b, producer="b-aggregate")
        assert list(_pending(client)) == [flag.read_text()], "a live sync's run was deleted"
        assert b.abandoned == 0
        flag.with_suffix(".go").touch()
        _, err = live.communicate(timeout=300)
        assert live.returncode == 0, err[-2000:]
        assert _pending(client) == {}

        # A's next sync of changed rows is killed half-way: B's next sync deletes its run
        killed = tmp_path / "killed"
        proc = _stopped_sync(
            ws_a, "SIGKILL", killed, stop_at=1, env={"LFBENCH_WORKSPACE": "A"}, shift=10.0
        )
        proc.communicate(timeout=300)
        # (a server takes the rows side by side: the kill may leave each row's run pending, and
        # a create the killed process sent may still finish on the server after this listing)
        left = list(_pending(client))
        assert proc.returncode == -9 and killed.read_text() in left and len(left) <= 3
        cleaned = sync("t", _specs3(), ws_b, producer="b-aggregate")
        assert _pending(client) == {}, "the killed sync's runs are still pending"
        deleted = _pending(client, deleted=True)
        assert set(left) <= set(deleted) and len(deleted) <= 3
        assert cleaned.abandoned == len(deleted)

        # another machine's pending runs: a fresh one is kept, one an hour old is deleted
        exp = client.get_experiment_by_name("t").experiment_id
        other = "0ther-b00t/pid:[1]/4242/77"
        now_ms = int(time.time() * 1000)
        fresh, stale = (
            client.create_run(
                exp,
                start_time=start,
                tags={tracking.CURRENT: "pending", tracking.WRITER: other, tracking.ROW_KEY: "r9"},
            ).info.run_id
            for start in (now_ms, now_ms - int(tracking.PENDING_STALE_S * 1000) - 60_000)
        )
        aged = sync("t", _specs3(), ws_b, producer="b-aggregate")
        assert list(_pending(client)) == [fresh] and aged.abandoned == 1
        assert client.get_run(stale).info.lifecycle_stage == "deleted"
    finally:
        server.terminate()
        server.wait(timeout=60)
