"""A whole stage process forked from a warm one: `lfbench run|stage` without its imports.

Every dvc.yaml stage is a new `lfbench run` process, and before its work each one imports the
CLI, the params models and the benchmark packages, and, depending on the stage, SciPy, bm25s,
NLTK's BLEU or MLflow: 0.6-3 CPU-seconds of a stage that often does less work than that. So
`lfbench run|stage` (`pipeline.launch`) first asks a warm server, which has imported all of
them once, to fork a child that *is* the stage process: it takes the caller's standard input,
output and error (the file descriptors themselves), its arguments, environment, folder, umask
and `sys.path`, runs the entry point its caller names (`pipeline.cli:main`) and exits with
the stage's status, which the caller then exits with (a stage killed by a signal: the caller
re-raises that signal on itself).

- **The caller stands in for the stage.** SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2 sent to
  it are sent on to the stage's process group (what a Ctrl-C or a `kill` of the group would
  reach); a caller that dies (SIGKILL) takes the whole group down at once: nothing the stage
  started outlives it. The caller's own CPU is an interpreter's start (about 0.05 s).
- **One server per code** (`code_key`): the Python, the installed distributions (the
  `.dist-info` names of each `sys.path` folder), `sys.path`, every file of `pipeline/` (path,
  size, mtime) and the variables modules read at import (`warm_sync.IMPORT_ENV`). An edit or an
  install names another server; the old one ends when it has been idle for `IDLE_S`. Its socket
  is in a folder only this user can enter (`warm_sync.socket_dir`).
- **Anything wrong runs the stage in the caller**, as before: no server yet (the first caller
  starts one and runs its own stage meanwhile), a server still importing, a child that could not
  take the request. Once the child runs the stage, its status is the caller's.
- **On by default** where the warm sync runs: Linux (fork without exec) and the local runtime
  (not inside a container). `LFBENCH_WARM_STAGES=0` turns it off: every stage is then its own
  process. The test suite's CPU went from 2,929 to 2,396 CPU-seconds with it (`perf/test_cpu.py`,
  the same fresh clone both times, every test passing).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import os
import pickle
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

from pipeline.stages import warm_sync

ENV_SWITCH = "LFBENCH_WARM_STAGES"  # "0": each stage its own process, importing what it needs
# `pipeline.core.lineage.ENV_RUNTIME` (set inside a stage's container), not imported: the caller
# imports nothing it does not need (tests/stages/test_warm_stage.py checks they are the same)
ENV_RUNTIME = "LFBENCH_RUNTIME"
IDLE_S = 120.0  # the server ends after this long with no stage running and no request
# Imported once by the server: what the stages import before and during their work.
PRELOAD = (
    "pipeline.stages.commands",
    "pipeline.stages.construct",
    "pipeline.stages.retrieve",
    "pipeline.stages.generate",
    "pipeline.stages.judge",
    "pipeline.stages.train_judge",
    "pipeline.stages.aggregate",
    "pipeline.stages.agreement",
    "pipeline.stages.tracking",
    "pipeline.env.runtime",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "scipy.stats",
    "scipy.sparse",
    "bm25s",
    "nltk.translate.bleu_score",
)
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def wanted(argv: list[str]) -> bool:
    """Whether this `lfbench` command line may run in a child of the warm server."""
    return (
        argv[1:2] in (["run"], ["stage"])
        and os.environ.get(ENV_SWITCH, "1") != "0"
        and os.environ.get(ENV_RUNTIME, "local") == "local"
        and sys.platform == "linux"
        and hasattr(os, "pidfd_open")
    )


def code_key(env: dict[str, str] | None = None) -> str:
    """What a server must share with its caller to stand in for its process."""

    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0".encode())
    for entry in sys.path:
        h.update(f"{entry}\0".encode())
        with contextlib.suppress(OSError):
            # the installed distributions and their versions (an install, an upgrade or a
            # removal changes these names); not the folder's mtime, which any new file moves
            for dist in sorted(Path(entry or ".").glob("*.dist-info")):
                h.update(f"{dist.name}\0".encode())
    warm_sync.hash_package(h, "*")
    source = os.environ if env is None else env
    for k, v in warm_sync.import_env(dict(source)).items():
        h.update(f"{k}={v}\0".encode())
    for k in warm_sync.PATH_ENV:
        h.update(f"{k}={source.get(k, '')}\0".encode())
    return h.hexdigest()[:20]


# ---------------------------------------------------------------- the caller


def _streams() -> dict[str, dict[str, Any]]:
    """How this interpreter set up its standard streams (from the locale, PYTHONIOENCODING,
    PYTHONUNBUFFERED and whether each is a terminal): the child sets up its own alike."""
    out: dict[str, dict[str, Any]] = {}
    for name in ("stdin", "stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, io.TextIOWrapper):
            out[name] = {
                "encoding": stream.encoding,
                "errors": stream.errors,
                "line_buffering": stream.line_buffering,
                "write_through": stream.write_through,
            }
    return out


def run_in_server(argv: list[str], entry: str) -> int | None:
    """Run this stage command (`entry`, "module:function", with `argv`) in a child of the warm
    server and return its exit status (a signal's death is re-raised here); None when the
    caller must run it itself. The server imports `entry`'s module when it starts: this layer
    names no module above it."""
    folder = warm_sync.socket_dir()
    if folder is None:
        return None
    key = code_key()
    path = folder / f"stage-{key}.sock"
    if len(os.fsencode(path)) > warm_sync.SOCKET_PATH_MAX:
        return None
    fds = [0, 1, 2]
    try:
        for fd in fds:
            os.fstat(fd)
    except OSError:
        return None  # a closed standard stream: nothing to hand over
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        warm_sync.start_server(
            "pipeline.stages.warm_stage", path, key, entry.partition(":")[0], caller_path=True
        )
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    request = {
        "argv": list(argv),
        "entry": entry,
        "env": dict(os.environ),
        "cwd": str(Path.cwd()),
        "umask": umask,
        "ppid": os.getppid(),
        "path": list(sys.path),
        "streams": _streams(),
        "cgroups": _cgroups(),
    }
    data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    sent: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        sent.append(signum)
        with contextlib.suppress(OSError):
            conn.sendall(bytes([signum]))

    with conn:
        try:
            socket.send_fds(conn, [warm_sync.HEADER.pack(len(data))], fds)
            conn.sendall(data)
            previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
            try:
                status, value = warm_sync.recv(conn)
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        except (OSError, ConnectionError, EOFError, pickle.UnpicklingError) as e:
            if not sent:  # before the child ran anything it could not have started: here
                return None if _refused(e) else _lost(path, e)
            return _lost(path, e)
    if status == "here":  # the child could not take it: nothing of the stage ran there
        return None
    code = os.waitstatus_to_exitcode(int(value))
    if code < 0:  # killed by a signal: so is its stand-in
        sys.stdout.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _refused(e: BaseException) -> bool:
    return isinstance(e, ConnectionRefusedError | BrokenPipeError | ConnectionResetError)


def _lost(path: Path, e: BaseException) -> int:
    print(
        f"error: the warm stage server {path.name} ended before the stage did ({e});"
        f" run it again, or set {ENV_SWITCH}=0 to run each stage in its own process",
        file=sys.stderr,
    )
    return 1


def _cgroups() -> list[str]:
    """This process's cgroups (/proc/self/cgroup): the child joins them, so what it spends is
    counted where the caller's would be (a container's limits, a per-test accounting)."""
    try:
        return Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []


def _join_cgroups(lines: list[str]) -> None:
    mine = set(_cgroups())
    for line in lines:
        if line in mine:
            continue
        _, controllers, group = line.split(":", 2)
        if controllers.startswith("name="):
            continue
        base = Path("/sys/fs/cgroup", controllers) if controllers else Path("/sys/fs/cgroup")
        with contextlib.suppress(OSError):
            (base / group.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))


# ---------------------------------------------------------------- the server


def serve(path: Path, key: str, preload: str = "", idle_s: float = IDLE_S) -> None:
    """Listen on `path` until idle for `idle_s` (or until its socket is replaced), forking a
    child per stage and sending each caller its child's wait status. Returns at once if another
    server of this key holds the lock."""
    claimed = warm_sync.claim(path)
    if claimed is None:
        return
    lock, server, ino = claimed
    _preload(preload)
    # what the imports made, out of the collector's reach: a child's collections would otherwise
    # walk (and so write to, and copy) every page of it
    gc.collect()
    gc.freeze()
    server.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, None)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the caller's socket)
    last = time.monotonic()
    try:
        while True:
            for sk, _ in sel.select(timeout=1.0):
                if sk.data is None:
                    conn, _ = server.accept()
                    pid = os.fork()
                    if pid == 0:
                        _child(conn, server, lock, sel, running)
                    pidfd = os.pidfd_open(pid)
                    running[pidfd] = (pid, conn)
                    sel.register(pidfd, selectors.EVENT_READ, pid)
                else:
                    _reaped(sk.fd, running, sel)
                last = time.monotonic()
            if warm_sync.replaced(path, ino):
                break
            if not running and time.monotonic() - last > idle_s:
                break
    finally:
        sel.unregister(server)
        warm_sync.release(path, ino, server)
        while running:  # the stages running still get their status
            for sk, _ in sel.select():
                _reaped(sk.fd, running, sel)


def _preload(entry_module: str) -> None:
    import importlib

    for module in (*([entry_module] if entry_module else []), *PRELOAD):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a module that fails here fails in the stage, named
            traceback.print_exc()
    with contextlib.suppress(Exception):
        from pipeline.core import registry

        registry.load_all()  # a broken package is the stage's error, raised there


def _reaped(pidfd: int, running: dict[int, tuple[int, socket.socket]], sel: Any) -> None:
    pid, conn = running.pop(pidfd)
    sel.unregister(pidfd)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    with conn, contextlib.suppress(OSError):
        warm_sync.send(conn, ("exit", status))


# ---------------------------------------------------------------- the child


def _child(
    conn: socket.socket,
    server: socket.socket,
    lock: Any,
    sel: selectors.BaseSelector,
    running: dict[int, tuple[int, socket.socket]],
) -> None:
    """In the forked child: become the caller's stage process, run it, exit with its status."""
    code = 1
    try:
        sel.close()
        for fd, (_, other) in running.items():  # the other stages' callers: not this one's
            os.close(fd)
            other.close()
        server.close()
        lock.close()
        os.setpgid(0, 0)  # the stage and what it starts: one group, signalled as one
        try:
            request = _take_request(conn)
        except Exception as e:  # noqa: BLE001 - nothing ran: the caller runs it
            with contextlib.suppress(OSError):
                warm_sync.send(conn, ("here", f"{type(e).__name__}: {e}"))
            os._exit(0)
        threading.Thread(target=_watch_caller, args=(conn,), daemon=True).start()
        code = _run_stage(request)
    except BaseException:  # noqa: BLE001 - nothing may return into the server's loop
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        os._exit(code)


