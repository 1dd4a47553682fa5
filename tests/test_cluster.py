"""`lfbench repro --cluster` and `lfbench worker` on toy projects with a real Dask scheduler and
real workers on loopback: what they refuse before doing anything (an address that is no
scheduler's, a worker's stores the driver does not share, a clone whose code is not the
commit), and what is not a reason to refuse (DVC's own lines in a .gitignore)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
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


def test_workers_that_would_write_to_stores_the_driver_does_not_share_are_refused(
    team: dict[str, Path], tmp_path: Path
) -> None:
    """With no MLflow store or response cache named, each clone writes its own (mlruns/,
    .lfbench/cache/): the rows a worker's aggregate logs would be in the worker's store, and
    the driver's `lfbench compare` would find none; "nothing sent twice" would not hold across
    workers. The driver refuses before running anything (the bug: it compared None with None
    and ran), naming what to set; `--no-shared-cache` lets each worker keep its own cache, not
    its own MLflow store. The same SQLite files on one machine are shared: accepted."""
    driver, w1 = team["driver"], team["w1"]
    _models(driver, "m1", "m2")  # gen@m2 to run
    with _scheduler(tmp_path) as address, _worker(address, w1, {}):
        proc = run(["lfbench", "repro", "--cluster", address], driver, check=False)
        assert proc.returncode == 2, proc.stderr
        err = proc.stderr
        assert "MLFLOW_TRACKING_URI" in err and "LFBENCH_CACHE_URL" in err, err
        assert "--no-shared-cache" in err and str(w1) in err and "Traceback" not in err
        assert not (driver / "out" / "m2.json").exists()
        assert not (w1 / ".lfbench" / "logs").exists()  # nothing ran on the worker

        proc = run(
            ["lfbench", "repro", "--cluster", address, "--no-shared-cache"], driver, check=False
        )
        assert proc.returncode == 2 and "MLFLOW_TRACKING_URI" in proc.stderr, proc.stderr
        assert "LFBENCH_CACHE_URL" not in proc.stderr

    shared = {
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "LFBENCH_CACHE_URL": f"sqlite:///{tmp_path / 'llm.sqlite'}",
    }
    with _scheduler(tmp_path) as address, _worker(address, w1, shared):
        proc = run(["lfbench", "repro", "--cluster", address], driver, shared, check=False)
        assert proc.returncode == 0, proc.stderr
    assert json.loads((driver / "out" / "m2.json").read_text()) == {"model": "m2"}


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


# ---------------------------------------------------------------- addresses


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with nothing to do (its one stage done and committed)."""
    ws = dvc_workspace(tmp_path_factory.mktemp("idle") / "ws")
    (ws / "dvc.yaml").write_text("stages:\n  a:\n    cmd: echo a > a.txt\n    outs: [a.txt]\n")
    run(["dvc", "repro"], ws)
    _commit(ws, "a")
    return ws


@contextlib.contextmanager
def _http_server() -> Iterator[int]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("not a url", "not a Dask scheduler address"),
        ("http://127.0.0.1:8787", "a web URL"),
        ("tcp://alice:hunter2@127.0.0.1:8786", "tcp://***@127.0.0.1:8786: an address with a user"),
        ("tcp://127.0.0.1", "no port"),
        ("tcp://127.0.0.1:1", "nothing listens there (connection refused)"),
        ("HTTP_PORT", "no Dask scheduler answered within 10 s"),
    ],
)
def test_a_cluster_address_is_checked_first_even_with_nothing_to_do(
    idle: Path, address: str, said: str
) -> None:
    """Every `--cluster` address is checked before anything else, even when no stage has to
    run (the bug: nothing to do, exit 0; else 30 s and a traceback, "Unable to allocate 3.01
    EiB" on an HTTP port, the password printed): one line naming it, its password masked, in
    the connect timeout."""
    with _http_server() as port:
        address = address.replace("HTTP_PORT", f"tcp://127.0.0.1:{port}")
        t0 = time.monotonic()
        proc = subprocess.run(
            ["lfbench", "repro", "--cluster", address],
            cwd=idle, env=run_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout
    assert took < 30


def test_a_worker_says_what_it_waits_for_and_gives_up(
    team: dict[str, Path], tmp_path: Path
) -> None:
    """`lfbench worker` with no scheduler at its address says what it waits for, and ends
    after its connect timeout (the bug: it printed nothing and waited forever)."""
    w1 = team["w1"]
    address = f"tcp://127.0.0.1:{_free_port()}"
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["lfbench", "worker", address, "--clone", str(w1)],
            cwd=w1, env=run_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "waiting for" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f"waiting for the Dask scheduler at {address} (up to 120 s)" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    t0 = time.monotonic()
    done = subprocess.run(
        ["lfbench", "worker", address, "--clone", str(w1), "--connect-timeout", "3"],
        cwd=w1, env=run_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"no Dask scheduler answered at {address} within 3 s" in done.stderr
    assert time.monotonic() - t0 < 40
