"""Progress of a long step as log lines: what is done of how much, the rate and the time left.

A stage's long loops (embedding tens of thousands of texts, judging thousands of outputs) would
otherwise print one line when they start and one when they end, minutes apart. `Ticker` logs a
line at most every `every` seconds while work is left, so a user (or a CI log) sees that the
stage moves and roughly when it ends. The model client has its own (a bar on a terminal).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

EVERY_S = 15.0


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


class Ticker:
    """`advance(n)` after each piece of work; a log line every `every` seconds (none for a step
    that ends sooner), e.g. `embedding: 5,120/25,437 texts (20%), 96/s, about 3 min 31 s left`."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        total: int,
        unit: str,
        *,
        every: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.what = what
        self.total = total
        self.unit = unit
        self.every = every
        self.done = 0
        self._clock = clock
        self.t0 = self._clock()
        self.last = self.t0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self._clock()
        if now - self.last < self.every or self.done >= self.total:
            return
        self.last = now
        rate = self.done / max(now - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        self.log.info(
            "%s: %s/%s %s (%d%%), %.0f/s, about %s left",
            self.what,
            f"{self.done:,}",
            f"{self.total:,}",
            self.unit,
            100 * self.done // max(self.total, 1),
            rate,
            _duration(left),
        )
