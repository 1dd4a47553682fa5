"""Content-addressed response cache, shared by every stage and process, and by a team.

Two backends, one schema and one set of guarantees:

- SQLite (the default, one machine): `.lfbench/cache/llm.sqlite`, or ``LFBENCH_CACHE_URL=sqlite:///
  /abs/path.sqlite`` to share one file between workspaces (e.g. `dvc exp run --queue` workers).
  WAL mode and a busy timeout make it safe for several processes at once.
- PostgreSQL (a team): ``LFBENCH_CACHE_URL=postgresql://user@host:port/db``, shared by every
  machine. The password comes from the URL's environment (``PGPASSWORD``) or ``~/.pgpass``, as
  libpq reads them; it is never logged.

Every entry carries a SHA-256 of its content, checked on every read: an entry that fails it is
refused, counted (``corrupt``), logged with its key, and fetched again (the new answer overwrites
it). A cache hit is therefore always the bytes that were stored.

Claims (a cache named by ``LFBENCH_CACHE_URL``, i.e. one that several workspaces or machines share,
and the workspace's own SQLite file while `lfbench repro --jobs` runs stages side by side; under
`dvc repro` it has one user at a time and skips them, one write transaction per request less): a
worker that is about to send a request first claims its key (a row in ``claims`` with an owner and
a lease). Another worker that needs the same key at the same moment waits for the answer instead
of sending it again. The owner renews its leases while it lives (a heartbeat thread); a worker
that dies stops renewing, its leases run out, and a waiting worker claims the key and sends it.
An answer and the release of its claim are one transaction, and a worker re-reads the cache after
winning a claim, so no answer is ever fetched twice by two live workers.

Lookups are batched; writes go through a writer thread that commits in batches, so the event
loop never waits for the database.

A shared PostgreSQL cache that goes away mid-run (stopped, restarted, the network gone) ends the
run with :class:`CacheUnavailable` (a failed stage: exit 3), by choice rather than continuing
without it: without the cache, claims stop working and two workers sharing it could pay for the
same request twice. The answers finished so far are in the stage's journal, so a re-run once the
cache answers again sends none of them twice (and puts them in the cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pipeline.core.errors import LfbenchError, StageFailed

log = logging.getLogger("lfbench.llm")

CACHE_URL_ENV = "LFBENCH_CACHE_URL"
CLAIMS_ENV = "LFBENCH_CACHE_CLAIMS"
LEASE_S = 30.0  # a claim's lease (LFBENCH_CACHE_LEASE_S); renewed every third of it
_BUSY_TIMEOUT_MS = 60_000
_COLUMNS = "key, text, finish_reason, input_tokens, output_tokens, model, checksum"


class CacheUnavailable(StageFailed):
    """The shared cache went away mid-run: the stage ends (its journal keeps finished answers)."""


@dataclass(frozen=True)
class CachedAnswer:
    key: str
    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    model: str | None = None


def checksum(a: CachedAnswer) -> str:
    """SHA-256 of an entry's content (every field, in a fixed JSON form)."""
    body = json.dumps(
        [a.key, a.text, a.finish_reason, a.input_tokens, a.output_tokens, a.model],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


# A query parameter whose name says it holds a secret (`password=`, `token=`, `api_key=`, ...)
SECRET_QUERY = re.compile(r"pass|secret|token|key|auth|signature|credential", re.IGNORECASE)


def redact(url: str) -> str:
    """A store URL as logs and errors show it (the response cache's, MLflow's, a DVC remote's):
    its password, any query value whose name says secret (libpq's `?password=`, `token=`, ...)
    and its fragment replaced by `***`."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if SECRET_QUERY.search(k) else v) for k, v in pairs], safe="*")
    fragment = "***" if parts.fragment else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment))


# ---------------------------------------------------------------- backends


class _Backend:
    """What differs between SQLite and PostgreSQL: connections, placeholders, the clock."""

    where: str
    now_sql: str
    shared: bool

    def connect(self) -> Any:
        raise NotImplementedError

    def q(self, sql: str) -> str:
        return sql

    @contextlib.contextmanager
    def tx(self, conn: Any) -> Iterator[Any]:
        raise NotImplementedError
        yield  # pragma: no cover

    def setup(self, conn: Any) -> None:
        raise NotImplementedError

    def is_busy(self, e: BaseException) -> bool:
        return False

    def is_lost(self, e: BaseException) -> bool:
        """Whether `e` says the database went away (not a conflict to retry)."""
        return False

    def executemany(self, conn: Any, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        conn.executemany(sql, rows)


_RESPONSES = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    finish_reason TEXT,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    model TEXT,
    created DOUBLE PRECISION NOT NULL,
    checksum TEXT
)
"""
_CLAIMS = """
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires DOUBLE PRECISION NOT NULL
)
"""


class _Sqlite(_Backend):
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    shared = False

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        self.path = path
        self.where = str(path)
        self.shared = shared

    def connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(self.path),
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @contextlib.contextmanager
    def tx(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def setup(self, conn: sqlite3.Connection) -> None:
        with self.tx(conn):
            conn.execute(_RESPONSES)
            conn.execute(_CLAIMS)
            cols = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
            if "checksum" not in cols:  # a cache written before entries carried checksums
                conn.execute("ALTER TABLE responses ADD COLUMN checksum TEXT")
        _backfill_checksums(self, conn)

    def is_busy(self, e: BaseException) -> bool:
        return isinstance(e, sqlite3.OperationalError)


class _Postgres(_Backend):
    now_sql = "extract(epoch from clock_timestamp())::double precision"
    shared = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact(url)

    def connect(self) -> Any:
        import psycopg

        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            raise LfbenchError(
                f"response cache {self.where}: cannot connect ({str(e).strip()}); check"
                f" {CACHE_URL_ENV}, that the server answers, and PGPASSWORD or ~/.pgpass"
            ) from None

    def q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def executemany(self, conn: Any, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    @contextlib.contextmanager
    def tx(self, conn: Any) -> Iterator[Any]:
        with conn.transaction():
            yield conn

    def setup(self, conn: Any) -> None:
        # One creator at a time: many workers may open a fresh database at once.
        with self.tx(conn):
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('lfbench-response-cache'))")
            conn.execute(_RESPONSES)
            conn.execute(_CLAIMS)
        _backfill_checksums(self, conn)

    def is_busy(self, e: BaseException) -> bool:
        import psycopg

        return isinstance(e, psycopg.errors.SerializationFailure | psycopg.errors.DeadlockDetected)

    def is_lost(self, e: BaseException) -> bool:
        import psycopg

        return isinstance(e, psycopg.OperationalError | psycopg.InterfaceError) and not (
            self.is_busy(e)
        )


def _backfill_checksums(b: _Backend, conn: Any) -> None:
    rows = conn.execute(b.q(f"SELECT {_COLUMNS} FROM responses WHERE checksum IS NULL")).fetchall()
    if not rows:
        return
    with b.tx(conn):
        for r in rows:
            a = CachedAnswer(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5])
            sql = b.q("UPDATE responses SET checksum = ? WHERE key = ?")
            conn.execute(sql, (checksum(a), a.key))
    log.info(
        "response cache %s: %d entries written before entries carried checksums: checksummed now",
        b.where,
        len(rows),
    )


def backend_for(default_path: Path | None) -> _Backend | None:
    """The cache ``LFBENCH_CACHE_URL`` names, else the SQLite file at `default_path` (None: no
    cache), with claims when ``LFBENCH_CACHE_CLAIMS=1`` (`lfbench repro --jobs` sets it: its
    stages share the workspace's file at the same time)."""
    url = os.environ.get(CACHE_URL_ENV, "").strip()
    if not url:
        claims = os.environ.get(CLAIMS_ENV, "").strip() == "1"
        return _Sqlite(default_path, shared=claims) if default_path is not None else None
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        return _Postgres(url)
    if scheme == "sqlite":
        path = url[len("sqlite://") :]
        if not path.startswith("/"):
            raise LfbenchError(f"{CACHE_URL_ENV}={url}: give an absolute path, sqlite:////abs/file")
        return _Sqlite(Path(path), shared=True)
    raise LfbenchError(
        f"{CACHE_URL_ENV}={redact(url)}: unknown scheme {scheme!r}"
        " (postgresql://user@host:port/db or sqlite:////abs/path.sqlite)"
    )


# ---------------------------------------------------------------- the cache


_OPEN_ATTEMPTS = 20


class ResponseCache:
    """Successful answers keyed by :func:`pipeline.llm.client.cache_key`."""

    def __init__(self, path: Path | None = None, *, backend: _Backend | None = None) -> None:
        b = backend if backend is not None else backend_for(path)
        if b is None:
            raise ValueError("ResponseCache needs a path or a backend")
        self.backend = b
        self.where = b.where
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = float(os.environ.get("LFBENCH_CACHE_LEASE_S", LEASE_S))
        for attempt in range(1, _OPEN_ATTEMPTS + 1):
            try:
                self._conn = b.connect()
                b.setup(self._conn)
                break
            except LfbenchError:
                raise
            except Exception as e:
                # Two processes opening a new SQLite cache at once race on its switch to WAL
                # and its schema, and SQLite answers the loser "database is locked" at once,
                # without its busy timeout: the loser tries again.
                if b.is_busy(e) and attempt < _OPEN_ATTEMPTS:
                    time.sleep(0.05 * attempt)
                    continue
                raise LfbenchError(
                    f"response cache {b.where}: cannot open it ({e}); for the SQLite cache,"
                    " delete the file to start a new one"
                ) from e
        self._queue: queue.SimpleQueue[CachedAnswer | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()
        self.write_errors = 0
        self._corrupt: set[str] = set()

    @property
    def corrupt(self) -> int:
        """Entries refused for a failed checksum (each key once)."""
        return len(self._corrupt)

    @property
    def shared(self) -> bool:
        return self.backend.shared

    # ---------------------------------------------------------------- reads

    @contextlib.contextmanager
    def _lost(self, doing: str) -> Iterator[None]:
        """Turn "the database went away" into :class:`CacheUnavailable`, naming the cache (no
        password) and what is kept."""
        try:
            yield
        except Exception as e:
            if not self.backend.is_lost(e):
                raise
            reason = " ".join(str(e).split())[:300]
            raise CacheUnavailable(
                f"response cache {self.where}: lost while {doing} ({type(e).__name__}: {reason});"
                " the stage stops here. The answers finished so far are kept in the stage's"
                " journal: once the cache answers again, re-run (dvc repro) and none of them is"
                f" sent again (or unset {CACHE_URL_ENV} to use the workspace's own cache)"
            ) from None

    def get_many(self, keys: Iterable[str], chunk: int = 500) -> dict[str, CachedAnswer]:
        """The entries of these keys that pass their checksum (the others are refused)."""
        with self._lost("reading answers"):
            return self._get_many(keys, chunk)

    def _get_many(self, keys: Iterable[str], chunk: int) -> dict[str, CachedAnswer]:
        b = self.backend
        wanted = list(dict.fromkeys(keys))
        out: dict[str, CachedAnswer] = {}
        for i in range(0, len(wanted), chunk):
            part = wanted[i : i + chunk]
            marks = ",".join("?" * len(part))
            rows = self._conn.execute(
                b.q(f"SELECT {_COLUMNS} FROM responses WHERE key IN ({marks})"), part
            ).fetchall()
            for key, text, finish, tin, tout, model, stored in rows:
                a = CachedAnswer(key, text, finish, int(tin), int(tout), model)
                actual = checksum(a)
                if stored != actual:
                    if key in self._corrupt:
                        continue
                    self._corrupt.add(key)
                    log.warning(
                        "response cache %s: entry %s fails its checksum (stored %s, content %s):"
                        " refused, it will be fetched again",
                        self.where,
                        key,
                        (stored or "none")[:12],
                        actual[:12],
                    )
                    continue
                out[key] = a
        return out

    def get(self, key: str) -> CachedAnswer | None:
        return self.get_many([key]).get(key)

    # ---------------------------------------------------------------- claims

    def claim(self, keys: Sequence[str]) -> set[str]:
        """Claim these keys for this owner; returns the ones claimed (the others are held by a
        live owner elsewhere). A claimed key must then be answered (`put`) or `release`d."""
        with self._lost("claiming a request"):
            return self._claim(keys)

    def _claim(self, keys: Sequence[str]) -> set[str]:
        b = self.backend
        sql = b.q(
            "INSERT INTO claims (key, owner, expires) VALUES (?, ?, "
            f"{b.now_sql} + ?) ON CONFLICT (key) DO UPDATE SET owner = excluded.owner,"
            " expires = excluded.expires"
            f" WHERE claims.expires < {b.now_sql} OR claims.owner = excluded.owner RETURNING key"
        )
        won: set[str] = set()
        for attempt in range(5):
            try:
                with b.tx(self._conn):
                    for k in dict.fromkeys(keys):
                        if self._conn.execute(sql, (k, self.owner, self.lease)).fetchall():
                            won.add(k)
                break
            except Exception as e:
                if not b.is_busy(e) or attempt == 4:
                    raise
                won.clear()
                time.sleep(0.1 * (attempt + 1))
        if won:
            with self._held_lock:
                self._held |= won
            self._start_heartbeat()
        return won

    def release(self, keys: Iterable[str]) -> None:
        ks = list(keys)
        if not ks:
            return
        b = self.backend
        with self._lost("releasing a claim"), b.tx(self._conn):
            for k in ks:
                self._conn.execute(
                    b.q("DELETE FROM claims WHERE key = ? AND owner = ?"), (k, self.owner)
                )
        with self._held_lock:
            self._held -= set(ks)

    def _start_heartbeat(self) -> None:
        if self._beat is None:
            self._beat = threading.Thread(
                target=self._heartbeat, name="lfbench-llm-claims", daemon=True
            )
            self._beat.start()

    def _heartbeat(self) -> None:
        b = self.backend
        try:
            conn = b.connect()
        except LfbenchError as e:  # the claims run out; the next claim or read stops the run
            log.warning("response cache %s: cannot renew claims: %s", self.where, e)
            return
        sql = b.q(f"UPDATE claims SET expires = {b.now_sql} + ? WHERE key = ? AND owner = ?")
        try:
            while not self._stop.wait(self.lease / 3):
                with self._held_lock:
                    held = list(self._held)
                if not held:
                    continue
                try:
                    with b.tx(conn):
                        for k in held:
                            conn.execute(sql, (self.lease, k, self.owner))
                except Exception as e:  # noqa: BLE001 (a missed beat: the next one renews)
                    log.warning("response cache %s: could not renew claims: %s", self.where, e)
        finally:
            conn.close()

    # ---------------------------------------------------------------- writes

    def put(self, answer: CachedAnswer) -> None:
        """Queue an answer for the writer thread (non-blocking); its claim goes with it."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="lfbench-llm-cache", daemon=True
            )
            self._writer.start()
        self._queue.put(answer)

    def put_now(self, answers: list[CachedAnswer]) -> None:
        """Write answers synchronously, in one transaction."""
        with self._lost("writing answers"):
            self._write_batch(self._conn, answers)

    def _write_batch(self, conn: Any, batch: list[CachedAnswer]) -> None:
        b = self.backend
        upsert = b.q(
            f"INSERT INTO responses ({_COLUMNS}, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET text = excluded.text,"
            " finish_reason = excluded.finish_reason, input_tokens = excluded.input_tokens,"
            " output_tokens = excluded.output_tokens, model = excluded.model,"
            " checksum = excluded.checksum, created = excluded.created"
        )
        unclaim = b.q("DELETE FROM claims WHERE key = ? AND owner = ?")
        now = time.time()
        rows = [
            (a.key, a.text, a.finish_reason, a.input_tokens, a.output_tokens, a.model,
             checksum(a), now)
            for a in batch
        ]  # fmt: skip
        for attempt in range(5):
            try:
                with b.tx(conn):
                    b.executemany(conn, upsert, rows)
                    if b.shared:
                        b.executemany(conn, unclaim, [(a.key, self.owner) for a in batch])
                with self._held_lock:
                    self._held -= {a.key for a in batch}
                return
            except Exception as e:
                if not b.is_busy(e) and not _is_transient(e):
                    raise
                if attempt == 4:
                    self.write_errors += len(batch)
                    log.warning(
                        "response cache %s: could not write %d answers: %s",
                        self.where,
                        len(batch),
                        e,
                    )
                    return
                time.sleep(0.2 * (attempt + 1))

    def _write_loop(self) -> None:
        try:
            conn = self.backend.connect()
        except LfbenchError as e:  # the answers stay in the journal; count what is not cached
            n = 0
            while self._queue.get() is not None:
                n += 1
            self.write_errors += n
            log.warning("response cache %s: could not write %d answers: %s", self.where, n, e)
            return
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
        """Flush the queued writes, give back the claims still held, close (blocking: call it
        from a thread in async code)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        with self._held_lock:
            left = list(self._held)
        with contextlib.suppress(Exception):
            self.release(left)
        self._conn.close()


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, sqlite3.OperationalError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)
