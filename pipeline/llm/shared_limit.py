"""One `max_concurrency` per endpoint across the stages of one `lfbench repro` (issue 42).

A stage's client keeps at most `max_concurrency` requests in flight (its workers). Under
`lfbench repro --jobs N` several stages of one endpoint (SummHay's and Long²RAG's generate
stages of one model, a judge shared by two benchmarks) run at once, each with its own client,
on one machine or on a cluster's workers: the server would see that many times the limit.

When `lfbench repro` runs a stage it tells it its Dask scheduler (`LFBENCH_SCHEDULER`, the
address the worker running the stage reaches it at: the driver's local cluster on 127.0.0.1, or
the `--cluster` scheduler). The client then holds one lease of a Dask distributed `Semaphore`
per attempt on the wire: the semaphore is named after the endpoint (its base URL's server and
path, without user, password or query, and its model: never a key) and has `max_concurrency`
leases, so every stage of every machine calling that endpoint shares them. Without a scheduler
(plain `dvc repro`, `lfbench run` by hand, tests) nothing changes: the client's own workers
are the limit.

- **A holder that dies.** Leases are refreshed by the stage's Dask client every fifth of
  Dask's `distributed.scheduler.locks.lease-timeout` (30 s by default); the scheduler gives back
  the leases of a stage killed mid-request once they go that long unrefreshed (checked every
  `lease-validation-interval`, 10 s): at most about 40 s of a smaller limit, never a larger one.
- **Cost.** An acquire is one round trip to the scheduler before each attempt (about a
  millisecond on loopback, `perf/endpoint_limit.py`); the release is sent without waiting.
- **Two settings of one endpoint.** Entries of `models`/`judges` naming the same base URL and
  model with different `max_concurrency` cannot share one semaphore (Dask keeps one size per
  name): the stage says so in its log and shares a semaphore only with stages of its own size.
- **Per-minute budgets.** `requests_per_minute` / `tokens_per_minute`, when set, are shared
  too (:class:`SharedRateLimiter`: the client's schedule in the scheduler's metadata, under a
  Dask `Lock`).
- **Where it cannot.** A stage whose Python has no `distributed` (the pinned image does not
  install it yet) or that cannot reach the scheduler says so in its log and keeps its own limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger(__name__)

ENV_SCHEDULER = "LFBENCH_SCHEDULER"
CONNECT_S = 10.0


def endpoint_key(base_url: str, model: str) -> str:
    """The endpoint: its server and path (scheme, host, port, path without a trailing slash;
    never a user name, password, query or fragment, where keys go) and its model."""
    from urllib.parse import urlsplit

    parts = urlsplit(base_url.strip())
    host = (parts.hostname or "").lower()
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme.lower()}://{host}{port}{parts.path.rstrip('/')} {model}"


def semaphore_name(base_url: str, model: str, max_leases: int | None = None) -> str:
    """The Dask semaphore of an endpoint: readable (the model), unique (a digest of the
    endpoint key), never a secret; with `max_leases` when two settings of it differ."""
    digest = hashlib.sha256(endpoint_key(base_url, model).encode("utf-8")).hexdigest()[:16]
    name = f"lfbench-endpoint-{model[:40]}-{digest}"
    return name if max_leases is None else f"{name}-{max_leases}"


class EndpointSlots:
    """The leases of one endpoint's semaphore: `async with slots.hold(): <one attempt>`."""

    def __init__(self, client: Any, semaphore: Any, name: str) -> None:
        self.client = client
        self.semaphore = semaphore
        self.name = name
        # the endpoint's per-minute budgets, shared too (`shared_rates`); None: none set
        self.limiter: SharedRateLimiter | None = None
        self._releases: set[asyncio.Future[Any]] = set()
        self.acquired = 0

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        await self.semaphore.acquire()
        self.acquired += 1
        try:
            yield
        finally:
            # not waited for: the next request of this worker starts without a round trip
            # (the scheduler's count goes down a moment later: never above the limit)
            fut = asyncio.ensure_future(self.semaphore.release())
            self._releases.add(fut)
            fut.add_done_callback(self._releases.discard)

    def shared_rates(self, rpm: float | None, tpm: float | None) -> SharedRateLimiter | None:
        """The endpoint's requests/tokens-per-minute budgets, shared by every stage calling it
        (None when neither is set)."""
        if not rpm and not tpm:
            return None
        self.limiter = SharedRateLimiter(self.client, self.name, rpm, tpm)
        return self.limiter

    async def aclose(self) -> None:
        if self.limiter is not None:
            await self.limiter.aclose()
        with contextlib.suppress(Exception):
            if self._releases:
                await asyncio.wait(set(self._releases), timeout=5.0)
        with contextlib.suppress(Exception):
            self.semaphore.refresh_callback.stop()
        with contextlib.suppress(Exception):
            await self.client.close()


