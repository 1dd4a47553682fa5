"""MiniLM sentence embeddings with a persistent, content-addressed cache.

The local judge embeds every bullet of every summary it judges (about 26,000 for the 78
published systems on the news haystacks), which takes minutes with the numpy encoder of
`pipeline.retrieval.dense` on 2 cores. The vectors are a pure function of (encoder, text), so
they are kept in one SQLite file (`.lfbench/cache/embeddings.sqlite`, like the LLM response
cache) keyed by the SHA-256 of the encoder id and the text: a stage that meets a text another
stage already embedded reads it instead. Each vector is rounded to float16 precision before it is
stored and when it is computed, and each text is encoded on its own (no batch padding), so a
cache hit and a fresh computation give identical numbers.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pipeline.retrieval import dense

ENCODER_ID = "all-MiniLM-L6-v2/numpy/first-window/per-text/f16"
DIM = 384
_BUSY_TIMEOUT_S = 60.0

Array = npt.NDArray[np.float32]


def text_key(text: str) -> str:
    return hashlib.sha256(f"{ENCODER_ID}\0{text}".encode()).hexdigest()


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


ENV_CACHE = "LFBENCH_EMBEDDING_CACHE"


def default_cache_path(root: Path | None = None) -> Path:
    """`.lfbench/cache/embeddings.sqlite` of the project, or the file $LFBENCH_EMBEDDING_CACHE
    names (to share one cache between copies of the project, e.g. in tests: its vectors are a
    pure function of the text, so sharing cannot change a result)."""
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override)
    return (root or Path.cwd()) / ".lfbench" / "cache" / "embeddings.sqlite"


class Embedder:
    """Embeds texts once: an in-memory table in front of the (optional) SQLite cache."""

    def __init__(self, cache_path: Path | None = None, *, chunk: int = 512) -> None:
        self.cache = EmbeddingCache(cache_path) if cache_path is not None else None
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
        for start in range(0, len(todo), self.chunk):
            part = todo[start : start + self.chunk]
            # One text per forward pass: no padding, so a text's vector does not depend on
            # which other texts it was batched with (batched BLAS shapes change the float
            # rounding). A cold run and a warm cache then give the same bits, and so the same
            # trained model and verdicts; it costs about a quarter of the encoder's speed.
            vecs = _quantise(dense.embed([t for _, t in part], batch_size=1))
            new = [(k, vecs[i]) for i, (k, _) in enumerate(part)]
            self.memory.update(new)
            self.computed += len(new)
            if self.cache is not None:
                self.cache.put_many(new)
        if not keys:
            return np.zeros((0, DIM), dtype=np.float32)
        return np.stack([self.memory[k] for k in keys])

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
