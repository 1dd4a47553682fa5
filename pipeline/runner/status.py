"""`lfbench status`: the state a running `lfbench repro` publishes (pipeline/core/live.py), as
lines: what is done, running (with its progress) and left, and what failed or was not run.

It reads one file, replaced atomically by the driver, and nothing of DVC: it answers while the
run holds the project's DVC lock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

FINISHED = ("done", "unchanged", "restored")
LEFT = ("waiting",)
NOT_RUN = ("failed", "skipped", "stopped")


def _progress(stage: Mapping[str, Any]) -> str:
    p = stage.get("progress") or {}
    if not p.get("total"):
        return ""
    text = f"{p.get('done', 0)}/{p['total']} requests"
    return text + (f", {p['errors']} errors" if p.get("errors") else "")


def _took(stage: Mapping[str, Any], now_s: float) -> str:
    start, end = stage.get("started"), stage.get("ended")
    if start is None:
        return ""
    return f"{(end if end is not None else now_s) - start:.0f} s"


def _names(stages: Sequence[Mapping[str, Any]], states: Sequence[str]) -> list[Mapping[str, Any]]:
    return [s for s in stages if s.get("state") in states]


def status_lines(state: Mapping[str, Any], alive: bool, now: float | None = None) -> list[str]:
    """The state as lines: a heading (the run, its driver, how long), then done, running,
    left, and failed or not run, one stage a line."""
    now = time.time() if now is None else now
    stages: list[Mapping[str, Any]] = list(state.get("stages") or [])
    # seconds since the run started, as the stages' times are (the state's own clock)
    now_s = float(state.get("elapsed_s") or 0.0)
    if state.get("finished") is None and alive:
        now_s += max(0.0, now - float(state.get("updated_at") or now))
    finished = state.get("finished")
    if finished is not None:
        how = f"{finished}, after {now_s:.0f} s"
    elif alive:
        how = f"running for {now_s:.0f} s"
    else:
        how = f"stopped without finishing (driver pid {state.get('pid')} is gone)"
    head = (
        f"lfbench repro {state.get('run')} (pid {state.get('pid')}, --jobs {state.get('jobs')}):"
        f" {how}"
    )
    done = _names(stages, FINISHED)
    running = _names(stages, ("running",))
    left = _names(stages, LEFT)
    bad = _names(stages, NOT_RUN)
    counts = f"{len(done)} done, {len(running)} running, {len(left)} left"
    lines = [head, counts + (f", {len(bad)} failed or not run" if bad else "")]
    if not stages:
        lines.append("(planning: the stages are not known yet)")
    for title, group in (("done", done), ("running", running), ("left", left)):
        if group:
            lines.append(f"{title}:")
        for s in group:
            extra = [
                x
                for x in (
                    s.get("state") if title == "done" else "",
                    _progress(s) if title == "running" else "",
                    _took(s, now_s),
                )
                if x
            ]
            lines.append(f"  {s['stage']}" + (f"  ({', '.join(extra)})" if extra else ""))
    if bad:
        lines.append("failed or not run:")
        lines += [f"  {s['stage']}  ({s.get('state')}: {s.get('why') or '?'})" for s in bad]
    return lines
