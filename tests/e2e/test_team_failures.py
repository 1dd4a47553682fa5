"""`lfbench team up` when things go wrong (issue 26 points 12 and 13): a port answered by another
server is an error naming it (no `team.env` pointing at someone else's server), a failed or killed
`team up` leaves nothing running and can be run again in the same folder (same secrets), and
`team down` stops everything `team up` started, by the PIDs recorded in the folder. Small: real
PostgreSQL and MLflow on loopback, no `dvc repro`."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.env.team import pg_bindir
from tests.conftest import ROOT, run

try:
    pg_bindir()
except LfbenchError:
    pytest.skip("PostgreSQL's server programs are not installed", allow_module_level=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _processes_of(folder: Path) -> list[str]:
    """Command lines of running processes that name the folder (postmaster, mlflow, weed)."""
    out = subprocess.run(["pgrep", "-af", str(folder)], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "pgrep" not in ln]


def _team_pids(folder: Path) -> dict[str, int]:
    state = json.loads((folder / "state.json").read_text())
    return {k: int(v["pid"]) for k, v in state.items() if isinstance(v, dict) and "pid" in v}


@pytest.fixture()
def folder() -> Iterator[Path]:
    # not under pytest's tmp_path (mode 0700): as root, the server runs as `postgres`
    f = Path(tempfile.mkdtemp(prefix="lfbench-team-"))
    yield f
    if (f / "state.json").exists() or (f / "postgres" / "postmaster.pid").exists():
        run(["lfbench", "team", "down", "--dir", str(f)], ROOT, check=False)
    shutil.rmtree(f, ignore_errors=True)


@pytest.fixture()
def other_server() -> Iterator[int]:
    """Another team's HTTP server (it answers /health) on a loopback port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


def test_mlflow_port_of_another_server_is_an_error_naming_it(
    folder: Path, other_server: int
) -> None:
    """Point 12: before, `team up` exited 0 and team.env named the other team's server."""
    proc = run(
        ["lfbench", "team", "up", "--dir", str(folder), "--mlflow-port", str(other_server)],
        ROOT,
        check=False,
    )
    assert proc.returncode != 0
    assert f"port {other_server}" in proc.stderr and "already in use" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (folder / "team.env").exists() and not (folder / "state.json").exists()
    assert _processes_of(folder) == []


def test_a_port_answered_by_someone_else_is_not_taken_for_ours(other_server: int) -> None:
    """The identity check after a start (the port was free at the pre-check, then another
    server took it first): the process we started is not the one listening: an error."""
    from pipeline.env.team import check_listener

    ours = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with pytest.raises(LfbenchError, match=f"port {other_server} .* another server"):
            check_listener("the MLflow server", "127.0.0.1", other_server, ours)
    finally:
        ours.kill()
        ours.wait()
    with pytest.raises(LfbenchError, match="exited"):
        check_listener("the MLflow server", "127.0.0.1", other_server, ours)
    # and a server we started is recognised as ours
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    script = (
        "import socket, time; s = socket.socket();"
        f" s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(30)"
    )
    mine = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        check_listener("a server", "127.0.0.1", port, mine)
    finally:
        mine.kill()
        mine.wait()


def test_failed_and_killed_team_up_then_up_again_then_down_leaves_nothing(folder: Path) -> None:
    """Point 13: a busy PostgreSQL port fails `team up` cleanly; a `team up` killed half-way
    (its postmaster running) is stopped by `team down` by PID; `team up` again in the same
    folder works with the same password; `team down` then leaves no process of the folder."""
    # 1. PostgreSQL's port busy (a socket bound and listening here)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = int(busy.getsockname()[1])
    try:
        proc = run(
            ["lfbench", "team", "up", "--dir", str(folder), "--pg-port", str(port)],
            ROOT,
            check=False,
        )
    finally:
        busy.close()
    assert proc.returncode != 0 and f"port {port}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (folder / "team.env").exists() and _processes_of(folder) == []

    # 2. a `team up` killed once its PostgreSQL runs (before MLflow is up)
    up = subprocess.Popen(
        [str(Path(sys.executable).parent / "lfbench"), "team", "up", "--dir", str(folder)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 45
        while "postgres" not in (_team_pids(folder) if (folder / "state.json").exists() else {}):
            assert up.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait()
    pids = _team_pids(folder)
    password = (folder / "secrets.env").read_text()
    assert _alive(pids["postgres"])
    down = run(["lfbench", "team", "down", "--dir", str(folder)], ROOT, check=False)
    assert down.returncode == 0, down.stderr
    assert not any(_alive(p) for p in pids.values()), pids

    # 3. up again in the same folder: the cluster the killed attempt made, the same password
    run(["lfbench", "team", "up", "--dir", str(folder)], ROOT)
    assert (folder / "secrets.env").read_text() == password
    env = (folder / "team.env").read_text()
    pids = _team_pids(folder)
    assert set(pids) == {"postgres", "mlflow"} and all(_alive(p) for p in pids.values())
    assert f":{json.loads((folder / 'state.json').read_text())['mlflow']['port']}" in env

    # 4. down: nothing of the folder is left
    run(["lfbench", "team", "down", "--dir", str(folder)], ROOT)
    assert not any(_alive(p) for p in pids.values()), pids
    assert _processes_of(folder) == []


def test_team_down_never_signals_a_recorded_pid_now_held_by_another_program(
    folder: Path,
) -> None:
    """A PID in state.json may since belong to another program (after a reboot): `team down`
    checks the command line before it signals it."""
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        state = {"folder": str(folder), "complete": True, "mlflow": {"pid": other.pid}}
        (folder / "state.json").write_text(json.dumps(state))
        run(["lfbench", "team", "down", "--dir", str(folder)], ROOT)
        time.sleep(0.3)
        assert other.poll() is None  # still running: not ours
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as `postgres` only under root")
def test_a_team_folder_postgres_cannot_reach_is_an_error_naming_the_parent() -> None:
    """Under a `mktemp -d` folder (mode 0700) initdb, run as `postgres`, failed with a traceback;
    now an error naming the folder it cannot enter, before anything starts."""
    parent = Path(tempfile.mkdtemp(prefix="lfbench-team-private-"))
    try:
        proc = run(["lfbench", "team", "up", "--dir", str(parent / "team")], ROOT, check=False)
        assert proc.returncode != 0
        assert f"cannot enter {parent} (mode 700)" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (parent / "team" / "postgres").exists()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
