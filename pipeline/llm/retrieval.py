"""Retrieval endpoints: OpenAI-compatible `/v1/embeddings` and Cohere-compatible `/v1/rerank`.

The same guarantees as the chat client, for the requests of a retrieval stage:

- **Response cache** (`pipeline.llm.cache`, the shared SQLite file or the team's PostgreSQL):
  an embedding is kept per text, keyed by the model, its `dimensions` and the text (not the
  server's address: a colleague's server of the same model answers from the same entries); a
  rerank answer per request, keyed by the model, the query, the documents and `top_n`. A second
  run, or a colleague sharing the cache, sends nothing.
- **Journal** (`pipeline.llm.journal`): each answered request is appended (fsync'd by a writer
  thread) before it counts as done, so a crash, a kill or Ctrl-C loses no answered request and
  a re-run sends none again. The stage clears it once its outputs are written.
- **Ctrl-C / SIGTERM**: no new request starts; those in flight may finish into the journal (up
  to `LFBENCH_INTERRUPT_GRACE_S`, 60 s by default); then `Interrupted` (exit 130).
- **Limits**: `max_concurrency` requests in flight, `requests_per_minute` and
  `tokens_per_minute` (estimated from the characters, reconciled with the server's usage);
  under `lfbench repro`, per endpoint across every stage calling it
  (`pipeline/llm/shared_limit.py`).
- **Retries**: the `openai` client's (429 honouring Retry-After, 5xx, timeouts, dropped
  connections; `max_retries`); an answer that is not what was asked (not JSON, the wrong number
  of vectors, a non-finite number, an index out of range) is asked again twice, then it is an
  error naming the endpoint, the model and the texts.

Vectors are stored as little-endian float32 (base64) and every score is computed from the
stored form, so a run that sends and a run that reads the cache give the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.core.config import EmbeddingsRetriever, RerankRetriever, RetrievalEndpoint
from pipeline.core.errors import Interrupted, LfbenchError, interrupt_grace_s
from pipeline.core.io import canonical_json, sha256_text
from pipeline.core.types import UsageReport
from pipeline.llm.cache import CachedAnswer, ResponseCache, backend_for
from pipeline.llm.client import normalise_base_url, resolve_api_key
from pipeline.llm.embeddings import _vectors
from pipeline.llm.journal import JournalEntry, JournalWriter, load_journal
from pipeline.llm.ratelimit import RateLimiter
from pipeline.llm.shared_limit import EndpointSlots, SharedRateLimiter, open_slots

log = logging.getLogger("lfbench.llm")

Array = npt.NDArray[np.float32]
BAD_ANSWER_TRIES = 3
KEY_VERSION = 1


class RetrievalEndpointError(LfbenchError):
    """A retrieval endpoint could not answer (after the client's retries)."""


@dataclass(frozen=True)
class _Request:
    """One HTTP request: the cache keys it answers (in order), its body, its token estimate."""

    keys: tuple[str, ...]
    body: dict[str, Any]
    tokens: int
    what: str  # for errors: which texts or query


@dataclass
class _Tally:
    requests: int = 0
    retries: int = 0
    input_tokens: int = 0
    usage_missing: int = 0
    extra_cost: float = 0.0
    on_wire: set[int] = field(default_factory=set)


# ---------------------------------------------------------------- keys and payloads


def embedding_key(model: str, text: str, dimensions: int | None) -> str:
    return sha256_text(
        canonical_json({"v": KEY_VERSION, "kind": "embedding", "model": model,
                        "dimensions": dimensions, "text": text})
    )  # fmt: skip


def rerank_key(model: str, query: str, documents: Sequence[str], top_n: int) -> str:
    return sha256_text(
        canonical_json({"v": KEY_VERSION, "kind": "rerank", "model": model, "query": query,
                        "documents": list(documents), "top_n": top_n})
    )  # fmt: skip


def pack_vector(vector: Sequence[float]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def unpack_vector(payload: str) -> Array:
    return np.frombuffer(base64.b64decode(payload), dtype="<f4").astype(np.float32)


def unit(v: Array) -> Array:
    n = float(np.linalg.norm(v.astype(np.float64)))
    return v if n == 0 else np.asarray(v / n, dtype=np.float32)


# ---------------------------------------------------------------- the engine


@contextlib.contextmanager
def _signals(stop: asyncio.Event, label: str, grace: float) -> Iterator[list[asyncio.Task[Any]]]:
    """SIGINT/SIGTERM: the first stops new requests (in-flight ones may finish for `grace`
    seconds); a second, or the grace running out, cancels them."""
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[Any]] = []
    installed: list[tuple[signal.Signals, Any]] = []

    def abandon() -> None:
        for t in tasks:
            t.cancel()

    def on_signal(name: str) -> None:
        if stop.is_set():
            log.warning("%s: %s again: abandoning the requests in flight", label, name)
            abandon()
            return
        stop.set()
        log.warning(
            "%s: %s: no new request is sent; those in flight may finish into the journal (up"
            " to %g s)",
            label,
            name,
            grace,
        )
        loop.call_later(grace, abandon)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, on_signal, sig.name)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append((sig, previous))
    try:
        yield tasks
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)


