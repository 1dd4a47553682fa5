"""Helpers of the kill-and-resume e2e tests: read a JSONL output or a stage's journal, and SIGKILL
a `dvc repro` once its journal holds enough finished answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.conftest import BIN


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def journaled(journal: Path) -> list[dict[str, Any]]:
    """The journal's finished answers (a torn last line is skipped)."""
    done = []
    for ln in (journal.read_text() if journal.exists() else "").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            done.append(json.loads(ln))
    return done


def kill_after(project: Path, target: str, journal: Path, n: int, env: dict[str, str]) -> int:
    """Start `dvc repro target`, SIGKILL it once `n` answers are journaled; how many were."""
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **env}
    proc = subprocess.Popen(
        ["dvc", "repro", target],
        cwd=project,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while len(journaled(journal)) < n:
        assert proc.poll() is None, f"{target} ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    return len(journaled(journal))
