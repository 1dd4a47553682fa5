"""The live view of `lfbench repro --jobs`: which stages run, wait, are done, and each running
stage's progress (requests done / total, from the model client).

On a terminal, a table redrawn in place (rich): the running stages with their progress and
time, the failed ones, and a count of the others. Elsewhere (CI, a log file), one line per
change of state and, every 30 s, one line per running stage.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from pipeline.runner.driver import (
    DONE,
    FAILED,
    RUNNING,
    SKIPPED,
    STOPPED,
    WAITING,
    StageState,
)
from pipeline.runner.steps import RESTORED, UNCHANGED

STYLE = {
    RUNNING: "bold cyan",
    DONE: "green",
    RESTORED: "green",
    UNCHANGED: "dim",
    FAILED: "bold red",
    SKIPPED: "yellow",
    STOPPED: "yellow",
    WAITING: "",
}
EVERY_S = 30.0


def progress_text(st: StageState, now: float | None = None) -> str:
    p = st.progress
    if not p or not p.get("total"):
        return ""
    text = f"{p.get('done', 0)}/{p['total']} requests"
    if p.get("errors"):
        text += f", {p['errors']} errors"
    return text + clock_text(p, time.time() if now is None else now)


def clock_text(p: Mapping[str, Any], now: float) -> str:
    """The stage's clock from the model client's progress (wall-clock seconds): the time left
    at the rate so far (`t0`: its first batch began) and the age of the oldest request on the
    wire (`oldest`); a stale one shows a server that holds it (or a queue before it)."""
    out = ""
    done, total, t0, oldest = p.get("done", 0), p.get("total", 0), p.get("t0"), p.get("oldest")
    if isinstance(t0, int | float) and 0 < done < total and now > t0:
        out += f", ETA {_clock((total - done) * (now - t0) / done)}"
    if isinstance(oldest, int | float) and done < total:
        out += f", oldest {_clock(max(0.0, now - oldest))}"
    return out


def _clock(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


QUEUED = "queued"  # submitted, waiting for one of the --jobs slots (shown, not a state)


def shown_state(st: StageState) -> str:
    """What the view calls a stage: a running one whose task has no slot yet is queued."""
    return QUEUED if st.state == RUNNING and st.began is None else st.state


def elapsed(st: StageState, now: float) -> str:
    if st.started is None:
        return ""
    return f"{(st.ended or now) - st.started:.0f} s"


class LiveView:
    def __init__(self, stream: Any = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._seen: dict[str, str] = {}
        self._last_beat = time.monotonic()
        self._live: Any = None

    # -- terminal

    def _table(self, states: Mapping[str, StageState]) -> Any:
        from rich.table import Table

        now = time.monotonic()
        counts: dict[str, int] = {}
        for st in states.values():
            counts[shown_state(st)] = counts.get(shown_state(st), 0) + 1
        title = "  ".join(f"{k} {v}" for k, v in counts.items())
        table = Table(title=f"lfbench repro: {title}", title_justify="left", expand=False)
        table.add_column("stage")
        table.add_column("state")
        table.add_column("progress")
        table.add_column("time", justify="right")
        shown = [s for s in states.values() if s.state in (RUNNING, FAILED)]
        shown += [s for s in states.values() if s.state == WAITING][:5]
        for st in sorted(shown, key=lambda s: (s.state != RUNNING, s.index)):
            state = shown_state(st)
            table.add_row(
                st.name,
                f"[{STYLE[st.state]}]{state}[/]" if STYLE[st.state] else state,
                progress_text(st) or st.why,
                elapsed(st, now),
            )
        return table

    # -- lines

    def _lines(self, states: Mapping[str, StageState], final: bool) -> None:
        now = time.monotonic()
        for st in sorted(states.values(), key=lambda s: s.index):
            if self._seen.get(st.name) == st.state:
                continue
            self._seen[st.name] = st.state
            if st.state == WAITING:
                continue
            extra = f" ({st.why})" if st.why else ""
            took = f" in {elapsed(st, now)}" if st.state in (DONE, FAILED) and st.started else ""
            print(f"stage {st.name}: {st.state}{took}{extra}", file=self.stream, flush=True)
        if not final and now - self._last_beat >= EVERY_S:
            self._last_beat = now
            for st in states.values():
                if st.state == RUNNING:
                    p = progress_text(st)
                    print(
                        f"stage {st.name}: running {elapsed(st, now)}" + (f", {p}" if p else ""),
                        file=self.stream,
                        flush=True,
                    )

    def update(self, states: Mapping[str, StageState], final: bool = False) -> None:
        if not self.live:
            self._lines(states, final)
            return
        from rich.console import Console
        from rich.live import Live

        if self._live is None:
            self._live = Live(
                self._table(states),
                console=Console(file=self.stream),
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()
        self._live.update(self._table(states))
        if final:
            self._live.stop()
            self._live = None
