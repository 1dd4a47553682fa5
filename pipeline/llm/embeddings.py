"""Text embeddings: any OpenAI-compatible `/v1/embeddings` endpoint, or the local MiniLM.

`embed_remote` sends the texts (each distinct text once) in batches through the `openai`
client over HTTP (the chat client's transport: `timeout_s` is the deadline of each attempt). The
client retries 429s (honouring Retry-After), 5xx answers, timeouts and dropped connections up to
the endpoint's `max_retries`; an answer that is not a list of finite
vectors of one dimension, one per input, is asked again twice, then it is an error naming the
endpoint, the model and the batch. Every finished batch is appended to a journal (JSONL,
flushed and fsync'd, keyed by the SHA-256 of the endpoint, model and text), so a crash or kill
loses no finished vector and a resumed run sends no text twice; texts already in the journal
cost no call. Vectors come back L2-normalised, in input order.

`embed_local` is the offline fallback: all-MiniLM-L6-v2 run in numpy
(pipeline/retrieval/dense.py); an English model, labelled as not any paper's model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.core.errors import LfbenchError
from pipeline.core.types import LOCAL_EMBEDDING_MODEL, EndpointConfig, UsageReport
from pipeline.llm.client import cost_usd, normalise_base_url, resolve_api_key

LOCAL_MODEL = LOCAL_EMBEDDING_MODEL

log = logging.getLogger("lfbench.llm")

Array = npt.NDArray[np.float32]
BATCH = 64  # texts per request
BAD_ANSWER_TRIES = 3  # an unusable answer is asked for again twice


class EmbeddingError(LfbenchError):
    """The endpoint could not embed the texts."""


def text_key(endpoint: EndpointConfig, text: str) -> str:
    raw = json.dumps([normalise_base_url(endpoint.base_url), endpoint.model, text])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _normalised(rows: Any) -> Array:
    a = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return np.asarray(a / np.where(norms == 0, 1.0, norms), dtype=np.float32)


def read_journal(path: Path) -> dict[str, list[float]]:
    """The vectors a journal holds (a torn last line, from a kill mid-write, is ignored)."""
    done: dict[str, list[float]] = {}
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
            row = json.loads(line)
            done[str(row["key"])] = [float(x) for x in row["vector"]]
    return done


def _vectors(resp: Any, n: int) -> list[list[float]]:
    """The answer's vectors in input order; ValueError when it is not n finite vectors of one
    dimension."""
    data = getattr(resp, "data", None)
    if not isinstance(data, list) or len(data) != n:
        got = len(data) if isinstance(data, list) else "no list"
        raise ValueError(f"expected {n} embeddings, got {got}")
    order = sorted(range(n), key=lambda i: getattr(data[i], "index", i))
    out: list[list[float]] = []
    for i in order:
        vec = getattr(data[i], "embedding", None)
        if not isinstance(vec, list) or not vec:
            raise ValueError("an embedding is not a list of numbers")
        try:
            floats = [float(x) for x in vec]
        except (TypeError, ValueError):
            raise ValueError("an embedding is not a list of numbers") from None
        if not all(math.isfinite(x) for x in floats):
            raise ValueError("an embedding holds a non-finite number")
        out.append(floats)
    if len({len(v) for v in out}) != 1:
        raise ValueError("embeddings of different dimensions")
    return out


@contextlib.asynccontextmanager
async def _client(endpoint: EndpointConfig, key: str) -> AsyncIterator[Any]:
    """The `openai` client over the chat client's HTTP transport: `timeout_s` is the deadline of
    each attempt, from connecting to the answer's last byte (the SDK's own transport times each
    read only, so a server sending a byte at a time would hold an attempt for ever)."""
    import aiohttp
    import openai

    from pipeline.llm.client import _env_proxy, _http_client

    t = endpoint.timeout_s
    base = normalise_base_url(endpoint.base_url)
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, t), sock_read=t),
        trust_env=False,
    )
    client = openai.AsyncOpenAI(
        api_key=key,
        base_url=base,
        max_retries=endpoint.max_retries,
        timeout=t,
        http_client=_http_client(session, _env_proxy(base + "/embeddings"), t),
    )
    try:
        yield client
    finally:
        await client.close()
        await session.close()


def embed_remote(
    endpoint: EndpointConfig,
    texts: Sequence[str],
    journal: Path,
    *,
    label: str,
    batch_size: int = BATCH,
) -> tuple[Array, UsageReport]:
    """Unit-length embeddings of `texts` from the endpoint, and the usage of this call."""
    started = time.perf_counter()
    where = f"{label} ({endpoint.model} at {normalise_base_url(endpoint.base_url)})"
    keys = [text_key(endpoint, t) for t in texts]
    done = read_journal(journal)
    todo: dict[str, str] = {}
    for k, t in zip(keys, texts, strict=True):
        if k not in done and k not in todo:
            todo[k] = t
    hits = sum(1 for k in set(keys) if k in done)
    requests = retries = input_tokens = 0
    if todo:
        key = resolve_api_key(endpoint, label)
        journal.parent.mkdir(parents=True, exist_ok=True)
        pending = list(todo.items())

        async def send_all() -> tuple[int, int, int]:
            requests = retries = input_tokens = 0
            async with _client(endpoint, key) as client:
                with journal.open("a", encoding="utf-8") as f:
                    for start in range(0, len(pending), batch_size):
                        batch = pending[start : start + batch_size]
                        texts_ = [t for _, t in batch]
                        vectors, used, retried = await _ask(client, endpoint, texts_, where, start)
                        requests += 1
                        retries += retried
                        input_tokens += used
                        for (k, _), v in zip(batch, vectors, strict=True):
                            done[k] = v
                            f.write(json.dumps({"key": k, "vector": v}) + "\n")
                        f.flush()
                        os.fsync(f.fileno())
            return requests, retries, input_tokens

        requests, retries, input_tokens = asyncio.run(send_all())
        log.info("%s: %d texts embedded in %d requests", where, len(todo), requests)
    report = UsageReport(
        label=label,
        items=len(texts),
        ok=len(texts),
        errors=0,
        requests_sent=requests,
        retries=retries,
        cache_hits=0,
        cache_misses=len(todo),
        journal_hits=hits,
        input_tokens=input_tokens,
        output_tokens=0,
        cost_usd=cost_usd(endpoint, input_tokens, 0),
        wall_s=round(time.perf_counter() - started, 3),
    )
    return _normalised([done[k] for k in keys]), report


async def _ask(
    client: Any, endpoint: EndpointConfig, batch: list[str], where: str, start: int
) -> tuple[list[list[float]], int, int]:
    import openai

    problem = ""
    retried = 0
    for _ in range(BAD_ANSWER_TRIES):
        try:
            create = client.embeddings.with_raw_response.create
            raw = await create(model=endpoint.model, input=batch)
            retried += int(getattr(raw, "retries_taken", 0) or 0)
            resp = raw.parse()
        except openai.APIStatusError as e:
            raise EmbeddingError(
                f"{where}: the server answered {e.status_code} for texts {start}.."
                f"{start + len(batch) - 1}: {str(e.message)[:300]}"
            ) from None
        except openai.APIError as e:  # connection errors and timeouts after the client's retries
            raise EmbeddingError(f"{where}: {type(e).__name__}: {str(e)[:300]}") from None
        except ValueError as e:  # an answer that is not JSON
            problem = f"not JSON ({str(e)[:120]})"
            continue
        try:
            vectors = _vectors(resp, len(batch))
        except ValueError as e:
            problem = str(e)
            continue
        usage = getattr(resp, "usage", None)
        return vectors, int(getattr(usage, "prompt_tokens", 0) or 0), retried
    raise EmbeddingError(
        f"{where}: unusable answer for texts {start}..{start + len(batch) - 1} after"
        f" {BAD_ANSWER_TRIES} tries: {problem}"
    )


def embed_local(texts: Sequence[str]) -> Array:
    """Unit-length MiniLM embeddings (the offline fallback; each text cut to 256 word pieces)."""
    from pipeline.retrieval.dense import embed

    return _normalised(embed(list(texts)))


def cosine_pairs(a: Array, b: Array) -> npt.NDArray[np.float64]:
    """Row-wise cosine similarity of two arrays of vectors."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = np.linalg.norm(a64, axis=1), np.linalg.norm(b64, axis=1)
    dots = np.einsum("ij,ij->i", a64, b64)
    return np.asarray(dots / np.where(na * nb == 0, 1.0, na * nb), dtype=np.float64)
