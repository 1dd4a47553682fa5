"""What a running `lfbench repro` publishes of itself: `.lfbench/repro-state.json`.

The driver holds DVC's lock for its whole run, so nothing else may take it meanwhile. It writes
its state here (atomically: a reader sees the previous state or the next, never half of one) when
a stage changes state and every few seconds while stages run: its pid, when it started, and per
stage its state (waiting, running, done, unchanged, restored, failed, skipped, stopped), times
and progress. `lfbench status` reads it; `lfbench plan` reads it to know that the lock it finds
held is a running `lfbench repro`'s (its pid alive and not finished), and then reads the project
without the lock (pipeline/dvc_internals.py: `status(..., lock=False)`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.core.io import atomic_write_text

STATE_FILE = Path(".lfbench") / "repro-state.json"


def state_path(root: Path) -> Path:
    return root / STATE_FILE


def publish(root: Path, state: dict[str, Any]) -> None:
    """The driver's state, replaced atomically."""
    path = state_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(state, indent=1) + "\n")


def read_state(root: Path) -> dict[str, Any] | None:
    """The last published state, or None (no run yet, or a file that is not one)."""
    try:
        data = json.loads(state_path(root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def alive(pid: Any) -> bool:
    """Whether a process of this pid runs here (one of another user's counts too)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_repro(root: Path) -> dict[str, Any] | None:
    """The state of an `lfbench repro` running in this project now (its driver alive, its run
    not over), or None."""
    state = read_state(root)
    if state is None or state.get("finished") is not None:
        return None
    return state if alive(state.get("pid")) else None
