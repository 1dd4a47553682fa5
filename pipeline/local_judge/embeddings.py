"""MiniLM sentence embeddings with a persistent, content-addressed cache.

The local judge embeds every bullet of every summary it judges (about 26,000 for the 78
published systems on the news haystacks), which takes minutes with the numpy encoder of
`pipeline.retrieval.dense` on 2 cores. The vectors are a pure function of (encoder, text), so
they are kept in one SQLite file (`.lfbench/cache/embeddings.sqlite`, like the LLM response
cache) keyed by the SHA-256 of the encoder id and the text: a stage that meets a text another
stage already embedded reads it instead. Each vector is rounded to float16 precision before it is
stored and when it is computed, and each text is encoded on its own (no batch padding) on one
thread, so a cache hit and a fresh computation give identical numbers; the encoder's graph gives
the same bits on every x86-64 CPU family (see `encoder_onnx`), so a cache filled on one machine
holds what any other would compute.

The encoder is `pipeline.local_judge.encoder_onnx`: the same MiniLM in ONNX Runtime with int8
weights (the retrievers keep the numpy float32 one of `pipeline.retrieval.dense`). Each text is
one forward pass on one thread, and the texts are spread over worker processes (one per CPU the
process may use, `LFBENCH_EMBED_WORKERS` to override): the same bits whatever the number of
workers. The vectors are stored as each chunk of texts finishes, so an interrupted run keeps what
it made. The cache key names the encoder and the onnx/onnxruntime versions, so vectors of another
encoder (the numpy one before, another runtime) are never read back.

Stages that share a cache share the work too. Several processes that miss the same texts at once
(copies of a project on one `LFBENCH_EMBEDDING_CACHE`, a team's stages side by side) would each
compute them. So a process claims the texts it is about to compute, a batch at a time, in the
cache's `claims` table, computes only its own claims and waits for the vectors of texts another
process claimed, reading them when they are stored. A claim is renewed as its batch makes
progress; one whose process has ended (on this machine: its pid and start time are gone) or that
was not renewed for `CLAIM_LEASE_S` (a container, another host) is taken over, so a killed stage
leaves nothing to wait for. Which process computes a text changes nothing: a vector is a pure
function of the text.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache, partial
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from pipeline.core import procs
from pipeline.core.progress import Ticker
from pipeline.local_judge import encoder_onnx
from pipeline.local_judge.encoder_onnx import default_cache_path as default_cache_path

ENCODER_ID = (
    "all-MiniLM-L6-v2/onnx-int8-u8s8-7bit-per-channel/integer-attention/cpu-portable"
    "/first-window/per-text/1-thread/f16"
)
DIM = 384
_BUSY_TIMEOUT_S = 60.0
ENV_WORKERS = "LFBENCH_EMBED_WORKERS"
_PARALLEL_FROM = 64  # fewer texts than this are embedded in the calling process
CLAIM_LEASE_S = 120.0  # a claim not renewed for this long is another process's to take over
_POLL_S = (0.2, 2.0)  # waiting for another process's vectors: first and longest pause
_SCAN = 500  # keys per SQL query (SQLite's default limit on variables is 32,766)

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float32]


@lru_cache(maxsize=1)
def _key_prefix() -> str:
    return f"{ENCODER_ID}/{encoder_onnx.runtime_versions()}\0"


def text_key(text: str) -> str:
    """SHA-256 of the encoder, its runtime's versions and the text."""
    return hashlib.sha256(f"{_key_prefix()}{text}".encode()).hexdigest()


def _quantise(vectors: Array) -> Array:
    """Round to float16 precision (about 3 significant digits): order-independent numbers."""
    out: Array = vectors.astype(np.float16).astype(np.float32)
    return out


