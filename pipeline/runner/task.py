"""One stage of `lfbench repro --jobs`, as a Dask task: run its command, report, stop on demand.

The driver (`pipeline/runner/driver.py`) decides what runs and does every DVC step itself
(`pipeline/runner/steps.py`); a task only runs a stage's command, the way `dvc repro` runs it
(the user's shell with `--noprofile --norc -c`, `DVC_ROOT` and `DVC_STAGE` set), with its
output in a log file, and returns its exit status. While it runs, the task

- tells the stage the scheduler's address (`LFBENCH_SCHEDULER`): every stage of an endpoint
  shares its `max_concurrency` through a Dask semaphore there (`pipeline/llm/shared_limit.py`);
- publishes the stage's progress (`requests done / total` from the model client's progress
  file, `LFBENCH_PROGRESS_FILE`) as Dask events the driver's live view subscribes to;
- watches two Dask events of the run: `stop` (the first Ctrl-C: the stage gets one SIGINT and
  lets its requests in flight finish into its journal) and `abandon` (the second: SIGINT again,
  then SIGKILL after a few seconds);
- starts the command in its own session, so that a terminal's Ctrl-C reaches it once, from
  here, and asks the kernel to kill it if the worker dies (`setpriv --pdeathsig`): a worker killed
  mid-stage leaves no orphan sending requests while Dask retries the stage elsewhere.

On a cluster (`lfbench worker`), the task is `pipeline/runner/worker.py`'s `run_in_clone`: the
same command run, with the same DVC steps around it, in the worker's own clone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.llm.shared_limit import ENV_SCHEDULER

ENV_PROGRESS = "LFBENCH_PROGRESS_FILE"
POLL_S = 0.5
KILL_AFTER_S = 10.0  # after the second Ctrl-C, SIGKILL if the stage is still there
# the files of the driver's workspace a worker's clone takes as they are (the pipeline's
# definition, and the lock with the stages finished so far)
SHIPPED = ("params.yaml", "dvc.yaml", "dvc.lock")


def stop_event(run: str) -> str:
    return f"lfbench-stop-{run}"


def abandon_event(run: str) -> str:
    return f"lfbench-abandon-{run}"


def progress_topic(run: str) -> str:
    return f"lfbench-progress-{run}"


@dataclass
class TaskSpec:
    """What the driver sends for one stage (plain data: it crosses to a cluster's workers)."""

    run: str  # this `lfbench repro`'s id (event and topic names)
    stage: str  # DVC's address, e.g. summhay-generate@qwen
    cmds: list[str]
    env: dict[str, str]  # on top of the worker's environment
    cores: int  # LFBENCH_WORKERS / LFBENCH_EMBED_WORKERS for the stage (0: not limited)
    cwd: str | None = None  # local: the driver's workspace; cluster: None (the worker's clone)
    cluster: dict[str, Any] = field(default_factory=dict)  # worker.py's payload


@dataclass
class TaskResult:
    stage: str
    rc: int
    host: str
    log: str  # where the stage's output is (on `host`)
    seconds: float
    stopped: bool = False  # a stop or abandon reached it
    lock_entry: dict[str, Any] | None = None  # cluster: the stage's dvc.lock entry
    files: dict[str, bytes] = field(default_factory=dict)  # cluster: its uncached outputs
    how: str = "ran"  # cluster: ran | restored (from the run cache) | unchanged
    error: str | None = None
    # cluster: seconds in each part (waiting for the clone, pulling, running, pushing)
    phases: dict[str, float] = field(default_factory=dict)


def log_path(root: Path, stage: str) -> Path:
    safe = stage.replace("/", "_").replace("@", "@")
    return root / ".lfbench" / "logs" / f"{safe}.log"


def progress_path(root: Path, run: str, stage: str) -> Path:
    return root / ".lfbench" / "progress" / run / f"{stage.replace('/', '_')}.json"


def shell_argv(cmd: str) -> list[str]:
    """The command line `dvc repro` runs a stage's command with (dvc/stage/run.py), under
    util-linux's `setpriv --pdeathsig KILL` where it exists: the kernel kills the stage when the
    worker that started it dies (no `preexec_fn`: it is unsafe in a threaded worker)."""
    executable = os.environ.get("SHELL") or "/bin/sh"
    name = Path(executable).name.lower()
    opts = {"bash": ["--noprofile", "--norc"], "zsh": ["--no-rcs"]}.get(name, [])
    guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
    return [*guard, executable, *opts, "-c", cmd]


def _events(run: str) -> tuple[Any, Any, Callable[[dict[str, Any]], None]]:
    """The run's stop and abandon events and a progress publisher (no-ops outside Dask)."""
    try:
        from distributed import Event, get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return None, None, lambda msg: None
    return (
        Event(stop_event(run)),
        Event(abandon_event(run)),
        lambda msg: worker.log_event(progress_topic(run), msg),
    )


def scheduler_address() -> str | None:
    """The address this Dask worker reaches its scheduler at, when a subprocess can too (tcp://
    or tls://, not in-process comms): given to the stage (`LFBENCH_SCHEDULER`) for its
    endpoints' shared slots (`pipeline/llm/shared_limit.py`)."""
    try:
        from distributed import get_worker

        address = str(get_worker().scheduler.address)
    except (ImportError, ValueError, AttributeError):
        return None
    return address if address.startswith(("tcp://", "tls://")) else None


def began(spec: TaskSpec) -> None:
    """Tell the driver this stage holds one of its worker's slots now (a stage submitted while
    `--jobs` stages run waits in Dask's queue first): the live view counts only these as running.
    A no-op outside Dask."""
    try:
        from distributed import get_worker

        get_worker().log_event(progress_topic(spec.run), {"stage": spec.stage, "began": True})
    except (ImportError, ValueError):
        pass


def _is_set(event: Any) -> bool:
    if event is None:
        return False
    try:
        return bool(event.is_set())
    except Exception:  # noqa: BLE001 - the scheduler went away: the driver is gone too
        return True


def run_commands(
    spec: TaskSpec,
    cwd: Path,
    log: Path,
    env: dict[str, str],
) -> tuple[int, bool]:
    """Run the stage's commands one after another in `cwd`; returns (exit status, stopped)."""
    stop, abandon, publish = _events(spec.run)
    progress = progress_path(cwd, spec.run, spec.stage)
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.unlink(missing_ok=True)
    env = {**env, ENV_PROGRESS: str(progress)}
    address = scheduler_address()
    if address is not None:  # one max_concurrency per endpoint across the stages of the run
        env[ENV_SCHEDULER] = address
    if spec.cores > 0:
        env["LFBENCH_WORKERS"] = env["LFBENCH_EMBED_WORKERS"] = str(spec.cores)
    log.parent.mkdir(parents=True, exist_ok=True)
    stopped = False
    with log.open("ab") as out:
        for cmd in spec.cmds:
            out.write(f"> {cmd}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                shell_argv(cmd),
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            sent = 0.0
            signals = 0
            last = None
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if signals == 0 and _is_set(stop):
                    signals, sent, stopped = 1, time.monotonic(), True
                    _signal(proc, signal.SIGINT)
                if signals == 1 and _is_set(abandon):
                    signals, sent = 2, time.monotonic()
                    _signal(proc, signal.SIGINT)
                if signals == 2 and time.monotonic() - sent > KILL_AFTER_S:
                    _signal(proc, signal.SIGKILL)
                    signals = 3
                now = _read_progress(progress)
                if now is not None and now != last:
                    last = now
                    publish({"stage": spec.stage, **now})
            now = _read_progress(progress)
            if now is not None and now != last:
                publish({"stage": spec.stage, **now})
            if rc != 0 or stopped:
                return rc, stopped
    return 0, stopped


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _read_progress(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_here(spec: TaskSpec) -> TaskResult:
    """The Dask task of `lfbench repro --jobs`: one stage's command, in the driver's workspace
    (`spec.cwd`); the driver does the DVC steps around it."""
    started = time.monotonic()
    began(spec)
    assert spec.cwd is not None
    cwd = Path(spec.cwd)
    log = log_path(cwd, spec.stage)
    log.unlink(missing_ok=True)
    env = {**os.environ, **spec.env, "DVC_ROOT": str(cwd), "DVC_STAGE": spec.stage}
    rc, stopped = run_commands(spec, cwd, log, env)
    return TaskResult(
        spec.stage, rc, socket.gethostname(), str(log), time.monotonic() - started, stopped
    )
