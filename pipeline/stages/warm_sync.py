"""A stage's MLflow sync in a warm process: the same `tracking.sync`, without importing MLflow.

Importing MLflow and its SQLAlchemy store costs a results, aggregate or agreement stage about
1.7 CPU-seconds, ten times what the sync itself costs in a store it finds unchanged. So the
first such stage of a machine starts a small server (`python -m pipeline.stages.warm_sync`)
that imports them once, and later stages hand their sync to it: for each request it forks a
child, which takes the caller's environment and folder, runs `tracking.sync` with the caller's
arguments and sends back the report, the exception or the log records, which the caller then
raises or logs as its own. What the sync writes is what the stage itself would write (the
child is the same code, the sync keeps its lock and its rules, tests/stages/test_warm_sync.py).

- **Only stage processes** use it (`lfbench run|stage`, `enable()`), and `lfbench compare` for
  its reads of the store (the same function's value, computed in the child), only with the
  local runtime (not in a container), only on Linux (a fork without exec is not safe on
  macOS), and not when `LFBENCH_WARM_SYNC=0`. A library call stays in-process.
- **One server per code**: its socket's name hashes the Python, the installed MLflow, Alembic
  and SQLAlchemy, every file of `pipeline/` (path, size, mtime) and the environment variables
  read at import (`IMPORT_ENV`). An edit or an upgrade names another server; the old one ends
  when idle for `IDLE_S`. The socket is in a folder only this user can enter.
- **The server's environment** holds no secret: the path, the locale and the import-time
  variables. Each request carries the caller's environment to the child only.
- **Anything wrong falls back to the stage's own sync**: no server (the first stage starts one
  and syncs itself), a server gone mid-request, arguments the server cannot load. A caller that
  dies (Ctrl-C, a kill) takes its child down at once, as a sync in the stage's own process
  would end: its pending runs are cleaned by the next sync (`tracking`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import logging
import os
import pickle
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO, TypeVar

log = logging.getLogger(__name__)

ENV_SWITCH = "LFBENCH_WARM_SYNC"  # "0": every sync in the stage's own process
IDLE_S = 20.0  # the server ends after this long without a request
# Variables a module reads when it is imported (numpy's and OpenBLAS's kernels, MLflow's logging
# set-up): the server is started with the caller's values, and its name depends on them.
IMPORT_ENV = (
    "OPENBLAS_",
    "NPY_",
    "OMP_",
    "MKL_",
    "MPLBACKEND",
    "MLFLOW_CONFIGURE_LOGGING",
    "MLFLOW_LOGGING_LEVEL",
    "MLFLOW_DISABLE_TELEMETRY",
    "DO_NOT_TRACK",
)
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME")
PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")  # where imports come from
HEADER = struct.Struct("!Q")
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on the BSDs

_enabled = False
_warm_here = False  # set in a child of the warm stage server (pipeline.stages.warm_stage)
T = TypeVar("T")


def enable() -> None:
    """This process is a stage's (`lfbench run|stage`): its syncs may go to the warm server."""
    global _enabled
    _enabled = True


def _wanted() -> bool:
    from pipeline.core.lineage import ENV_RUNTIME

    return (
        _enabled
        and os.environ.get(ENV_SWITCH, "1") != "0"
        and os.environ.get(ENV_RUNTIME, "local") == "local"
        and sys.platform == "linux"  # fork without exec is not safe on macOS
        and not _warm_here  # a stage forked from the warm stage server has MLflow imported
    )


# ---------------------------------------------------------------- where the server is


def import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(IMPORT_ENV)}


