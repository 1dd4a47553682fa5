"""Which process: a key that names one process of one boot of one machine, and whether it ended.

`parent_pid()` is the process that started this one: its own parent, or, in a stage forked from
the warm stage server (`pipeline.stages.warm_stage`), the parent of the caller it stands in for
(the `dvc repro` that ran the stage, not the server). `this_process()` is `boot id/PID
namespace/PID/start time` (from /proc), or "unknown" where /proc
does not say (another OS). `process_gone(key)` is True or False for a process of this boot of
this machine in this PID namespace, None when that cannot be checked from here (another host, a
container, another OS): the caller then falls back on an age or a lease. Used by the MLflow
sync's pending runs (`pipeline.stages.tracking`) and the embedding cache's claims
(`pipeline.local_judge.embeddings`).
"""

from __future__ import annotations

import os
from pathlib import Path

_stand_in_parent: int | None = None


def parent_pid() -> int:
    """The process that started this one (as `os.getppid`), the warm stage server's caller's
    parent in a stage the server forked (`stand_in_for`)."""
    return os.getppid() if _stand_in_parent is None else _stand_in_parent


def stand_in_for(caller_parent: int) -> None:
    """This process runs a stage for a caller whose parent is `caller_parent`."""
    global _stand_in_parent
    _stand_in_parent = caller_parent


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state first), None if the process is
    gone (or there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat), None if it is gone (or
    there is no /proc): with the PID it names one process of one boot."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def parent_of(pid: int) -> int | None:
    """A process's parent, None if it is gone or its parent is init (or the kernel)."""
    fields = _stat(pid)
    ppid = None if fields is None else int(fields[1])
    return ppid if ppid is not None and ppid > 1 else None


def this_process() -> str:
    """This process: `boot id/PID namespace/PID/start time`, or "unknown"."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        pidns = str(Path("/proc/self/ns/pid").readlink())
    except OSError:
        return "unknown"
    start = start_time(os.getpid())
    return "unknown" if start is None else f"{boot}/{pidns}/{os.getpid()}/{start}"


def process_gone(key: str) -> bool | None:
    """Whether the process `key` names has ended: True or False when it ran on this boot of
    this machine in this PID namespace, None when that cannot be checked from here."""
    parts, here = key.split("/"), this_process().split("/")
    if len(parts) != 4 or len(here) != 4 or parts[:2] != here[:2]:
        return None
    pid, start = parts[2], parts[3]
    return not pid.isdigit() or start_time(int(pid)) != start
