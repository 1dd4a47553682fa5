"""The LLM client every stage uses: OpenAI-compatible chat completions, cached, resumable.

``run_chat`` sends a batch of :class:`ChatRequest` to one endpoint and returns one
:class:`ChatResult` per request, in order, plus a :class:`UsageReport`:

- bounded concurrency (``max_concurrency``; under ``lfbench repro``, per endpoint across every stage
  calling it, on every machine: :mod:`pipeline.llm.shared_limit`) and an optional
  requests/tokens-per-minute limiter (shared the same way);
- its own retry loop: 408/409/429/5xx, timeouts, connection errors and answers that are not a
  valid completion are retried with exponential backoff and jitter, honouring ``Retry-After`` /
  ``retry-after-ms``; other 4xx fail the item at once; one bad item never fails the run;
- a content-addressed SQLite response cache (:func:`cache_key`), shared between processes;
- a resumable JSONL journal of finished items, so a killed run does not pay for them twice;
- a progress bar on a terminal, a log line every ~10 s otherwise; the API key is never logged.

Requests are plain OpenAI-compatible ``POST {base_url}/chat/completions`` calls over an aiohttp
connection pool (see :class:`_Sender` for why not the OpenAI SDK's request path).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import (
    INTERRUPT_GRACE_ENV,
    Interrupted,
    LfbenchError,
    interrupt_grace_s,
)
from pipeline.core.io import canonical_json, sha256_text, write_json
from pipeline.core.types import ChatRequest, ChatResult, EndpointConfig, UsageReport
from pipeline.llm.cache import CachedAnswer, CacheUnavailable, ResponseCache, backend_for
from pipeline.llm.journal import (
    Journal,
    JournalEntry,
    JournalWriter,
    clear_journal,
    load_journal,
)
from pipeline.llm.ratelimit import RateLimiter
from pipeline.llm.shared_limit import EndpointSlots, SharedRateLimiter, open_slots

__all__ = [
    "ChatRequest",
    "ChatResult",
    "EndpointConfig",
    "UsageReport",
    "cache_key",
    "clear_journal",
    "resolve_api_key",
    "run_chat",
    "run_chat_sync",
    "write_usage",
]

log = logging.getLogger("lfbench.llm")

NO_KEY_PLACEHOLDER = "sk-no-key-required"
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
RETRY_AFTER_CAP_S = 60.0
PROGRESS_LOG_EVERY_S = 10.0
RETRYABLE_STATUS = frozenset({408, 409, 429})
# finish_reason of an answer the server cut short: for length (max_tokens, or the context window
# full), or by its content filter. Such an answer is kept as it came (perhaps empty), flagged.
CUT_REASONS = frozenset({"length", "content_filter"})
CACHE_KEY_VERSION = 1


# ---------------------------------------------------------------- helpers


def resolve_api_key(endpoint: EndpointConfig, where: str) -> str:
    """The API key from the environment variable the endpoint names (a placeholder if none)."""
    name = endpoint.api_key_env
    if name is None:
        return NO_KEY_PLACEHOLDER
    value = os.environ.get(name, "")
    if not value.strip():
        raise LfbenchError(
            f"{where}: the API key environment variable {name} is not set"
            f" (set {name}, or change api_key_env for {where})"
        )
    return value.strip()


def effective_max_tokens(endpoint: EndpointConfig, request: ChatRequest) -> int:
    return request.max_tokens if request.max_tokens is not None else endpoint.max_tokens


def normalise_base_url(url: str) -> str:
    return url.strip().rstrip("/")


def request_seed(endpoint: EndpointConfig, request: ChatRequest) -> int | None:
    """The seed sent: the endpoint's seed plus the sample index, so that repeated samples of one
    prompt are different draws (with the same seed a seeded server would repeat its answer)."""
    return None if endpoint.seed is None else endpoint.seed + request.sample


def cache_key(endpoint: EndpointConfig, request: ChatRequest) -> str:
    """sha256 of everything that changes the answer (not the key, prices or client settings)."""
    payload = {
        "v": CACHE_KEY_VERSION,
        "base_url": normalise_base_url(endpoint.base_url),
        "model": endpoint.model,
        "messages": request.messages,
        "temperature": endpoint.temperature,
        "top_p": endpoint.top_p,
        "max_tokens": effective_max_tokens(endpoint, request),
        "seed": endpoint.seed,
        "response_format": request.response_format,
        "prompt_sha": request.prompt_sha,
        "sample": request.sample,
    }
    return sha256_text(canonical_json(payload))


def write_usage(
    path: Path,
    report: UsageReport,
    entry_sha: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write a usage report as JSON, atomically: what was sent, from where it was answered,
    tokens and dollars (a DVC output: the same bytes whenever the same requests meet the same
    cache, so a run side by side writes what a serial one does), and its wall time apart, as run
    state (`wall_path`). `entry_sha`: the digest of the model or judge entry that made the
    output, so that a changed entry (a new temperature) changes the stage's outputs even when
    the answers come out the same, and the aggregate logs the rows' new provenance."""
    data = report.model_dump(mode="json")
    wall = data.pop("wall_s")
    if entry_sha is not None:
        data["entry_sha"] = entry_sha
    data |= dict(extra or {})  # e.g. the code digest of a RAG system of the user's
    write_json(path, data)
    write_json(wall_path(path), {"wall_s": wall})