Send = Callable[[Any, _Request], Awaitable[tuple[list[str], int | None, int]]]


async def _answer_all(
    endpoint: RetrievalEndpoint,
    wanted: Sequence[str],
    plan: Callable[[list[str]], list[_Request]],
    send: Send,
    *,
    cache_path: Path | None,
    journal_path: Path | None,
    label: str,
    cost: Callable[[_Tally], float | None],
) -> tuple[dict[str, str], UsageReport]:
    """The payload of every key in `wanted`: from the journal, the cache, or the requests that
    `plan` makes of the missing keys (sent through `send`: payloads in the request's key order,
    the server's input tokens or None, retries)."""
    t0 = time.monotonic()
    distinct = list(dict.fromkeys(wanted))
    journal = load_journal(journal_path) if journal_path is not None else None
    done: dict[str, str] = {}
    if journal is not None:
        done |= {k: journal[k].text for k in distinct if k in journal}
    journal_hits = len(done)
    backend = backend_for(cache_path)
    cache = ResponseCache(backend=backend) if backend is not None else None
    tally = _Tally()
    cache_hits = 0
    writer: JournalWriter | None = None
    try:
        if cache is not None:
            found = cache.get_many([k for k in distinct if k not in done])
            done |= {k: a.text for k, a in found.items()}
            cache_hits = len(found)
            if journal is not None:  # answers only the journal had (a killed run)
                back = [k for k in distinct if k in journal and k not in found]
                known = cache.get_many(back) if back else {}
                missing_in_cache = [k for k in back if k not in known]
                if missing_in_cache:
                    cache.put_now(
                        [CachedAnswer(k, journal[k].text, None, 0, 0) for k in missing_in_cache]
                    )
        todo = [k for k in distinct if k not in done]
        requests = plan(todo) if todo else []
        if requests:
            resolve_api_key(endpoint.endpoint(), label)  # no key: fails before anything is sent
            if journal_path is not None:
                writer = JournalWriter(journal_path)
            await _send_all(endpoint, requests, send, done, cache, writer, tally, label)
    finally:
        if writer is not None:
            await asyncio.to_thread(writer.close)
        if cache is not None:
            await asyncio.to_thread(cache.close)
    report = UsageReport(
        label=label,
        items=len(distinct),
        ok=len(distinct),
        errors=0,
        requests_sent=tally.requests,
        retries=tally.retries,
        cache_hits=cache_hits,
        cache_misses=len(distinct) - journal_hits - cache_hits,
        journal_hits=journal_hits,
        input_tokens=tally.input_tokens,
        output_tokens=0,
        cost_usd=_rounded(cost(tally)),
        wall_s=round(time.monotonic() - t0, 3),
        cache_corrupt=cache.corrupt if cache is not None else 0,
        journal_corrupt=journal.corrupt if journal is not None else 0,
        usage_missing=tally.usage_missing,
    )
    if tally.requests or journal_hits:
        log.info(
            "%s: %d keys: journal %d, cache %d hits / %d misses, %d requests sent (%d retries),"
            " %d tokens, %s, %.1f s",
            label,
            report.items,
            report.journal_hits,
            report.cache_hits,
            report.cache_misses,
            report.requests_sent,
            report.retries,
            report.input_tokens,
            report.cost_text(),
            report.wall_s,
        )
    return done, report


