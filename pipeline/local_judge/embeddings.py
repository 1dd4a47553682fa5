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
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache, partial
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

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
    """Vectors keyed by :func:`text_key` in one SQLite file, safe for concurrent stages."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = sqlite3.connect(str(path), timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vec BLOB NOT NULL)"
        )

    def get_many(self, keys: Sequence[str]) -> dict[str, Array]:
        found: dict[str, Array] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                f"SELECT key, vec FROM vectors WHERE key IN ({marks})", chunk
            ).fetchall()
            for key, blob in rows:
                vec = np.frombuffer(blob, dtype=np.float16).astype(np.float32)
                if vec.shape == (DIM,):
                    found[key] = vec
        return found

    def put_many(self, items: Sequence[tuple[str, Array]]) -> None:
        self._conn.execute("BEGIN")
        self._conn.executemany(
            "INSERT OR REPLACE INTO vectors (key, vec) VALUES (?, ?)",
            [(k, np.asarray(v, dtype=np.float16).tobytes()) for k, v in items],
        )
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()


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
        todo = sorted(missing.items(), key=lambda kv: kv[0])
        parts = [todo[i : i + self.chunk] for i in range(0, len(todo), self.chunk)]
        ticker = Ticker(log, "embedding", len(todo), "texts")
        for part, vecs in zip(
            parts,
            _encode_parts([[t for _, t in p] for p in parts], self.model_dir),
            strict=True,
        ):
            new = [(k, vecs[i]) for i, (k, _) in enumerate(part)]
            self.memory.update(new)
            self.computed += len(new)
            if self.cache is not None:
                self.cache.put_many(new)
            ticker.advance(len(new))
        if not keys:
            return np.zeros((0, DIM), dtype=np.float32)
        return np.stack([self.memory[k] for k in keys])

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


def _encode_parts(parts: Sequence[Sequence[str]], model_dir: Path) -> Iterator[Array]:
    """Vectors of each part, in order: in worker processes when there is enough to do."""
    n = min(workers(), len(parts))
    if n <= 1 or sum(len(p) for p in parts) < _PARALLEL_FROM:
        for p in parts:
            yield encode_texts(p, model_dir)
        return
    encoder_onnx.model_path(model_dir)  # built once here, not by each worker
    log.info("embedding %d texts in %d processes", sum(len(p) for p in parts), n)
    # spawn: a fresh interpreter per worker (no forked locks, threads or SQLite handles)
    with ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn")) as pool:
        yield from pool.map(partial(encode_texts, model_dir=model_dir), parts)
