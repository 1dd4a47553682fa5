"""Content-addressed response cache: one SQLite file shared by all stages and processes.

WAL mode and a busy timeout make it safe for several processes (parallel DVC stages) at once.
Lookups are batched at the start of a run; writes go through a writer thread that commits in
batches, so the event loop never waits for SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import LfbenchError

log = logging.getLogger("lfbench.llm")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    finish_reason TEXT,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    model TEXT,
    created REAL NOT NULL
)
"""
_BUSY_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class CachedAnswer:
    key: str
    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    model: str | None = None


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        str(path), timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class ResponseCache:
    """Successful answers keyed by :func:`pipeline.llm.client.cache_key`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = _connect(path)
            self._conn.execute(_SCHEMA)
        except sqlite3.Error as e:
            raise LfbenchError(
                f"response cache {path}: cannot open it ({e}); delete the file to start a new one"
            ) from e
        self._queue: queue.SimpleQueue[CachedAnswer | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self.write_errors = 0

    # ---------------------------------------------------------------- reads

    def get_many(self, keys: Iterable[str], chunk: int = 500) -> dict[str, CachedAnswer]:
        wanted = list(dict.fromkeys(keys))
        out: dict[str, CachedAnswer] = {}
        for i in range(0, len(wanted), chunk):
            part = wanted[i : i + chunk]
            marks = ",".join("?" * len(part))
            rows = self._conn.execute(
                "SELECT key, text, finish_reason, input_tokens, output_tokens, model"
                f" FROM responses WHERE key IN ({marks})",
                part,
            ).fetchall()
            for key, text, finish, tin, tout, model in rows:
                out[key] = CachedAnswer(key, text, finish, int(tin), int(tout), model)
        return out

    def get(self, key: str) -> CachedAnswer | None:
        return self.get_many([key]).get(key)

    # ---------------------------------------------------------------- writes

    def put(self, answer: CachedAnswer) -> None:
        """Queue an answer for the writer thread (non-blocking)."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="lfbench-llm-cache", daemon=True
            )
            self._writer.start()
        self._queue.put(answer)

    def put_now(self, answers: list[CachedAnswer]) -> None:
        """Write answers synchronously, in one transaction."""
        self._write_batch(self._conn, answers)

    def _write_batch(self, conn: sqlite3.Connection, batch: list[CachedAnswer]) -> None:
        now = time.time()
        rows = [
            (a.key, a.text, a.finish_reason, a.input_tokens, a.output_tokens, a.model, now)
            for a in batch
        ]
        for attempt in range(5):
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(
                        "INSERT OR REPLACE INTO responses"
                        " (key, text, finish_reason, input_tokens, output_tokens, model, created)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        rows,
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
                return
            except sqlite3.OperationalError as e:
                if attempt == 4:
                    self.write_errors += len(batch)
                    log.warning(
                        "response cache %s: could not write %d answers: %s",
                        self.path,
                        len(batch),
                        e,
                    )
                    return
                time.sleep(0.2 * (attempt + 1))

    def _write_loop(self) -> None:
        conn = _connect(self.path)
        try:
            done = False
            while not done:
                item = self._queue.get()
                batch: list[CachedAnswer] = []
                if item is None:
                    done = True
                else:
                    batch.append(item)
                # take whatever else is already queued: one transaction for all of it
                while len(batch) < 1000:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        done = True
                        break
                    batch.append(nxt)
                if batch:
                    self._write_batch(conn, batch)
        finally:
            conn.close()

    def close(self) -> None:
        """Flush the queued writes and close (blocking: call it from a thread in async code)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        self._conn.close()