def _take_request(conn: socket.socket) -> dict[str, Any]:
    msg, fds, _, _ = socket.recv_fds(conn, warm_sync.HEADER.size, 3)
    if len(msg) != warm_sync.HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("the caller's standard streams did not arrive")
    (size,) = warm_sync.HEADER.unpack(msg)
    request: dict[str, Any] = pickle.loads(warm_sync.recv_exact(conn, size))
    # the server's log (this process's stderr until the caller's takes its place): what ran
    line = f"{time.strftime('%H:%M:%S')} {os.getpid()}: {' '.join(request['argv'][1:3])}"
    os.write(2, f"{line} in {request['cwd']}\n".encode(errors="replace"))
    os.chdir(request["cwd"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    return request


def _watch_caller(conn: socket.socket) -> None:
    """Signals the caller received go to the stage's group; the caller gone ends the group."""
    while True:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:
            os.killpg(0, signal.SIGKILL)
            return
        for signum in data:
            with contextlib.suppress(OSError):
                os.killpg(0, signum)


def _run_stage(request: dict[str, Any]) -> int:
    import tempfile

    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.umask(request["umask"])
    sys.argv[:] = request["argv"]
    sys.path[:] = request["path"]
    tempfile.tempdir = None  # read TMPDIR again
    # a script's __main__, not this server's module: click names the program from it
    # (`lfbench stage`, not `python -m ...`), multiprocessing's spawn re-imports none
    sys.modules["__main__"] = types.ModuleType("__main__")
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if name in request["streams"]:
            stream = _std_stream(fd, request["streams"][name])
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
    _join_cgroups(request["cgroups"])
    warm_sync._warm_here = True  # MLflow is imported here: a sync has nothing to gain there
    from pipeline.core import procs

    procs.stand_in_for(request["ppid"])  # whose stage this is (one runtime decision per dvc run)
    code = 0
    try:
        import importlib

        module, _, name = request["entry"].partition(":")
        getattr(importlib.import_module(module), name)()
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as an interpreter ends on an uncaught Ctrl-C
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, status 1
        traceback.print_exc()
        code = 1
    _finish()
    return code


def _std_stream(fd: int, conf: dict[str, Any]) -> io.TextIOWrapper:
    """A standard stream on `fd` set up as the caller's interpreter set up its own."""
    mode = "rb" if fd == 0 else "wb"
    unbuffered = fd != 0 and conf["write_through"]
    buffer: Any = open(fd, mode, buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(buffer, **conf)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish() -> None:
    """What an interpreter does on its way out: wait for its threads, run the exit handlers
    (logging's, multiprocessing's, the stage's own), flush its streams."""
    import atexit

    shutdown = getattr(threading, "_shutdown", None)  # the interpreter's own: it first lets
    if shutdown is not None:  # idle thread pools end (their exit hooks), then joins
        shutdown()
    else:  # pragma: no cover - CPython has it
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


if __name__ == "__main__":  # pragma: no cover - started by `warm_sync.start_server`
    serve(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