class EmbeddingCache:
    """Vectors keyed by :func:`text_key` in one SQLite file, safe for concurrent stages, with
    the claims by which those stages share the computing (`claim`)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = sqlite3.connect(str(path), timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vec BLOB NOT NULL)"
        )
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS claims"
            " (key TEXT PRIMARY KEY, owner TEXT NOT NULL, at REAL NOT NULL)"
        )

    def get_many(self, keys: Sequence[str]) -> dict[str, Array]:
        found: dict[str, Array] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _SCAN):
            chunk = unique[start : start + _SCAN]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                f"SELECT key, vec FROM vectors WHERE key IN ({marks})", chunk
            ).fetchall()
            for key, blob in rows:
                vec = np.frombuffer(blob, dtype=np.float16).astype(np.float32)
                if vec.shape == (DIM,):
                    found[key] = vec
        return found

    def put_many(self, items: Sequence[tuple[str, Array]], owner: str | None = None) -> None:
        """Store these vectors; `owner`'s claims on them end and its other claims are renewed
        (its batch makes progress), in the same transaction."""
        self._conn.execute("BEGIN")
        self._conn.executemany(
            "INSERT OR REPLACE INTO vectors (key, vec) VALUES (?, ?)",
            [(k, np.asarray(v, dtype=np.float16).tobytes()) for k, v in items],
        )
        if owner is not None:
            self._conn.executemany(
                "DELETE FROM claims WHERE key = ? AND owner = ?", [(k, owner) for k, _ in items]
            )
            self._conn.execute("UPDATE claims SET at = ? WHERE owner = ?", (time.time(), owner))
        self._conn.execute("COMMIT")

    def claim(
        self, keys: Sequence[str], owner: str, limit: int
    ) -> tuple[list[str], dict[str, Array], list[str]]:
        """Of `keys` (in order, none of them stored when last looked): up to `limit` claimed
        for `owner` (unclaimed ones, its own, and those of an ended or silent owner), the
        vectors stored since, and the rest (claimed by another live owner, or not looked at
        once `limit` was reached), in one transaction."""
        mine: list[str] = []
        found: dict[str, Array] = {}
        rest: list[str] = []
        alive: dict[tuple[str, float], bool] = {}  # (owner, renewed at): whether it binds
        now = time.time()
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for start in range(0, len(keys), _SCAN):
                chunk = list(keys[start : start + _SCAN])
                if len(mine) >= limit:
                    rest.extend(chunk)
                    continue
                found.update(self.get_many(chunk))
                marks = ",".join("?" * len(chunk))
                held = {
                    key: (who, at)
                    for key, who, at in self._conn.execute(
                        f"SELECT key, owner, at FROM claims WHERE key IN ({marks})", chunk
                    )
                }
                take = []
                for key in chunk:
                    if key in found:
                        continue
                    who, at = held.get(key, (None, 0.0))
                    if who is not None and who != owner and (who, at) not in alive:
                        alive[who, at] = _owner_alive(who, at, now)
                    if len(mine) < limit and (who in (None, owner) or not alive[who, at]):
                        mine.append(key)
                        take.append(key)
                    else:
                        rest.append(key)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO claims (key, owner, at) VALUES (?, ?, ?)",
                    [(k, owner, now) for k in take],
                )
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return mine, found, rest

    def release(self, owner: str) -> None:
        """`owner`'s claims end (it stops: done, failed or interrupted)."""
        self._conn.execute("DELETE FROM claims WHERE owner = ?", (owner,))

    def close(self) -> None:
        self._conn.close()


def owner_id() -> str:
    """Who claims: this process (`procs.this_process`) and a nonce (two Embedders of one process
    are two owners)."""
    return f"{procs.this_process()}/{secrets.token_hex(4)}"


def _owner_alive(owner: str, at: float, now: float) -> bool:
    """Whether a claim still binds: renewed within the lease and, when the owner is a process
    this one can see, that process still running."""
    if now - at > CLAIM_LEASE_S:
        return False
    return procs.process_gone(owner.rpartition("/")[0]) is not True


