"""`lfbench repro --cluster` and `lfbench worker` on toy projects with a real Dask scheduler and
real workers on loopback: what they refuse before doing anything (a clone whose code is not the
commit), and what is not a reason to refuse (DVC's own lines in a .gitignore)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, dvc_workspace, run, run_env

GEN = textwrap.dedent(
    """
    import json, pathlib, sys
    pathlib.Path("out").mkdir(exist_ok=True)
    pathlib.Path(f"out/{sys.argv[1]}.json").write_text(json.dumps({"model": sys.argv[1]}))
    """
)


def _commit(ws: Path, msg: str) -> None:
    run(["git", "add", "-A"], ws)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg], ws)


def _models(ws: Path, *models: str) -> None:
    (ws / "params.yaml").write_text(yaml.safe_dump({"models": list(models)}))


@pytest.fixture
def team(tmp_path: Path) -> dict[str, Path]:
    """An origin project (a stage per model writing out/<model>.json, out/.gitignore committed
    as DVC wrote it), pushed to a DVC remote folder, and two clones of it: the driver's and a
    worker's."""
    remote = tmp_path / "remote"
    origin = dvc_workspace(tmp_path / "origin", remote)
    (origin / "gen.py").write_text(GEN)
    (origin / ".gitignore").write_text(".lfbench/\n")
    pipeline = {
        "stages": {
            "gen": {
                "matrix": {"m": "${models}"},
                "cmd": "python gen.py ${item.m}",
                "deps": ["gen.py"],
                "outs": ["out/${item.m}.json"],
            }
        }
    }
    (origin / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    _models(origin, "m1")
    run(["dvc", "repro"], origin)
    run(["dvc", "push"], origin)
    _commit(origin, "m1")
    out = {"remote": remote}
    for name in ("driver", "w1"):
        run(["git", "clone", "-q", str(origin), str(tmp_path / name)], tmp_path)
        run(["dvc", "pull", "-q"], tmp_path / name)
        out[name] = tmp_path / name
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _scheduler(work: Path) -> Iterator[str]:
    sched_file = work / "scheduler.json"
    proc = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--scheduler-file", str(sched_file), "--no-dashboard"],
        cwd=work, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield json.loads(sched_file.read_text())["address"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def _worker(address: str, clone: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        ["lfbench", "worker", address, "--clone", str(clone), "--jobs", "2", "--name",
         clone.name],
        cwd=clone, env=run_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        from distributed import Client

        with Client(address, timeout="30s") as c:
            c.wait_for_workers(1, timeout=120)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        from distributed import Client

        with Client(address, timeout="30s") as c:  # gone from the scheduler too
            deadline = time.monotonic() + 30
            while c.scheduler_info()["workers"] and time.monotonic() < deadline:
                time.sleep(0.2)


def test_dvc_s_own_gitignore_lines_do_not_make_the_next_cluster_run_refuse(
    team: dict[str, Path], tmp_path: Path
) -> None:
    """A cluster run that adds a model leaves DVC's line for its output in out/.gitignore (a
    tracked file) in the driver's workspace and in the worker's clone. The next cluster run
    goes on (the bug: "commit these first: out/.gitignore"), and so does the worker; a line
    of the user's in a .gitignore is still a change to commit."""
    driver, w1 = team["driver"], team["w1"]
    shared = {
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "LFBENCH_CACHE_URL": f"sqlite:///{tmp_path / 'llm.sqlite'}",
    }
    with _scheduler(tmp_path) as address, _worker(address, w1, shared):
        repro = ["lfbench", "repro", "--cluster", address]
        _models(driver, "m1", "m2")
        run(repro, driver, shared)
        assert "/m2.json" in (driver / "out" / ".gitignore").read_text()
        assert "/m2.json" in (w1 / "out" / ".gitignore").read_text()
        assert "out/.gitignore" in run(["git", "status", "--porcelain"], driver).stdout
        _models(driver, "m1", "m2", "m3")
        proc = run(repro, driver, shared, check=False)
        assert proc.returncode == 0, proc.stderr
        assert (driver / "out" / "m3.json").exists()
        assert "Data and pipelines are up to date" in run(["dvc", "status"], driver).stdout
        with (driver / "out" / ".gitignore").open("a") as f:
            f.write("/scratch/\n")
        proc = run(repro, driver, shared, check=False)
        assert proc.returncode == 2 and "commit these first: out/.gitignore" in proc.stderr


def test_a_worker_whose_clone_is_not_its_commit_does_not_start(team: dict[str, Path]) -> None:
    """`lfbench worker` in a clone with an edited tracked file refuses at once, naming the
    clone and the file (the bug: it joined and ran stages with the edited code)."""
    w1 = team["w1"]
    (w1 / "gen.py").write_text(GEN + "# an edit\n")
    proc = subprocess.run(
        ["lfbench", "worker", "tcp://127.0.0.1:1", "--clone", str(w1), "--name", "w1"],
        cwd=w1, env=run_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "worker w1" in proc.stderr and "gen.py" in proc.stderr and str(w1) in proc.stderr
