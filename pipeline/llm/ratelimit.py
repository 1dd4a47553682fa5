"""An async rate limiter for requests/minute and tokens/minute (both optional).

Virtual scheduling (a leaky bucket without burst): each acquisition reserves the next free slot
of each budget and sleeps until then, so N requests at R per minute take at least (N-1)*60/R s.
Token costs are estimates at acquisition; :meth:`RateLimiter.reconcile` moves the schedule by
the difference once the real usage is known.
"""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    def __init__(self, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
        if requests_per_minute is not None and requests_per_minute <= 0:
            raise ValueError("requests_per_minute must be > 0")
        if tokens_per_minute is not None and tokens_per_minute <= 0:
            raise ValueError("tokens_per_minute must be > 0")
        self._req_interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._tok_rate = tokens_per_minute / 60.0 if tokens_per_minute else 0.0
        self._next_req = 0.0
        self._next_tok = 0.0

    @property
    def active(self) -> bool:
        return bool(self._req_interval or self._tok_rate)

    async def acquire(self, tokens: int) -> None:
        """Wait for a slot for one request of about `tokens` tokens."""
        now = time.monotonic()
        start = now
        if self._req_interval:
            start = max(start, self._next_req)
            self._next_req = start + self._req_interval
        if self._tok_rate:
            start = max(start, self._next_tok)
            self._next_tok = max(self._next_tok, now) + tokens / self._tok_rate
        # no await between reading and updating the schedule: safe without a lock
        delay = start - now
        if delay > 0:
            await asyncio.sleep(delay)

    def reconcile(self, estimated: int, actual: int) -> None:
        """Correct the token schedule once the real usage of a request is known."""
        if self._tok_rate and actual >= 0:
            self._next_tok += (actual - estimated) / self._tok_rate