class Embedder:
    """Embeds texts once: an in-memory table in front of the (optional) SQLite cache."""

    def __init__(self, cache_path: Path | None = None, *, chunk: int = 256) -> None:
        self.cache = EmbeddingCache(cache_path) if cache_path is not None else None
        # the ONNX model is built beside the vectors (or in the project's cache folder)
        self.model_dir = (cache_path or default_cache_path()).parent / "onnx"
        self.memory: dict[str, Array] = {}
        self.chunk = chunk
        self.computed = 0
        self.cache_hits = 0

    def embed(self, texts: Sequence[str]) -> Array:
        """Unit-length (approximately, after rounding) vectors (len(texts), 384)."""
        keys = [text_key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self.memory}
        if missing and self.cache is not None:
            hits = self.cache.get_many(list(missing))
            self.memory.update(hits)
            self.cache_hits += len(hits)
            missing = {k: t for k, t in missing.items() if k not in hits}
        if missing:
            ticker = Ticker(log, "embedding", len(missing), "texts")
            with _Parts(self.model_dir, len(missing)) as parts:
                if self.cache is None:
                    self._compute(sorted(missing), missing, parts, ticker, None)
                else:
                    self._share(sorted(missing), missing, parts, ticker)
        if not keys:
            return np.zeros((0, DIM), dtype=np.float32)
        return np.stack([self.memory[k] for k in keys])

    def _share(self, todo: list[str], texts: dict[str, str], parts: _Parts, ticker: Ticker) -> None:
        """Compute the texts this process claims, a batch at a time, and read those another
        process claimed once it has stored them."""
        assert self.cache is not None
        owner = owner_id()
        batch = self.chunk * parts.n * 4  # a few chunks per worker and batch
        pause = _POLL_S[0]
        try:
            while todo:
                mine, found, todo = self.cache.claim(todo, owner, batch)
                self.memory.update(found)
                self.cache_hits += len(found)
                ticker.advance(len(found))
                if mine:
                    self._compute(mine, texts, parts, ticker, owner)
                    pause = _POLL_S[0]
                elif todo and not found:  # all claimed by others at work: wait for them
                    time.sleep(pause)
                    pause = min(pause * 2, _POLL_S[1])
        finally:
            with contextlib.suppress(sqlite3.Error):
                self.cache.release(owner)

    def _compute(
        self,
        todo: list[str],
        texts: dict[str, str],
        parts: _Parts,
        ticker: Ticker,
        owner: str | None,
    ) -> None:
        chunks = [todo[i : i + self.chunk] for i in range(0, len(todo), self.chunk)]
        encoded = parts.encode([[texts[k] for k in c] for c in chunks])
        for chunk, vecs in zip(chunks, encoded, strict=True):
            new = [(k, vecs[i]) for i, k in enumerate(chunk)]
            self.memory.update(new)
            self.computed += len(new)
            if self.cache is not None:
                self.cache.put_many(new, owner)
            ticker.advance(len(new))

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def workers() -> int:
    """Worker processes for embedding: $LFBENCH_EMBED_WORKERS, else the CPUs this process may
    run on."""
    raw = os.environ.get(ENV_WORKERS)
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"{ENV_WORKERS}={raw!r} is not a whole number") from None
        return max(1, n)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def encode_texts(texts: Sequence[str], model_dir: Path | None = None) -> Array:
    """Quantised vectors of `texts`, one text per forward pass on one thread."""
    encoder = encoder_onnx.get_encoder(model_dir)
    with threadpool_limits(limits=1):
        out = encoder.encode(texts)
    return _quantise(out)


class _Parts:
    """Encodes lists of texts, in order: in worker processes (started at the first list that
    needs them, kept for the next) when there is enough to do."""

    def __init__(self, model_dir: Path, total: int) -> None:
        self.model_dir = model_dir
        self.n = workers() if total >= _PARALLEL_FROM else 1
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Parts:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def encode(self, parts: Sequence[Sequence[str]]) -> Iterator[Array]:
        n = min(self.n, len(parts))
        if n <= 1 or sum(len(p) for p in parts) < _PARALLEL_FROM:
            for p in parts:
                yield encode_texts(p, self.model_dir)
            return
        if self._pool is None:
            encoder_onnx.model_path(self.model_dir)  # built once here, not by each worker
            log.info("embedding in %d processes", self.n)
            # spawn: a fresh interpreter per worker (no forked locks, threads or SQLite handles)
            self._pool = ProcessPoolExecutor(max_workers=self.n, mp_context=get_context("spawn"))
        yield from self._pool.map(partial(encode_texts, model_dir=self.model_dir), parts)