async def _send_all(
    endpoint: RetrievalEndpoint,
    requests: list[_Request],
    send: Send,
    done: dict[str, str],
    cache: ResponseCache | None,
    writer: JournalWriter | None,
    tally: _Tally,
    label: str,
) -> None:
    from pipeline.llm.embeddings import _client

    key = resolve_api_key(endpoint.endpoint(), label)
    limiter = RateLimiter(endpoint.requests_per_minute, endpoint.tokens_per_minute)
    slots = asyncio.Semaphore(endpoint.max_concurrency)
    stop = asyncio.Event()
    failure: list[BaseException] = []
    grace = interrupt_grace_s()
    ep = endpoint.endpoint()
    # `lfbench repro`: the endpoint's slots shared by every stage calling it (shared_limit)
    shared = await open_slots(ep.base_url, ep.model, endpoint.max_concurrency, label)
    rates: RateLimiter | SharedRateLimiter | None = limiter
    if shared is not None and limiter.active:  # the per-minute budgets shared too
        rates = shared.shared_rates(endpoint.requests_per_minute, endpoint.tokens_per_minute)
    assert rates is not None
    async with _client(ep, key) as client, _holding(shared) as hold:
        with _signals(stop, label, grace) as tasks:

            async def one(n: int, req: _Request) -> None:
                async with slots:
                    if stop.is_set() or failure:
                        return
                    await rates.acquire(req.tokens)
                    if stop.is_set() or failure:
                        return
                    tally.on_wire.add(n)
                    try:
                        async with hold():  # the endpoint's slot shared with other stages
                            if stop.is_set() or failure:  # a signal while waiting for it
                                tally.on_wire.discard(n)
                                return
                            payloads, used, retried = await send(client, req)
                    except BaseException as e:  # noqa: BLE001 - recorded, raised after
                        tally.on_wire.discard(n)
                        if not isinstance(e, asyncio.CancelledError):
                            failure.append(e)
                        return
                    tally.on_wire.discard(n)
                    tally.requests += 1
                    tally.retries += retried
                    if used is None:
                        tally.usage_missing += 1
                    else:
                        tally.input_tokens += used
                        rates.reconcile(req.tokens, used)
                    for k, payload in zip(req.keys, payloads, strict=True):
                        done[k] = payload
                        entry = JournalEntry(k, k, payload, None, 0, 0)
                        if writer is not None:
                            writer.append(entry)
                        if cache is not None:
                            cache.put(CachedAnswer(k, payload, None, 0, 0))

            tasks.extend(asyncio.ensure_future(one(n, r)) for n, r in enumerate(requests))
            await asyncio.gather(*tasks, return_exceptions=True)
    if failure:
        raise failure[0]
    if stop.is_set():
        left = sum(1 for r in requests if any(k not in done for k in r.keys))
        raise Interrupted(
            f"{label}: interrupted: {tally.requests} requests answered and kept (in the journal"
            f" and the cache: a re-run does not send them again), {left} not answered. The"
            " stage wrote no output: run it again to go on"
        )


@contextlib.asynccontextmanager
async def _holding(
    shared: EndpointSlots | None,
) -> AsyncIterator[Callable[[], contextlib.AbstractAsyncContextManager[None]]]:
    """What each request is sent within: a lease of the endpoint's shared slots, or nothing."""
    try:
        yield shared.hold if shared is not None else contextlib.nullcontext
    finally:
        if shared is not None:
            await shared.aclose()


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 8)


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


