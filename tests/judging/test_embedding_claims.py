"""Processes on one embedding cache share the computing: each text is computed once, by the
process that claimed it; the others read its vector, and a claim of an ended process is taken
over at once (pipeline/local_judge/embeddings.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.core import procs
from pipeline.local_judge import embeddings as E
from pipeline.local_judge.embeddings import Embedder, EmbeddingCache, encode_texts, text_key
from tests.conftest import encoder_beside

TEXTS = [f"Bullet {i}: the council voted on budget line {i * 7}." for i in range(96)]


def _claims(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT key, owner FROM claims"))


def _embed_in_child(path: str, texts: list[str], start: Any, out: Any) -> None:
    os.environ[E.ENV_WORKERS] = "1"
    emb = Embedder(Path(path), chunk=8)
    start.wait()
    vecs = emb.embed(texts)
    out.put((emb.computed, emb.cache_hits, vecs.tobytes()))
    emb.close()


def test_two_processes_on_one_cache_compute_each_text_once(tmp_path: Path) -> None:
    cache = encoder_beside(tmp_path / "shared.sqlite")
    EmbeddingCache(cache).close()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_embed_in_child, args=(str(cache), TEXTS, start, out)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    computed = [r[0] for r in results]
    # both started at once on the same 96 texts: together they computed each one once
    assert sum(computed) == len(TEXTS), computed
    assert all(c + h == len(TEXTS) for c, h, _ in results)
    assert results[0][2] == results[1][2]
    alone = Embedder(None).embed(TEXTS)
    assert np.frombuffer(results[0][2], dtype=np.float32).tobytes() == alone.tobytes()
    assert _claims(cache) == []  # nothing left claimed


def test_texts_another_live_process_claimed_are_waited_for_not_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(E.ENV_WORKERS, "1")
    path = encoder_beside(tmp_path / "c.sqlite")
    other = EmbeddingCache(path)
    theirs = TEXTS[:40]
    # another process of this machine (this test's own process: alive) holds 40 of the texts
    owner = E.owner_id()
    mine, _, _ = other.claim([text_key(t) for t in theirs], owner, limit=1000)
    assert len(mine) == 40
    result: dict[str, Any] = {}

    def embed() -> None:
        emb = Embedder(path, chunk=8)
        result["emb"] = emb
        result["v"] = emb.embed(TEXTS)
        emb.close()

    worker = threading.Thread(target=embed)
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and getattr(result.get("emb"), "computed", 0) < 56:
        time.sleep(0.1)
    time.sleep(1.0)
    # the other 56 texts are done; the 40 claimed are waited for, not computed
    assert worker.is_alive()
    emb = result["emb"]
    assert emb.computed == len(TEXTS) - 40
    other.put_many(
        list(zip([text_key(t) for t in theirs], encode_texts(theirs), strict=True)), owner
    )
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert emb.computed == 56 and emb.cache_hits == 40
    assert result["v"].tobytes() == Embedder(None).embed(TEXTS).tobytes()
    assert _claims(path) == []
    other.close()


def test_claims_of_an_ended_or_silent_owner_are_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    cache = EmbeddingCache(path)
    keys = [text_key(t) for t in TEXTS[:10]]
    boot, pidns = procs.this_process().split("/")[:2]
    # a process of this machine that has ended (no such start time), one of another machine
    # that renewed its claim just now, and one whose claim is older than the lease
    ended = f"{boot}/{pidns}/{os.getpid()}/0/dead"
    elsewhere = "another-host/ns:[1]/42/7/x"
    now = time.time()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO claims VALUES (?, ?, ?)",
            [(k, ended, now) for k in keys[:3]]
            + [(k, elsewhere, now) for k in keys[3:6]]
            + [(k, elsewhere, now - E.CLAIM_LEASE_S - 1) for k in keys[6:]],
        )
    mine, found, rest = cache.claim(keys, E.owner_id(), limit=100)
    assert sorted(mine) == sorted(keys[:3] + keys[6:])
    assert found == {} and rest == keys[3:6]
    cache.close()


SLOW = [f"slow text {i}" for i in range(400)]


def _embed_forever(path: str) -> None:
    os.environ[E.ENV_WORKERS] = "1"
    # chunks of 100: one batch claims all 400 texts, so its claims stay until it ends
    Embedder(Path(path), chunk=100).embed(SLOW)


def test_a_killed_process_leaves_claims_that_the_next_takes_over_at_once(tmp_path: Path) -> None:
    path = encoder_beside(tmp_path / "c.sqlite")
    EmbeddingCache(path).close()
    proc = multiprocessing.get_context("spawn").Process(target=_embed_forever, args=(str(path),))
    proc.start()
    deadline = time.monotonic() + 120
    stored = 0
    while time.monotonic() < deadline and stored < 100:
        time.sleep(0.05)
        with sqlite3.connect(path) as conn:
            stored = conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
    assert 100 <= stored < len(SLOW), stored  # killed after its first chunk, before its last
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    left = _claims(path)
    assert left, "the killed process held claims"
    os.environ[E.ENV_WORKERS] = "1"
    try:
        emb = Embedder(path, chunk=4)
        texts = SLOW
        started = time.monotonic()
        emb.embed(texts[:40])
        # its claims did not make this one wait for a lease to run out
        assert time.monotonic() - started < E.CLAIM_LEASE_S / 4
        with sqlite3.connect(path) as conn:
            stored_now = conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
        assert emb.computed + emb.cache_hits == 40 and stored_now >= 40
        emb.close()
    finally:
        del os.environ[E.ENV_WORKERS]