def wall_path(usage: Path) -> Path:
    """Where a stage's wall time is kept: run state under `.lfbench/timing/usage/` of the
    workspace the stage runs in (stages run from the project's root), never in a DVC output."""
    rel = usage if not usage.is_absolute() else Path(usage.name)
    with contextlib.suppress(ValueError):
        rel = usage.resolve().relative_to(Path.cwd().resolve())
    return Path(".lfbench") / "timing" / "usage" / rel.as_posix().replace("/", "__")


def read_wall(usage: Path) -> float | None:
    """The wall time a stage recorded with its usage file here (None: not run here)."""
    try:
        value = json.loads(wall_path(usage).read_text(encoding="utf-8")).get("wall_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def cost_usd(endpoint: EndpointConfig, input_tokens: int, output_tokens: int) -> float:
    return (
        input_tokens * endpoint.price_input_per_1m / 1e6
        + output_tokens * endpoint.price_output_per_1m / 1e6
    )


def estimate_tokens(request: ChatRequest, max_tokens: int) -> int:
    chars = sum(len(m.get("content", "")) for m in request.messages)
    return chars // 4 + max_tokens


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            v = float(ms) / 1000.0
            if math.isfinite(v) and v >= 0:
                return v
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        v = float(ra)
        return v if math.isfinite(v) and v >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(retry: int, retry_after: float | None, rng: random.Random) -> float:
    """The wait before retry number `retry` (0-based)."""
    if retry_after is not None:
        return min(RETRY_AFTER_CAP_S, retry_after) + rng.uniform(0.0, 0.05)
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * (2**retry))
    return rng.uniform(ceiling / 2, ceiling)


class _Secret:
    """Removes the API key from any text that could reach a result, a file or a log."""

    def __init__(self, key: str) -> None:
        self.key = key

    def scrub(self, text: str) -> str:
        if self.key and len(self.key) >= 4 and self.key in text:
            text = text.replace(self.key, "***")
        return text


# ---------------------------------------------------------------- one request


class _Retry(Exception):
    def __init__(self, message: str, retry_after: float | None = None, sent: bool = True) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.sent = sent  # False: the attempt never reached a server (no connection was made)


class _Fail(Exception):
    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass
class _Answer:
    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    usage_missing: bool = False  # the server sent no token counts: tokens and cost unknown