# ---------------------------------------------------------------- embeddings


def embed(
    spec: EmbeddingsRetriever,
    texts: Sequence[str],
    *,
    cache_path: Path | None,
    journal_path: Path | None,
    label: str,
) -> tuple[dict[str, Array], UsageReport]:
    """Unit-length float32 embeddings of `texts` (by text) from an `embeddings` retriever entry,
    through the cache and the journal; and the usage of this call."""
    where = f"{label} ({spec.model} at {normalise_base_url(spec.base_url)})"
    key_of = {t: embedding_key(spec.model, t, spec.dimensions) for t in dict.fromkeys(texts)}
    text_of = {k: t for t, k in key_of.items()}

    def plan(todo: list[str]) -> list[_Request]:
        out = []
        for start in range(0, len(todo), spec.batch_size):
            keys = tuple(todo[start : start + spec.batch_size])
            batch = [text_of[k] for k in keys]
            body: dict[str, Any] = {"model": spec.model, "input": batch}
            if spec.dimensions is not None:
                body["dimensions"] = spec.dimensions
            chars = sum(len(t) for t in batch)
            out.append(_Request(keys, body, max(1, chars // 4), f"{len(batch)} texts"))
        return out

    async def send(client: Any, req: _Request) -> tuple[list[str], int | None, int]:
        import openai

        problem = ""
        retried = 0
        for _ in range(BAD_ANSWER_TRIES):
            try:
                raw = await client.embeddings.with_raw_response.create(**req.body)
                retried += int(getattr(raw, "retries_taken", 0) or 0)
                resp = raw.parse()
            except openai.APIStatusError as e:
                raise RetrievalEndpointError(
                    f"{where}: the server answered {e.status_code} for {req.what}:"
                    f" {str(e.message)[:300]}"
                ) from None
            except openai.APIError as e:
                raise RetrievalEndpointError(
                    f"{where}: {type(e).__name__}: {str(e)[:300]}"
                ) from None
            except ValueError as e:
                problem = f"not JSON ({str(e)[:120]})"
                continue
            try:
                vectors = _vectors(resp, len(req.keys))
            except ValueError as e:
                problem = str(e)
                continue
            usage = getattr(resp, "usage", None)
            used = getattr(usage, "prompt_tokens", None) if usage is not None else None
            return [pack_vector(v) for v in vectors], None if used is None else int(used), retried
        raise RetrievalEndpointError(
            f"{where}: unusable answer for {req.what} after {BAD_ANSWER_TRIES} tries: {problem}"
        )

    def cost(t: _Tally) -> float | None:
        if t.usage_missing and spec.price_input_per_1m:
            return None  # answers without usage: their tokens, so the cost, are unknown
        return t.input_tokens * spec.price_input_per_1m / 1e6

    payloads, report = _run(
        _answer_all(
            spec,
            list(key_of.values()),
            plan,
            send,
            cache_path=cache_path,
            journal_path=journal_path,
            label=label,
            cost=cost,
        )
    )
    return {t: unit(unpack_vector(payloads[k])) for t, k in key_of.items()}, report


# ---------------------------------------------------------------- rerank


@dataclass(frozen=True)
class RerankAsk:
    """One rerank request: the query and the documents to re-order (texts, in the base
    retriever's order)."""

    query: str
    documents: tuple[str, ...]


def parse_rerank(raw: Any, n: int) -> list[tuple[int, float]]:
    """(index, score) of a Cohere-style answer (`results: [{index, relevance_score}]`; a bare
    list and `score` are taken too), best first; ValueError when it is not such an answer."""
    results = raw.get("results") if isinstance(raw, dict) else raw
    if isinstance(raw, dict) and results is None:
        results = raw.get("data")
    if not isinstance(results, list):
        raise ValueError("no list of results")
    out: dict[int, float] = {}
    for r in results:
        if not isinstance(r, dict):
            raise ValueError("a result is not an object")
        index, score = r.get("index"), r.get("relevance_score", r.get("score"))
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
            raise ValueError(f"a result's index {index!r} is not one of the {n} documents")
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise ValueError(f"document {index}: the score {score!r} is not a number")
        if not math.isfinite(float(score)):
            raise ValueError(f"document {index}: a non-finite score")
        if index in out:
            raise ValueError(f"document {index} is scored twice")
        out[index] = float(score)
    return sorted(out.items(), key=lambda p: (-p[1], p[0]))


def _rerank_tokens(raw: Any) -> int | None:
    """The input tokens a rerank answer reports, as Jina/vLLM (`usage`) or Cohere (`meta`)."""
    if not isinstance(raw, dict):
        return None
    usage = raw.get("usage")
    if isinstance(usage, dict):
        for k in ("prompt_tokens", "total_tokens", "input_tokens"):
            if isinstance(usage.get(k), int):
                return int(usage[k])
    meta = raw.get("meta")
    if isinstance(meta, dict):
        for part in ("tokens", "billed_units"):
            d = meta.get(part)
            tokens = d.get("input_tokens") if isinstance(d, dict) else None
            if isinstance(tokens, int | float):
                return int(tokens)
    return None


def rerank(
    spec: RerankRetriever,
    asks: Sequence[RerankAsk],
    *,
    cache_path: Path | None,
    journal_path: Path | None,
    label: str,
) -> tuple[list[list[tuple[int, float]]], UsageReport]:
    """Each ask's documents re-ordered by the endpoint: (index, score), best first."""
    where = f"{label} ({spec.model} at {normalise_base_url(spec.base_url)})"
    keys = [rerank_key(spec.model, a.query, a.documents, len(a.documents)) for a in asks]
    ask_of = dict(zip(keys, asks, strict=True))

    def plan(todo: list[str]) -> list[_Request]:
        out = []
        for k in todo:
            a = ask_of[k]
            body = {
                "model": spec.model,
                "query": a.query,
                "documents": list(a.documents),
                "top_n": len(a.documents),
                "return_documents": False,
            }
            chars = len(a.query) * len(a.documents) + sum(len(d) for d in a.documents)
            what = f"the query {a.query[:60]!r}"
            out.append(_Request((k,), body, max(1, chars // 4), what))
        return out

    async def send(client: Any, req: _Request) -> tuple[list[str], int | None, int]:
        import json

        import openai

        problem = ""
        n = len(req.body["documents"])
        for _ in range(BAD_ANSWER_TRIES):
            try:
                raw = await client.post("/rerank", cast_to=object, body=req.body)
            except openai.APIStatusError as e:
                raise RetrievalEndpointError(
                    f"{where}: the server answered {e.status_code} for {req.what}:"
                    f" {str(e.message)[:300]}"
                ) from None
            except openai.APIError as e:
                raise RetrievalEndpointError(
                    f"{where}: {type(e).__name__}: {str(e)[:300]}"
                ) from None
            except (ValueError, openai.APIResponseValidationError) as e:  # not JSON
                problem = f"not JSON ({str(e)[:120]})"
                continue
            try:
                ranked = parse_rerank(raw, n)
            except ValueError as e:
                problem = str(e)[:200]
                continue
            return [json.dumps(ranked)], _rerank_tokens(raw), 0
        raise RetrievalEndpointError(
            f"{where}: unusable answer for {req.what} after {BAD_ANSWER_TRIES} tries: {problem}"
        )

    def cost(t: _Tally) -> float | None:
        if t.usage_missing and spec.price_input_per_1m:
            return None
        return (
            t.input_tokens * spec.price_input_per_1m / 1e6
            + t.requests * spec.price_per_1k_requests / 1000
        )

    payloads, report = _run(
        _answer_all(
            spec,
            keys,
            plan,
            send,
            cache_path=cache_path,
            journal_path=journal_path,
            label=label,
            cost=cost,
        )
    )
    import json

    return [[(int(i), float(s)) for i, s in json.loads(payloads[k])] for k in keys], report