def code_key(env: dict[str, str] | None = None) -> str:
    """What a server must share with its caller: the Python, the store's libraries, the code of
    `pipeline/` and the import-time environment."""

    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0".encode())
    for dist in ("mlflow-skinny", "alembic", "sqlalchemy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            h.update(f"{dist}={metadata.version(dist)}\0".encode())
    hash_package(h, "*.py")
    for k, v in import_env(dict(os.environ if env is None else env)).items():
        h.update(f"{k}={v}\0".encode())
    return h.hexdigest()[:20]


def hash_package(h: Any, pattern: str) -> None:
    """Feed `h` each file of `pipeline/` that matches `pattern` (path, size, mtime), bytecode
    caches left out: an edit names another server."""
    import pipeline

    package = Path(pipeline.__file__).resolve().parent
    for path in sorted(package.rglob(pattern)):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())


def socket_dir() -> Path | None:
    """This user's folder for the servers' sockets (mode 0700), or None if it is not safe."""
    folder = Path(tempfile.gettempdir()) / f"lfbench-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


# ---------------------------------------------------------------- the wire


def send(conn: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(HEADER.pack(len(data)) + data)


def recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(conn: socket.socket) -> Any:
    (size,) = HEADER.unpack(recv_exact(conn, HEADER.size))
    return pickle.loads(recv_exact(conn, size))


# ---------------------------------------------------------------- the caller


def call(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`func(*args, **kwargs)` (a module-level function) in a child of the warm server when
    there is one; else here, after starting one for the next caller."""
    if not _wanted():
        return func(*args, **kwargs)
    folder = socket_dir()
    if folder is None:
        return func(*args, **kwargs)
    key = code_key()
    path = folder / f"sync-{key}.sock"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:  # TMPDIR too deep for a socket's name
        return func(*args, **kwargs)
    loggers = {
        name: lg.level
        for name, lg in logging.root.manager.loggerDict.items()
        if isinstance(lg, logging.Logger) and lg.level
    }
    request = {
        "env": dict(os.environ),
        "cwd": str(Path.cwd()),
        "func": (func.__module__, func.__qualname__),
        "args": args,
        "kwargs": kwargs,
        "levels": {"": logging.root.level, **loggers},
    }
    try:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - an argument that does not pickle: a lock, a lambda
        log.debug("warm sync: arguments not sent (%s: %s); syncing here", type(e).__name__, e)
        return func(*args, **kwargs)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        start_server("pipeline.stages.warm_sync", path, key, func.__module__, caller_path=False)
        return func(*args, **kwargs)
    with conn:
        try:
            conn.sendall(HEADER.pack(len(data)) + data)
            status, value, records = recv(conn)
        except Exception as e:  # noqa: BLE001 - a server gone, an answer not read: the sync
            # is idempotent, so doing it here is safe whatever the child did
            log.debug("warm sync server %s: %s; syncing here", path.name, e)
            return func(*args, **kwargs)
    for record in records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)
    if status == "ok":
        log.debug("synced by the warm sync server %s", path.name)
        return value  # type: ignore[no-any-return]
    if status == "here":  # the server could not take it: nothing was done there
        log.debug("warm sync server %s: %s; syncing here", path.name, value)
        return func(*args, **kwargs)
    raise value


def start_server(module: str, path: Path, key: str, preload: str, *, caller_path: bool) -> None:
    """Start `python -m module path key preload` in the background, detached, in `/`, its
    stderr in a log beside its socket (a server exits at once if another holds its lock; see
    `claim`). Its environment holds no secret: the path, the locale, the import-time variables
    and, with `caller_path` (a server whose key hashes them), the caller's `PYTHONPATH`,
    `PYTHONHOME` and `PYTHONSAFEPATH`; `pipeline/`'s own folder first on its path."""
    import pipeline

    env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
    env |= import_env(dict(os.environ))
    if caller_path:
        env |= {k: os.environ[k] for k in PATH_ENV if k in os.environ}
    root = str(Path(pipeline.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        with path.with_suffix(".log").open("ab") as err:
            subprocess.Popen(
                [sys.executable, "-m", module, str(path), key, preload],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd="/",
                env=env,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as e:
        log.debug("%s not started: %s", module, e)


def claim(path: Path) -> tuple[TextIO, socket.socket, int] | None:
    """A server's start: its lock (None when another server of this key holds it; the lock file
    names the pid that serves) and its socket at `path`, bound before any import (callers
    meanwhile are refused, and do their work themselves), with the socket's inode: the server
    ends when `path` is another file (another server's socket, or the folder was cleaned)."""
    lock = path.with_suffix(".lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # who serves (tests/stages/test_warm_sync.py)
    lock.flush()
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o600)
    return lock, server, path.stat().st_ino


def replaced(path: Path, ino: int) -> bool:
    """The server's socket is gone or another file: time for it to end."""
    try:
        return path.stat().st_ino != ino
    except OSError:
        return True


def release(path: Path, ino: int, server: socket.socket) -> None:
    """A server's end: its socket file (if still its own) and its listening socket."""
    with contextlib.suppress(OSError):
        if path.stat().st_ino == ino:
            path.unlink()
    server.close()


# ---------------------------------------------------------------- the server


def serve(path: Path, key: str, preload: str = "", idle_s: float = IDLE_S) -> None:
    """Listen on `path` until idle for `idle_s` (or until its socket is replaced), forking a
    child per request. Returns at once if another server of this key holds the lock."""
    claimed = claim(path)
    if claimed is None:
        return
    _lock, server, ino = claimed  # held until this process ends
    # warm: what every sync imports (not matplotlib: a child draws with its caller's settings);
    # callers meanwhile are refused and sync themselves
    import mlflow.tracking  # noqa: F401
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401

    if preload:  # the module of the function its first caller hands over (no import up here)
        importlib.import_module(preload)

    server.listen(64)
    server.settimeout(1.0)
    children: set[int] = set()
    last = time.monotonic()
    try:
        while True:
            for pid in list(children):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                children.discard(pid)
            if replaced(path, ino):
                break
            if not children and time.monotonic() - last > idle_s:
                break
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            last = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: one request, then out
                server.close()
                code = 0
                try:
                    _child(conn)
                except BaseException:  # noqa: BLE001 - nothing may escape into the server loop
                    code = 1
                os._exit(code)
            conn.close()
            children.add(pid)
    finally:
        release(path, ino, server)
        for pid in children:  # let running syncs finish
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


class _Keep(logging.Handler):
    """Keeps the child's log records, made picklable, for its caller to log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args, record.exc_info = record.getMessage(), None, None
        self.records.append(record)


def _die_with_caller(conn: socket.socket) -> None:
    """The caller never writes after its request: an end of file means it is gone."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    os.kill(os.getpid(), signal.SIGKILL)


def _child(conn: socket.socket) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    keep = _Keep()
    try:
        request = recv(conn)
        module, name = request["func"]
        func: Any = importlib.import_module(module)
        for part in name.split("."):
            func = getattr(func, part)
    except Exception as e:  # noqa: BLE001 - a class only the caller has, another code
        send(conn, ("here", f"request not loaded: {type(e).__name__}: {e}", []))
        return
    threading.Thread(target=_die_with_caller, args=(conn,), daemon=True).start()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(keep)
    for logger_name, level in request["levels"].items():
        logging.getLogger(logger_name or None).setLevel(level)
    try:
        value = func(*request["args"], **request["kwargs"])
        answer: tuple[str, Any, list[logging.LogRecord]] = ("ok", value, keep.records)
    except Exception as e:  # noqa: BLE001 - the caller raises it as its own
        log.debug("in the warm sync server:\n%s", traceback.format_exc())
        try:
            pickle.dumps(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            from pipeline.core.errors import LfbenchError

            e = LfbenchError(f"{type(e).__name__}: {e}")
        answer = ("err", e, keep.records)
    send(conn, answer)


if __name__ == "__main__":  # pragma: no cover - started by `start_server`
    serve(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