def parse_completion(raw: bytes) -> _Answer:
    """A chat completion's answer; raise _Retry if the body is not a usable completion."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _Retry(f"response is not valid JSON ({e}): {_short(repr(raw[:120]))}") from None
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise _Retry(f"not a chat completion: {_short(repr(raw[:200]))}") from None
    content = message.get("content") if isinstance(message, dict) else None
    finish = choice.get("finish_reason")
    if content is None and finish == "content_filter":
        content = ""  # the filter stopped it before any text: an answer, cut (not retried)
    if not isinstance(content, str):
        refusal = message.get("refusal") if isinstance(message, dict) else None
        if isinstance(refusal, str) and refusal:
            raise _Fail(f"the model refused: {_short(refusal)}")
        raise _Retry("not a chat completion: the message has no text content")
    usage = data.get("usage")
    tin = tout = 0
    missing = True
    if isinstance(usage, dict):
        tin = _int(usage.get("prompt_tokens"))
        tout = _int(usage.get("completion_tokens"))
        missing = not all(
            isinstance(usage.get(k), int) and not isinstance(usage.get(k), bool)
            for k in ("prompt_tokens", "completion_tokens")
        )
    return _Answer(content, None if finish is None else str(finish), tin, tout, missing)


def _error_message(raw: bytes) -> str:
    """The message of an error body ({"error": {"message": ...}}), else the start of the body."""
    try:
        data = json.loads(raw)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return _short(str(err["message"]))
        if isinstance(err, str):
            return _short(err)
    except (ValueError, UnicodeDecodeError):
        pass
    return _short(raw[:300].decode("utf-8", errors="replace")) or "(empty body)"


def _int(v: Any) -> int:
    try:
        return max(0, int(v))
    except (TypeError, ValueError):
        return 0


def _env_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY / NO_PROXY give for this URL, looked up once (not per request)."""
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies_environment().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _quiet_http_loggers() -> None:
    """HTTP libraries that log every request at INFO would print thousands of lines per stage
    (and cost CPU at high rates): quiet them unless someone set their level on purpose."""
    for name in ("httpx2", "httpcore2", "httpx", "httpcore", "openai", "aiohttp"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


_JSON_HEADERS = {"Content-Type": "application/json"}
# Headers the SDK adds about this machine; left out (they cost CPU per request and say nothing
# a model server needs).
_NO_PLATFORM_HEADERS: dict[str, Any] = {}


def _platform_headers_omitted() -> dict[str, Any]:
    import openai

    names = (
        "X-Stainless-Lang",
        "X-Stainless-Package-Version",
        "X-Stainless-OS",
        "X-Stainless-Arch",
        "X-Stainless-Runtime",
        "X-Stainless-Runtime-Version",
        "X-Stainless-Async",
    )
    return {n: openai.omit for n in names}


def _make_transport_class() -> Any:
    import httpx2

    class Transport(httpx2.AsyncBaseTransport):
        """The openai SDK's HTTP transport: aiohttp, one pooled session, bodies read whole.

        The SDK builds, sends (through this) and checks every request; aiohttp carries it. This
        is the SDK's own `aiohttp` option made leaner for hundreds of requests per second.
        """

        def __init__(self, session: Any, proxy: str | None, deadline: float) -> None:
            self.session = session
            self.proxy = proxy
            self.deadline = deadline  # timeout_s: the whole attempt, from connecting to the body

        async def handle_async_request(self, request: Any) -> Any:
            import aiohttp

            timeout = request.extensions.get("timeout", {})
            sending = True  # until the answer starts: a ValueError before is the client's own
            try:
                # One deadline for the attempt: aiohttp's own timeouts time each read, so a
                # server sending a byte at a time would hold the attempt for ever.
                async with (
                    asyncio.timeout(self.deadline),
                    self.session.request(
                        request.method,
                        str(request.url),
                        headers=dict(request.headers),
                        data=request.content or None,
                        allow_redirects=False,
                        proxy=self.proxy,
                        timeout=aiohttp.ClientTimeout(
                            total=None,
                            sock_connect=timeout.get("connect"),
                            sock_read=timeout.get("read"),
                        ),
                    ) as resp,
                ):
                    sending = False
                    body = await resp.read()
                    return httpx2.Response(
                        status_code=resp.status,
                        headers=resp.raw_headers,
                        content=body,
                        request=request,
                    )
            except (TimeoutError, aiohttp.ServerTimeoutError) as e:
                timeout_error = httpx2.ReadTimeout(str(e) or "timed out", request=request)
                if isinstance(e, aiohttp.ConnectionTimeoutError):
                    timeout_error.lfbench_unsent = "connect"  # type: ignore[attr-defined]
                raise timeout_error from e
            except (aiohttp.ClientError, OSError, ValueError) as e:
                client_side = isinstance(e, ValueError) and sending
                if isinstance(e, ValueError) and not (client_side or isinstance(e, OSError)):
                    raise
                error = httpx2.ConnectError(f"{type(e).__name__}: {e}", request=request)
                if isinstance(e, aiohttp.ClientConnectorError):
                    # no connection was made (refused, DNS, TLS handshake): nothing was sent
                    error.lfbench_unsent = "connect"  # type: ignore[attr-defined]
                elif client_side:
                    # the client refused to build it (an invalid URL, credentials in the URL)
                    error.lfbench_unsent = "invalid"  # type: ignore[attr-defined]
                raise error from e

    class Client(httpx2.AsyncClient):
        """The SDK's HTTP client: sends straight to the transport (no cookies, auth flows,
        redirects or event hooks, which a chat-completions call never needs)."""

        async def send(self, request: Any, **kwargs: Any) -> Any:
            response = await self._transport_for_url(request.url).handle_async_request(request)
            response.request = request
            return response

    return Transport, Client


def _http_client(session: Any, proxy: str | None, timeout: float) -> Any:
    """The httpx2 client the SDK sends through, over one pooled aiohttp session."""
    global _CLASSES, _NO_PLATFORM_HEADERS
    if _CLASSES is None:
        _CLASSES = _make_transport_class()
        _NO_PLATFORM_HEADERS = _platform_headers_omitted()
    transport_cls, client_cls = _CLASSES
    return client_cls(transport=transport_cls(session, proxy, timeout), timeout=timeout)


_CLASSES: tuple[Any, Any] | None = None
WORKER_START_GAP_S = 0.002


class _Stopped(Exception):
    """An item not (re)sent because the run was interrupted (after `attempts` attempts)."""

    def __init__(self, attempts: int, sent: int) -> None:
        super().__init__("interrupted")
        self.attempts, self.sent = attempts, sent


class _Stop:
    """Ctrl-C (SIGINT) or SIGTERM while requests are out. The first signal starts no new
    attempt (no new item, no retry) and lets the attempts on the wire finish into the journal
    and the cache, for at most `grace` seconds; a second signal, or the grace running out,
    abandons them (their tasks are cancelled). The run then raises `Interrupted`, saying how
    many finished and were kept."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.requested = False
        self.abandoned = False
        self.signal_name = ""
        self.on_the_wire: set[str] = set()  # requests with an attempt in flight at the signal
        self.kept: set[str] = set()  # of those, the ones whose answer was journaled
        self.failed: set[str] = set()  # of those, the ones that ended in an error
        self.tasks: list[asyncio.Task[Any]] = []

    def signal(self, name: str, wire: set[str], label: str) -> None:
        loop = asyncio.get_running_loop()
        if self.requested:
            log.warning("%s: %s again: abandoning the requests in flight", label, name)
            self.abandon()
            return
        self.requested, self.signal_name, self.on_the_wire = True, name, set(wire)
        active = len(wire)
        if active and self.grace > 0:
            log.warning(
                "%s: %s: no new request is sent; the %d in flight may finish into the journal"
                " (up to %g s, %s); %s again abandons them",
                label,
                name,
                active,
                self.grace,
                INTERRUPT_GRACE_ENV,
                "Ctrl-C" if name == "SIGINT" else name,
            )
            loop.call_later(self.grace, self.abandon)
        else:
            self.abandon()

    def abandon(self) -> None:
        if self.abandoned:
            return
        self.abandoned = True
        for task in self.tasks:
            task.cancel()

    def ended(self, key: str, kept: bool) -> None:
        """A request finished (its answer journaled: `kept`) or failed after the signal."""
        if key in self.on_the_wire:
            (self.kept if kept else self.failed).add(key)

    def message(self, label: str, not_sent: int) -> str:
        kept, failed = len(self.kept), len(self.failed)
        lost = len(self.on_the_wire) - kept - failed
        return (
            f"{label}: interrupted ({self.signal_name}): {kept} of the {len(self.on_the_wire)}"
            " requests in flight finished and were kept (in the journal and the cache: a re-run"
            f" does not send them again), {lost} abandoned, {failed} failed; {not_sent} not"
            " sent. The stage wrote no output: run it again to go on"
        )


class _Sender:
    """Sends chat-completion requests to one OpenAI-compatible endpoint through the openai SDK.

    ``AsyncOpenAI.post`` on ``{base_url}/chat/completions`` with the request serialised once
    (retries resend the same bytes), the SDK's own retries off (ours count attempts and honour
    Retry-After), the answer read as raw JSON (parsed by :func:`parse_completion`, which checks
    it strictly). The SDK's HTTP client is httpx2 over a lean aiohttp transport with one pool
    sized to ``max_concurrency``: the SDK's request building costs ~0.5 ms of CPU per call, so at
    hundreds of requests per second every other per-request cost was cut (see benchmarks/).
    """

    def __init__(self, endpoint: EndpointConfig, api_key: str, limiter: RateLimiter | None) -> None:
        import aiohttp
        import httpx2
        import openai

        from pipeline import __version__

        _quiet_http_loggers()
        self.endpoint = endpoint
        self.secret = _Secret(api_key)
        self.limiter: RateLimiter | SharedRateLimiter | None = (
            limiter if limiter is not None and limiter.active else None
        )
        # `lfbench repro`: the endpoint's slots shared by every stage calling it (shared_limit)
        self.slots: EndpointSlots | None = None
        self.stop = _Stop(0.0)  # run_chat's, once it sends: after a signal no attempt starts
        self.wire: set[str] = set()  # cache keys of the requests with an attempt on the wire
        self.rng = random.Random()
        self.url = normalise_base_url(endpoint.base_url) + "/chat/completions"
        c = endpoint.max_concurrency
        t = endpoint.timeout_s
        self.openai = openai
        self.httpx2 = httpx2
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=c, limit_per_host=c, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, t), sock_read=t),
            trust_env=False,
        )
        http_client = _http_client(self.session, _env_proxy(self.url), t)
        self.client = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=normalise_base_url(endpoint.base_url),
            max_retries=0,
            timeout=t,
            http_client=http_client,
            default_headers={"User-Agent": f"lfbench/{__version__}", **_NO_PLATFORM_HEADERS},
        )

    async def aclose(self) -> None:
        await self.client.close()
        await self.session.close()
        if self.slots is not None:
            await self.slots.aclose()

    def _kwargs(self, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        ep = self.endpoint
        kw: dict[str, Any] = {
            "model": ep.model,
            "messages": request.messages,
            "temperature": ep.temperature,
            "max_tokens": max_tokens,
        }
        if ep.top_p is not None:
            kw["top_p"] = ep.top_p
        if ep.seed is not None:
            kw["seed"] = request_seed(ep, request)
        if request.response_format is not None:
            kw["response_format"] = request.response_format
        return kw

    async def _attempt(self, body: bytes) -> _Answer:
        openai = self.openai
        try:
            resp = await self.client.post(
                self.url,
                cast_to=self.httpx2.Response,
                content=body,
                options={"headers": _JSON_HEADERS},
            )
            raw = resp.content
            status = resp.status_code
            headers = resp.headers
        except openai.APITimeoutError as e:
            if getattr(e.__cause__, "lfbench_unsent", None) == "connect":
                raise _Retry(
                    f"could not connect: no connection within {self.endpoint.timeout_s:g} s",
                    sent=False,
                ) from None
            raise _Retry(f"timed out after {self.endpoint.timeout_s:g} s") from None
        except openai.APIConnectionError as e:
            cause = e.__cause__ or e
            unsent = getattr(cause, "lfbench_unsent", None)
            detail = f"{type(cause).__name__}: {_short(str(cause))}"
            if unsent == "invalid":
                message = f"the client could not send the request: {detail}"
                raise _Fail(message, sent=False) from None
            if unsent == "connect":
                raise _Retry(f"could not connect: {detail}", sent=False) from None
            raise _Retry(f"connection error: {detail}") from None
        except openai.APIStatusError as e:
            raw = e.response.content
            status = e.response.status_code
            headers = e.response.headers
        if status >= 400:
            msg = f"HTTP {status}: {_error_message(raw)}"
            if status in RETRYABLE_STATUS or status >= 500:
                raise _Retry(msg, parse_retry_after(headers))
            raise _Fail(msg)
        return parse_completion(raw)

    async def send(
        self, request: ChatRequest, key: str
    ) -> tuple[_Answer | None, str | None, int, int]:
        """(answer or None, error or None, attempts, attempts sent: those that reached a
        server; one the client could not connect for or refused to build never left it)."""
        max_tokens = effective_max_tokens(self.endpoint, request)
        body = json.dumps(self._kwargs(request, max_tokens), ensure_ascii=False).encode("utf-8")
        estimate = estimate_tokens(request, max_tokens)
        attempts = sent = 0
        last_error = "not sent"
        while True:
            if self.limiter is not None:
                await self.limiter.acquire(estimate)
            if self.stop.requested:  # interrupted: no attempt starts, not even a retry
                raise _Stopped(attempts, sent)
            # the endpoint's slot shared with the run's other stages (held for the attempt, not
            # for a retry's wait), then the same check: a signal while waiting for it
            slot = self.slots.hold() if self.slots is not None else contextlib.nullcontext()
            await slot.__aenter__()
            if self.stop.requested:
                await slot.__aexit__(None, None, None)
                raise _Stopped(attempts, sent)
            attempts += 1
            self.wire.add(key)
            _PROGRESS_FILE.on_wire(key)
            try:
                try:
                    answer = await self._attempt(body)
                finally:
                    await slot.__aexit__(None, None, None)
            except _Retry as e:
                sent += e.sent
                if self.limiter is not None:
                    self.limiter.reconcile(estimate, 0)
                last_error = self.secret.scrub(str(e))
                retry = attempts - 1
                if retry >= self.endpoint.max_retries:
                    error = f"gave up after {attempts} attempt(s): {last_error}"
                    return None, error, attempts, sent
                if self.stop.requested:  # interrupted: no retry (nor its wait)
                    raise _Stopped(attempts, sent) from None
                delay = backoff_delay(retry, e.retry_after, self.rng)
                log.debug(
                    "%s: attempt %d failed (%s); retrying in %.2f s",
                    request.key,
                    attempts,
                    last_error,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            except _Fail as e:
                return None, self.secret.scrub(str(e)), attempts, sent + e.sent
            except Exception as e:  # noqa: BLE001 - one bad item never fails the run
                # counted as sent: where it failed is not known, and a count of requests that
                # may have cost money must not be low
                msg = self.secret.scrub(f"{type(e).__name__}: {_short(str(e))}")
                return None, f"unexpected error: {msg}", attempts, sent + 1
            finally:
                self.wire.discard(key)
                _PROGRESS_FILE.off_wire(key)
            if self.limiter is not None:
                self.limiter.reconcile(estimate, answer.input_tokens + answer.output_tokens)
            return answer, None, attempts, sent + 1


def _short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


# ---------------------------------------------------------------- progress


class _ProgressFile:
    """The stage's requests done / total so far, for `lfbench repro`'s live view: written (at
    most twice a second, atomically) to the file `$LFBENCH_PROGRESS_FILE` names, summed over
    every batch the stage sends. With them, for the view's clock, in wall-clock seconds since
    the epoch (the driver may be another machine): `t0`, when the first batch began, and
    `oldest`, when the oldest attempt now on the wire was sent (None: none is)."""

    def __init__(self) -> None:
        self.restart(None)

    def restart(self, path: str | None) -> None:
        self.path = path
        self.done = self.total = self.errors = 0
        self.written = 0.0
        self.t0: float | None = None
        self.wire: dict[str, float] = {}  # cache key -> when its attempt was sent

    def add(self, total: int) -> None:
        path = os.environ.get("LFBENCH_PROGRESS_FILE")
        if path != self.path:  # another file (another stage in this process): counts start over
            self.restart(path)
        self.total += total
        self.t0 = self.t0 or time.time()
        self.write(force=True)

    def on_wire(self, key: str) -> None:
        self.wire[key] = time.time()
        self.write(force=len(self.wire) == 1)  # the oldest changed from none

    def off_wire(self, key: str) -> None:
        self.wire.pop(key, None)
        # the last one off the wire: none is in flight now (its answer may have been counted
        # done, and the file written, before it came off)
        if not self.wire:
            self.write(force=True)

    def advance(self, ok: bool) -> None:
        self.done += 1
        self.errors += 0 if ok else 1
        self.write(force=self.done == self.total)

    def write(self, force: bool = False) -> None:
        path = os.environ.get("LFBENCH_PROGRESS_FILE")
        now = time.monotonic()
        if not path or (not force and now - self.written < 0.5):
            return
        self.written = now
        body: dict[str, float | None] = {
            "done": self.done,
            "total": self.total,
            "errors": self.errors,
            "t0": self.t0,
            "oldest": min(self.wire.values(), default=None),
        }
        tmp = Path(f"{path}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(body), encoding="utf-8")
            tmp.replace(path)
        except OSError:  # a view's nicety: never a stage's failure
            pass


_PROGRESS_FILE = _ProgressFile()


class _Progress:
    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.errors = 0
        _PROGRESS_FILE.add(total)
        self.t0 = time.monotonic()
        self.last_log = self.t0
        self._bar: Any = None
        self._task: Any = None
        if enabled and total and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:.1f}/s"),
                TextColumn("errors {task.fields[errors]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, rate=0.0, errors=0)
        self.log_lines = enabled and self._bar is None

    def advance(self, ok: bool) -> None:
        self.done += 1
        if not ok:
            self.errors += 1
        _PROGRESS_FILE.advance(ok)
        now = time.monotonic()
        rate = self.done / max(now - self.t0, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, rate=rate, errors=self.errors)
        elif now - self.last_log >= PROGRESS_LOG_EVERY_S and self.done < self.total:
            self.last_log = now
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            if self.log_lines:
                log.info(
                    "%s: %d/%d done, %d errors, %.1f/s, ETA %.0f s",
                    self.label,
                    self.done,
                    self.total,
                    self.errors,
                    rate,
                    eta,
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# ---------------------------------------------------------------- the batch


def _ok(
    key: str, ck: str, text: str, finish: str | None, tin: int, tout: int, **kw: Any
) -> ChatResult:
    return ChatResult(
        key=key,
        cache_key=ck,
        status="ok",
        text=text,
        finish_reason=finish,
        input_tokens=tin,
        output_tokens=tout,
        **kw,
    )


async def run_chat(
    endpoint: EndpointConfig,
    requests: Sequence[ChatRequest],
    *,
    cache_path: Path | None,
    journal_path: Path | None,
    label: str,
    progress: bool = True,
) -> tuple[list[ChatResult], UsageReport]:
    """Answer every request (in order); see the module docstring."""
    t0 = time.monotonic()
    keys = [cache_key(endpoint, r) for r in requests]
    results: list[ChatResult | None] = [None] * len(requests)

    journal = load_journal(journal_path) if journal_path is not None else Journal()
    journal_hits = 0
    for i, (req, ck) in enumerate(zip(requests, keys, strict=True)):
        j = journal.get(ck)
        if j is not None:
            results[i] = _ok(
                req.key,
                ck,
                j.text,
                j.finish_reason,
                j.input_tokens,
                j.output_tokens,
                source="journal",
            )
            journal_hits += 1

    backend = backend_for(cache_path)
    cache = ResponseCache(backend=backend) if backend is not None else None
    cache_hits = 0
    stats = {"waited": 0}
    journal_writer: JournalWriter | None = None
    sender: _Sender | None = None
    prog: _Progress | None = None
    try:
        if cache is not None:
            pending = [ck for ck, r in zip(keys, results, strict=True) if r is None]
            found = cache.get_many(pending) if pending else {}
            backfill: list[JournalEntry] = []
            for i, (req, ck) in enumerate(zip(requests, keys, strict=True)):
                if results[i] is None and ck in found:
                    a = found[ck]
                    results[i] = _ok(
                        req.key,
                        ck,
                        a.text,
                        a.finish_reason,
                        a.input_tokens,
                        a.output_tokens,
                        source="cache",
                    )
                    cache_hits += 1
                elif ck in journal and ck not in found:
                    backfill.append(journal[ck])
            # answers that only the journal had (a killed run): put them in the cache too
            if backfill:
                cache.put_now([_cached(e) for e in {e.cache_key: e for e in backfill}.values()])

        # what is left to send, each distinct cache key once
        first_of: dict[str, int] = {}
        duplicates: list[int] = []
        for i, ck in enumerate(keys):
            if results[i] is None:
                if ck in first_of:
                    duplicates.append(i)
                else:
                    first_of[ck] = i
        to_send = list(first_of.values())
        cache_misses = len(to_send)

        if to_send:
            api_key = resolve_api_key(endpoint, label)
            if journal_path is not None:
                journal_writer = JournalWriter(journal_path)
            limiter = RateLimiter(endpoint.requests_per_minute, endpoint.tokens_per_minute)
            sender = _Sender(endpoint, api_key, limiter)
            sender.slots = await open_slots(
                endpoint.base_url, endpoint.model, endpoint.max_concurrency, label
            )
            if sender.slots is not None and limiter.active:  # the budgets shared too
                sender.limiter = sender.slots.shared_rates(
                    endpoint.requests_per_minute, endpoint.tokens_per_minute
                )
            sender.stop = stop = _Stop(interrupt_grace_s())
            prog = _Progress(label, len(to_send), progress)
            with _stopped_by_signals(stop, sender, label):
                await _send_all(
                    endpoint,
                    sender,
                    requests,
                    keys,
                    to_send,
                    results,
                    cache,
                    journal_writer,
                    prog,
                    stats=stats,
                )
            if stop.requested:
                prog.close()
                unanswered = sum(1 for i in to_send if results[i] is None)
                lost = len(stop.on_the_wire) - len(stop.kept) - len(stop.failed)
                raise Interrupted(stop.message(label, max(0, unanswered - lost)))
            cache_hits += stats["waited"]
        for i in duplicates:
            src = results[first_of[keys[i]]]
            assert src is not None
            results[i] = src.model_copy(
                update={
                    "key": requests[i].key,
                    "requests": 0,
                    "retries": 0,
                    "cost_usd": 0.0,
                    "usage_missing": False,
                    "source": "cache" if src.status == "ok" else "api",
                }
            )
            if src.status == "ok":
                cache_hits += 1
    finally:
        if prog is not None:
            prog.close()
        if sender is not None:
            await sender.aclose()
        if journal_writer is not None:
            await asyncio.to_thread(journal_writer.close)
        if cache is not None:
            await asyncio.to_thread(cache.close)

    final: list[ChatResult] = [r for r in results if r is not None]
    assert len(final) == len(requests)
    sent = [r for r in final if r.source == "api"]
    missing = sum(1 for r in final if r.usage_missing)
    costs = [r.cost_usd for r in final]
    report = UsageReport(
        label=label,
        items=len(final),
        ok=sum(1 for r in final if r.status == "ok"),
        errors=sum(1 for r in final if r.status == "error"),
        requests_sent=sum(r.requests for r in final),
        retries=sum(r.retries for r in final),
        cache_hits=cache_hits,
        cache_misses=cache_misses,
        journal_hits=journal_hits,
        input_tokens=sum(r.input_tokens for r in sent),
        output_tokens=sum(r.output_tokens for r in sent),
        cost_usd=None if missing else sum(c for c in costs if c is not None),
        wall_s=round(time.monotonic() - t0, 3),
        truncated=sum(1 for r in final if r.status == "ok" and r.finish_reason in CUT_REASONS),
        cache_corrupt=cache.corrupt if cache is not None else 0,
        waited=stats["waited"],
        journal_corrupt=journal.corrupt,
        usage_missing=missing,
    )
    log.info(
        "%s: %d items: cache %d hits / %d misses, journal %d hits, %d requests sent"
        " (%d retries), %d errors, %s, %.1f s",
        label,
        report.items,
        report.cache_hits,
        report.cache_misses,
        report.journal_hits,
        report.requests_sent,
        report.retries,
        report.errors,
        report.cost_text(),
        report.wall_s,
    )
    return final, report


@contextlib.contextmanager
def _stopped_by_signals(stop: _Stop, sender: _Sender, label: str) -> Iterator[None]:
    """While requests are sent, SIGINT and SIGTERM go to `stop` (main thread only; elsewhere
    signals are left alone); the handlers before are put back after."""
    import signal
    import threading

    loop = asyncio.get_running_loop()
    installed: list[tuple[signal.Signals, Any]] = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, stop.signal, sig.name, sender.wire, label)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append((sig, previous))
    try:
        yield
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)


def _cached(e: JournalEntry) -> CachedAnswer:
    return CachedAnswer(e.cache_key, e.text, e.finish_reason, e.input_tokens, e.output_tokens)


async def _send_all(
    endpoint: EndpointConfig,
    sender: _Sender,
    requests: Sequence[ChatRequest],
    keys: list[str],
    to_send: list[int],
    results: list[ChatResult | None],
    cache: ResponseCache | None,
    journal: JournalWriter | None,
    prog: _Progress,
    *,
    stats: dict[str, int] | None = None,
) -> None:
    """Answer `to_send`. With a cache, each request is claimed just before it is sent: one held
    by another live worker (another stage, process or machine sharing the cache) is not sent
    here but waited for, and sent here only if its holder's claim runs out."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in to_send:
        queue.put_nowait(i)
    remaining = set(to_send)
    waiting: set[int] = set()
    counts = stats if stats is not None else {"waited": 0}
    # a shared cache lost mid-run: no new request is started, those in flight finish (and are
    # journalled), then the run ends with the error
    lost: list[CacheUnavailable] = []

    def from_cache(i: int, a: CachedAnswer) -> None:
        results[i] = _ok(
            requests[i].key,
            keys[i],
            a.text,
            a.finish_reason,
            a.input_tokens,
            a.output_tokens,
            source="cache",
        )
        remaining.discard(i)
        prog.advance(True)

    async def waiter() -> None:
        try:
            await _waiter()
        except CacheUnavailable as e:
            lost.append(e)

    async def _waiter() -> None:
        delay = 0.1
        while remaining and not lost and not stop.requested:
            await asyncio.sleep(delay)
            if not waiting or cache is None:
                delay = 0.1
                continue
            delay = min(delay * 1.5, 1.0)
            found = cache.get_many([keys[i] for i in waiting])
            for i in list(waiting):
                waiting.discard(i)
                if keys[i] in found:
                    from_cache(i, found[keys[i]])
                    counts["waited"] += 1
                else:
                    queue.put_nowait(i)  # claimed again by a worker: sent there if it ran out

    async def worker(slot: int) -> None:
        try:
            await _worker(slot)
        except CacheUnavailable as e:
            lost.append(e)

    async def _worker(slot: int) -> None:
        # Start the workers a little apart: answers that all come back at once are handled one
        # after another, and the last ones in such a burst would wait (the burst repeats on
        # every round trip). Spread starts keep the round trips apart (<= 0.13 s of ramp-up).
        await asyncio.sleep(slot * WORKER_START_GAP_S)
        while remaining and not lost and not stop.requested:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                await asyncio.sleep(0.05)  # the rest is held by other workers: the waiter
                continue
            req, ck = requests[i], keys[i]
            if cache is not None and cache.shared:
                if not cache.claim([ck]):
                    waiting.add(i)
                    continue
                late = cache.get(ck)  # answered and let go between the lookup and the claim
                if late is not None:
                    cache.release([ck])
                    from_cache(i, late)
                    counts["waited"] += 1
                    continue
            try:
                answer, error, attempts, sent = await sender.send(req, ck)
            except _Stopped as e:  # interrupted before an attempt: the item stays unanswered
                if cache is not None and cache.shared:
                    cache.release([ck])
                if e.attempts:
                    stop.ended(ck, kept=False)
                continue
            if answer is None:
                stop.ended(ck, kept=False)
                if cache is not None and cache.shared:
                    cache.release([ck])  # let another worker try it
                results[i] = ChatResult(
                    key=req.key,
                    cache_key=ck,
                    status="error",
                    error=error,
                    requests=sent,
                    retries=attempts - 1,
                    source="api",
                )
                remaining.discard(i)
                prog.advance(False)
                continue
            if journal is not None:
                journal.append(
                    JournalEntry(
                        ck,
                        req.key,
                        answer.text,
                        answer.finish_reason,
                        answer.input_tokens,
                        answer.output_tokens,
                    )
                )
            if cache is not None:
                cache.put(
                    CachedAnswer(
                        ck,
                        answer.text,
                        answer.finish_reason,
                        answer.input_tokens,
                        answer.output_tokens,
                        endpoint.model,
                    )
                )
            stop.ended(ck, kept=True)
            results[i] = _ok(
                req.key,
                ck,
                answer.text,
                answer.finish_reason,
                answer.input_tokens,
                answer.output_tokens,
                requests=sent,
                retries=attempts - 1,
                source="api",
                cost_usd=None
                if answer.usage_missing
                else cost_usd(endpoint, answer.input_tokens, answer.output_tokens),
                usage_missing=answer.usage_missing,
            )
            remaining.discard(i)
            prog.advance(True)

    n = min(endpoint.max_concurrency, len(to_send))
    stop = sender.stop
    stop.tasks = [asyncio.create_task(worker(slot)) for slot in range(n)]
    tasks = [asyncio.create_task(waiter()), *stop.tasks]
    done = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in done:  # a worker's own failure (not its cancellation by a second signal)
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome
    if lost:
        raise lost[0]


def run_chat_sync(
    endpoint: EndpointConfig,
    requests: Sequence[ChatRequest],
    *,
    cache_path: Path | None,
    journal_path: Path | None,
    label: str,
    progress: bool = True,
) -> tuple[list[ChatResult], UsageReport]:
    """:func:`run_chat` for synchronous code (runs its own event loop)."""
    return asyncio.run(
        run_chat(
            endpoint,
            requests,
            cache_path=cache_path,
            journal_path=journal_path,
            label=label,
            progress=progress,
        )
    )