class SharedRateLimiter:
    """The endpoint's requests/tokens-per-minute budgets shared by every stage calling it: the
    schedule of :class:`pipeline.llm.ratelimit.RateLimiter` (the next free request slot, the
    time the token budget is spent to; wall-clock seconds, as the stages' machines agree on
    them) kept in the Dask scheduler's metadata (`Client.set_metadata`), read and moved under a
    Dask `Lock` (4 round trips to the scheduler per request). Same interface as `RateLimiter`;
    a stage's own budget applies to the requests it sends (two stages of one endpoint with
    other budgets each push the shared schedule by their own interval)."""

    def __init__(self, client: Any, name: str, rpm: float | None, tpm: float | None) -> None:
        from distributed import Lock

        self._client = client
        self._lock = Lock(f"{name}-rate-lock", scheduler_rpc=client.scheduler, loop=client.loop)
        self._key = ["lfbench-rate", name]  # the schedule: in the scheduler's metadata
        self._req_interval = 60.0 / rpm if rpm else 0.0
        self._tok_rate = tpm / 60.0 if tpm else 0.0
        self._pending: set[asyncio.Future[Any]] = set()

    @property
    def active(self) -> bool:
        return bool(self._req_interval or self._tok_rate)

    async def _move(self, step: Any) -> Any:
        await self._lock.acquire()
        try:
            # (not a Variable: its get of a value not set yet is an ERROR in the scheduler's log)
            state = await self._client.get_metadata(self._key, default=None)
            state, out = step(dict(state or {"req": 0.0, "tok": 0.0}))
            await self._client.set_metadata(self._key, state)
        finally:
            await self._lock.release()
        return out

    async def acquire(self, tokens: int) -> None:
        """Wait for a slot for one request of about `tokens` tokens."""

        def take(state: dict[str, float]) -> tuple[dict[str, float], float]:
            import time

            now = time.time()
            start = now
            if self._req_interval:
                start = max(start, state["req"])
                state["req"] = start + self._req_interval
            if self._tok_rate:
                start = max(start, state["tok"])
                state["tok"] = max(state["tok"], now) + tokens / self._tok_rate
            return state, start - now

        delay = await self._move(take)
        if delay > 0:
            await asyncio.sleep(delay)

    def reconcile(self, estimated: int, actual: int) -> None:
        """Correct the shared token schedule once the real usage of a request is known (sent
        without waiting)."""
        if not (self._tok_rate and actual >= 0):
            return
        shift = (actual - estimated) / self._tok_rate

        def move(state: dict[str, float]) -> tuple[dict[str, float], None]:
            state["tok"] += shift
            return state, None

        fut = asyncio.ensure_future(self._move(move))
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            if self._pending:
                await asyncio.wait(set(self._pending), timeout=5.0)
        with contextlib.suppress(Exception):
            self._lock.refresh_callback.stop()


async def open_slots(
    base_url: str, model: str, max_concurrency: int, label: str
) -> EndpointSlots | None:
    """The endpoint's shared slots when `lfbench repro` gave this stage a scheduler
    (`LFBENCH_SCHEDULER`); None otherwise, or (with a warning) when they cannot be had."""
    address = os.environ.get(ENV_SCHEDULER, "").strip()
    if not address:
        return None
    from pipeline.core.types import shown_url

    shown = f"{shown_url(base_url)} ({model})"
    try:
        from distributed import Client, Semaphore
    except ImportError:
        log.warning(
            "%s: this Python has no Dask distributed: max_concurrency %d applies to this stage"
            " alone, not to every stage calling %s",
            label, max_concurrency, shown,
        )  # fmt: skip
        return None
    for name in ("distributed", "tornado"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        client = await asyncio.wait_for(
            Client(address, asynchronous=True, timeout=f"{CONNECT_S}s", set_as_default=False),
            CONNECT_S + 5,
        )
    except Exception as e:  # noqa: BLE001 - the stage still runs, under its own limit
        log.warning(
            "%s: the scheduler at %s did not answer (%s): max_concurrency %d applies to this"
            " stage alone",
            label, address, type(e).__name__, max_concurrency,
        )  # fmt: skip
        return None
    name = semaphore_name(base_url, model)
    for attempt in (name, semaphore_name(base_url, model, max_concurrency)):
        sem = Semaphore(
            max_leases=max_concurrency, name=attempt, scheduler_rpc=client.scheduler,
            loop=client.loop,
        )  # fmt: skip
        try:
            await sem
        except ValueError as e:  # another size for this endpoint, registered by another stage
            with contextlib.suppress(Exception):
                sem.refresh_callback.stop()
            log.warning(
                "%s: %s is also used with another max_concurrency (%s): this stage shares its"
                " %d slots only with stages of the same setting",
                label, shown, e, max_concurrency,
            )  # fmt: skip
            continue
        log.info(
            "%s: at most %d requests in flight to %s across the stages of this run",
            label, max_concurrency, shown,
        )  # fmt: skip
        return EndpointSlots(client, sem, attempt)
    await client.close()
    return None
