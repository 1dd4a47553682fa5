"""The warm sync server (pipeline/stages/warm_sync.py): a stage's MLflow sync run by a child of
a process that has MLflow imported gives what the stage's own sync gives; a caller that dies
takes its child with it; anything the server cannot take is done in the caller.

The module starts its own server (a socket folder of its own, TMPDIR), so tests on other
workers neither see nor share it."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.stages import warm_sync
from pipeline.stages.tracking import RunSpec, sync_here
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The server of this code, with a socket folder of this module's own (TMPDIR), started
    by a first call (which runs in the caller); the folder."""
    tmp = tmp_path_factory.mktemp("warm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        mp.setattr(warm_sync.tempfile, "tempdir", None)  # read TMPDIR again
        mp.setattr(warm_sync, "_enabled", True)
        for name in (warm_sync.ENV_SWITCH, "LFBENCH_RUNTIME", "MLFLOW_TRACKING_URI"):
            mp.delenv(name, raising=False)
        assert warm_sync.call(os.getpid) == os.getpid()  # no server yet: here, and one starts
        folder = warm_sync.socket_dir()
        assert folder is not None and folder.parent == tmp
        deadline = time.monotonic() + 60
        while warm_sync.call(os.getpid) == os.getpid():
            assert time.monotonic() < deadline, _server_log(folder)
            time.sleep(0.2)
        yield folder
        pid = _server_pid(folder)
        if pid:
            os.kill(pid, signal.SIGTERM)


@pytest.fixture
def warm(server: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a stage's, its server running; the socket folder."""
    monkeypatch.setenv("TMPDIR", str(server.parent))
    monkeypatch.setattr(warm_sync.tempfile, "tempdir", None)
    monkeypatch.setattr(warm_sync, "_enabled", True)
    for name in (warm_sync.ENV_SWITCH, "LFBENCH_RUNTIME", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    return server


def _server_log(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.glob("*.log"))


def _server_pid(folder: Path) -> int | None:
    (lock,) = folder.glob("sync-*.lock")
    text = lock.read_text().strip()
    return int(text) if text else None


def _specs(joint: float = 1.0) -> list[RunSpec]:
    return [
        RunSpec(
            row_key=f"k{i}",
            name=f"n{i}",
            metrics={"joint": joint + i},
            params={"p": str(i)},
            tags={"model": f"m{i}"},
            artifacts={"row.json": {"joint": joint + i}},
        )
        for i in range(3)
    ]


def _runs(root: Path) -> list[tuple[Any, ...]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("t")
    keep = ("lfbench.row_key", "lfbench.current", "lfbench.fingerprint", "lfbench.producer")
    return sorted(
        (
            r.data.tags["lfbench.row_key"],
            r.info.run_name,
            tuple(sorted(r.data.metrics.items())),
            tuple(sorted(r.data.params.items())),
            tuple((k, r.data.tags.get(k)) for k in keep),
        )
        for r in client.search_runs([exp.experiment_id])
    )


def test_the_servers_sync_writes_what_the_callers_own_writes(
    warm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    monkeypatch.setenv("LFBENCH_WORKSPACE", "w1")  # the runs name their workspace
    caplog.set_level(logging.DEBUG, logger="pipeline.stages.warm_sync")
    for joint in (1.0, 1.0, 2.0):  # created, then skipped, then superseded
        own = sync_here("t", _specs(joint), here, producer="p")
        # MLflow's set_tracking_uri exports the store it chose: a stage syncs into one store
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        served = warm_sync.call(sync_here, "t", _specs(joint), there, producer="p")
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert served == own
    assert "synced by the warm sync server" in caplog.text
    assert _runs(here) == _runs(there)
    assert len(_runs(there)) == 6 and json.dumps(_runs(there)).count('"true"') == 3


def test_the_callers_environment_folder_and_log_levels_reach_the_child(
    warm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LFBENCH_WARM_PROBE", "from the caller")
    monkeypatch.chdir(tmp_path)
    assert warm_sync.call(os.getenv, "LFBENCH_WARM_PROBE") == "from the caller"
    assert warm_sync.call(os.getcwd) == str(tmp_path)
    assert warm_sync.call(os.getpid) != os.getpid()
    # a record the child logs is logged here, at this process's levels
    caplog.set_level(logging.INFO, logger="lfbench")
    assert warm_sync.call(say, logging.INFO, "said in the child %s", 42) != os.getpid()
    warm_sync.call(say, logging.DEBUG, "not shown")
    said = [r.getMessage() for r in caplog.records if r.name == "lfbench"]
    assert said == ["said in the child 42"]


def say(level: int, msg: str, *args: Any) -> int:
    """Logs, in the child (this module is imported there), and says where it ran."""
    logging.getLogger("lfbench").log(level, msg, *args)
    return os.getpid()


def test_an_error_in_the_child_is_the_callers_error(
    warm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that does not answer: the same one line as the stage's own sync."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    with pytest.raises(LfbenchError) as own:
        sync_here("t", _specs(), tmp_path, producer="p")
    with pytest.raises(LfbenchError) as served:
        warm_sync.call(sync_here, "t", _specs(), tmp_path, producer="p")
    assert str(served.value) == str(own.value) and "127.0.0.1:9" in str(own.value)


def test_what_the_server_cannot_load_runs_in_the_caller(warm: Path) -> None:
    """A function only the caller has (here a test module's, not importable by the server) is
    run in the caller, once."""
    calls: list[int] = []
    local_only.calls = calls  # type: ignore[attr-defined]
    assert warm_sync.call(local_only) == os.getpid()
    assert calls == [os.getpid()]


def local_only() -> int:
    local_only.calls.append(os.getpid())  # type: ignore[attr-defined]
    return os.getpid()


local_only.__module__ = "tests.not_a_module"


def test_arguments_that_do_not_pickle_run_in_the_caller(warm: Path) -> None:
    import threading

    lock = threading.Lock()  # cannot be sent to the server
    assert warm_sync.call(where, lock) == os.getpid()
    assert warm_sync.call(where, None) != os.getpid()  # the same call, sendable: served


def where(_: Any) -> int:
    return os.getpid()


def test_a_caller_killed_mid_sync_takes_its_child_down(warm: Path, tmp_path: Path) -> None:
    server = _server_pid(warm)
    assert server
    script = textwrap.dedent(
        """
        import os, sys, time
        from pipeline.stages import warm_sync
        warm_sync.enable()
        print(warm_sync.call(os.getpid), flush=True)  # the child's pid: it is served
        warm_sync.call(time.sleep, 120)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert caller.stdout is not None
    first_child = int(caller.stdout.readline())
    assert first_child not in (caller.pid, server)

    def children() -> set[int]:
        """The server's live children (not the first one, served and gone)."""
        found = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == server and fields[0] != "Z":
                found.add(int(stat.parent.name))
        return found - {first_child}

    deadline = time.monotonic() + 30
    while not children():  # the sleeping child
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (sleeper,) = children()
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while sleeper in children():
        assert time.monotonic() < deadline, "the child outlived its caller"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["switch", "container", "library"])
def test_off_the_sync_runs_in_the_caller(
    warm: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "switch":
        monkeypatch.setenv(warm_sync.ENV_SWITCH, "0")
    elif how == "container":
        monkeypatch.setenv("LFBENCH_RUNTIME", "docker")
    else:
        monkeypatch.setattr(warm_sync, "_enabled", False)  # not a stage's process
    assert warm_sync.call(os.getpid) == os.getpid()


def test_the_server_s_name_follows_the_import_time_environment() -> None:
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    assert warm_sync.code_key(env) == warm_sync.code_key(dict(env))
    assert warm_sync.code_key(env) != warm_sync.code_key({**env, "OPENBLAS_CORETYPE": "Zen"})
    # a credential is read per call, not at import: it names no other server
    assert warm_sync.code_key(env) == warm_sync.code_key({**env, "MLFLOW_TRACKING_TOKEN": "s"})
