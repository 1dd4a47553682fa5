"""`lfbench repro` and `lfbench prune` alone in the project: before anything, no other DVC
command may be running in it.

A `dvc repro` holds the project's lock only around its own steps and lets go of it while a
stage's command runs; all that while, the stage's dependencies and outputs stay in DVC's rwlock
file (.dvc/tmp/rwlock) with its pid and command line. A run started then would fail with it,
and its stage's finished work would not be recorded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline import dvc_internals as dvc
from pipeline.core.errors import LfbenchError


def running_dvc(repo: Any) -> list[tuple[int, str]]:
    """The DVC commands running in this project now (pid, command line), other than this
    process: the live processes that DVC's rwlock file names. A pid reused by another program
    since is told apart by its command line."""
    found: dict[int, str] = {}
    for pid, cmd in dvc.rwlock_holders(repo):
        if pid == os.getpid() or pid in found:
            continue
        argv = _command_line(pid)
        if argv is None:
            continue
        if cmd and argv and not _same_command(argv, cmd):
            continue  # the pid is another program's now
        found[pid] = cmd
    return sorted(found.items())


def _command_line(pid: int) -> str | None:
    """A live process's command line ("" when it cannot be read), None when there is no
    such process (or a zombie, whose command line is empty)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return None
        try:  # no /proc: alive or not is all one can know
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    except OSError:  # another user's: it holds the paths all the same
        return ""
    if not raw:
        return None
    return " ".join(raw.rstrip(b"\0").decode("utf-8", "replace").split("\0"))


def _same_command(argv: str, cmd: str) -> bool:
    """Whether a process's command line is the one DVC recorded (its `sys.argv`): the same
    words at the end, the program's path aside (`python -m dvc repro` records
    `.../dvc/__main__.py repro`)."""
    if argv.endswith(cmd):
        return True
    want, have = cmd.split()[1:], argv.split()
    return bool(want) and have[-len(want) :] == want


def refuse_if_dvc_runs(repo: Any) -> None:
    """Stop, before doing anything, when another DVC command is running in this project (a
    `dvc repro` between two of its own steps): both would fail, and its stage's finished work
    would not be recorded."""
    running = running_dvc(repo)
    if running:
        pid, cmd = running[0]
        raise LfbenchError(
            f"a DVC command is running in this project (PID {pid}: {cmd or 'dvc'}); nothing"
            " was done: run this once it is done, or stop it first"
            + (f" ({len(running) - 1} more DVC processes)" if len(running) > 1 else "")
        )
