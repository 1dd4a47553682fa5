"""Issue 36, points 7 and 8: lfbench against an MLflow store that is not there, or whose URI
holds a password. A quick failure in one line, MLflow's retries bounded, the password never in
an error, a log line or a command line (real sockets, a real HTTP server, a real PostgreSQL)."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.stages.tracking import RunSpec, sync
from tests.conftest import BIN, ROOT, run_env

SECRET = "s3cret-pw"


class _Listener:
    """A TCP server on loopback that counts connections and either closes each at once
    (`reset`) or holds it without a word (`silent`)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.held: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            if self.mode == "reset":
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.thread.join(timeout=5)
        for c in self.held:
            c.close()
        self.sock.close()


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[_Listener]:
    lst = _Listener(request.param)
    try:
        yield lst
    finally:
        lst.close()


class _Busy(http.server.BaseHTTPRequestHandler):
    """An MLflow server that is up (`/health` answers) and fails every API call with 503."""

    api_calls = 0

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/health"):
            self._answer(200, b"OK")
        else:
            type(self).api_calls += 1
            self._answer(503, b"busy")

    do_POST = do_GET

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _no_secret(text: str) -> None:
    assert SECRET not in text, text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("listener", ["reset"], indirect=True)
def test_compare_against_a_server_that_is_not_there(listener: _Listener, tmp_path: Path) -> None:
    """Before: MLflow retried the refused requests for four minutes (8 connections), then a
    traceback printed the URI with its password."""
    uri = f"http://user:{SECRET}@127.0.0.1:{listener.port}"
    proc = subprocess.run(
        [str(BIN / "lfbench"), "compare", "0" * 32, "1" * 32],
        cwd=tmp_path,
        env=run_env({"MLFLOW_TRACKING_URI": uri}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    _no_secret(proc.stdout + proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"error: MLflow tracking server http://user:***@127.0.0.1:{listener.port}"
    )
    assert listener.accepted == 1  # asked once, not retried


@pytest.fixture
def busy_server() -> Iterator[int]:
    _Busy.api_calls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


_SPEC = RunSpec(row_key="k", name="n", metrics={"m": 1.0}, params={}, tags={}, artifacts={})


def test_a_failing_server_is_retried_a_bounded_number_of_times(
    busy_server: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: MLflow sent each call 8 times (7 retries, about four minutes of backoff)."""
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:{SECRET}@127.0.0.1:{busy_server}")
    with pytest.raises(LfbenchError) as err:
        sync("summhay", [_SPEC], tmp_path, producer="summhay-aggregate")
    message = str(err.value)
    _no_secret(message)
    assert message.startswith(f"MLflow store http://user:***@127.0.0.1:{busy_server}: logging")
    assert len(message.splitlines()) == 1
    assert _Busy.api_calls == 3  # one call and its 2 retries, not 8


@pytest.mark.parametrize("listener", ["silent"], indirect=True)
def test_a_server_that_never_answers(
    listener: _Listener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes the connection and never answers: refused after one unanswered
    request (before: MLflow waited 120 s for each of 8 tries)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:{SECRET}@127.0.0.1:{listener.port}")
    with pytest.raises(LfbenchError, match=r"no answer from 127\.0\.0\.1") as err:
        sync("summhay", [_SPEC], tmp_path, producer="summhay-aggregate")
    _no_secret(str(err.value))
    assert listener.accepted == 1


def _session(pid: int) -> list[int]:
    """The processes of the session `pid` leads (it and what it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == pid:  # field 6 of stat: the session id
            found.append(int(entry.name))
    return found


def test_ui_on_a_postgresql_store_keeps_its_password_out_of_logs_and_argv(
    postgres: Any, tmp_path: Path
) -> None:
    """Before: the first log line printed the URI with its password, and mlflow got it on its
    command line (readable by every user of the machine in `ps`)."""
    postgres.create_database("ui_secret")
    uri = f"postgresql+psycopg://lfbench:{SECRET}@127.0.0.1:{postgres.port}/ui_secret"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log_path = tmp_path / "ui.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(BIN / "lfbench"), "ui", "--port", str(port)],
            cwd=ROOT,
            env=run_env({"MLFLOW_TRACKING_URI": uri}),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"lfbench ui did not come up:\n{log_path.read_text()}")
            time.sleep(0.5)
        argvs = []
        for pid in _session(proc.pid):
            try:
                argvs.append((Path("/proc") / str(pid) / "cmdline").read_bytes().decode())
            except OSError:
                continue
        assert argvs and any("mlflow" in a for a in argvs)
        for argv in argvs:
            assert SECRET not in argv, argv.replace("\0", " ")
        text = log_path.read_text()
        assert (
            f"(store postgresql+psycopg://lfbench:***@127.0.0.1:{postgres.port}/ui_secret)" in text
        )
        _no_secret(text)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _no_secret(log_path.read_text())


def _schema(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """A SQLite store's schema (every table, index, trigger: the clauses of its statement,
    in any order, as MLflow's migrations write a table's constraints in no fixed order), its
    Alembic revision and its experiments (without their times)."""
    import sqlite3

    def clauses(sql: str | None) -> tuple[str, ...]:
        return tuple(sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))

    with contextlib.closing(sqlite3.connect(db)) as c:
        return (
            [
                (kind, name, table, clauses(sql))
                for kind, name, table, sql in c.execute(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
                )
            ],
            c.execute("SELECT * FROM alembic_version").fetchall(),
            c.execute(
                "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments"
            ).fetchall(),
        )


def test_a_new_sqlite_store_is_a_copy_of_mlflows_own_empty_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new project's store starts from the template `mlflow db upgrade` made (no migration of
    its own), and is then what MLflow makes of a file it migrates itself: same tables, indexes,
    revision, and its Default experiment in this project."""
    from mlflow.tracking import MlflowClient

    from pipeline.stages import mlflow_store, tracking

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    proj = tmp_path / "proj"
    proj.mkdir()
    monkeypatch.chdir(proj)
    tracking._client(proj).search_experiments()
    (template,) = (tmp_path / "cache" / "lfbench").glob("mlflow-schema-*.db")
    assert _schema(template)[2] == []  # the schema only: no experiment in it
    seeded = proj / "mlruns" / "mlflow.db"
    # a second store: seeded from the template that is there now, not migrated
    other = proj / "mlruns" / "other.db"
    assert mlflow_store.seed_sqlite_store(f"sqlite:///{other}")
    assert not mlflow_store.seed_sqlite_store(f"sqlite:///{other}")  # there: left as it is
    assert _schema(other)[:2] == _schema(template)[:2]

    # what MLflow makes of a file it migrates itself, in the same folder
    mlflows = proj / "mlruns" / "mlflow-made.db"
    MlflowClient(tracking_uri=f"sqlite:///{mlflows}").search_experiments()
    made, ours = _schema(mlflows), _schema(seeded)
    assert ours == made
    assert [e[1] for e in ours[2]] == ["Default"]
    assert str(proj / "mlruns") in ours[2][0][2]
