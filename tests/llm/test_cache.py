"""The response cache's guarantees, in both backends (SQLite, PostgreSQL), over real HTTP against
the test server: checksums on every read, claims between workers, a dead worker's claims."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pipeline.core.errors import LfbenchError
from pipeline.llm.cache import CACHE_URL_ENV, CachedAnswer, ResponseCache, checksum, redact
from pipeline.llm.client import ChatRequest, ChatResult, EndpointConfig, UsageReport, run_chat_sync
from pipeline.testing.server import TestServer
from tests.conftest import ROOT

ANSWER = "a fixed answer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    log = tmp_path_factory.mktemp("cache-server") / "requests.log"
    script = [{"match": "[fixed]", "reply": ANSWER}]
    with TestServer(script=script, latency_ms=150, log_path=log, cwd=ROOT) as srv:
        yield srv


@pytest.fixture(params=["sqlite", "postgresql"])
def cache_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A cache URL of each backend (a fresh database for PostgreSQL)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared' / 'llm.sqlite'}"
    pg = request.getfixturevalue("postgres")
    return str(pg.create_database("c" + uuid.uuid4().hex[:12]))


def _endpoint(srv: TestServer, **kw: Any) -> EndpointConfig:
    return EndpointConfig(
        base_url=srv.base_url,
        model="unit-model",
        api_key_env=None,
        max_concurrency=kw.pop("max_concurrency", 4),
        timeout_s=5.0,
        **kw,
    )


def _reqs(n: int, prefix: str, tag: str = "[fixed]") -> list[ChatRequest]:
    return [
        ChatRequest(
            key=f"item-{i}",
            messages=[{"role": "user", "content": f"{prefix} question {i} {tag}"}],
            prompt_sha="p1",
        )
        for i in range(n)
    ]


def _served(srv: TestServer, prefix: str) -> Counter[str]:
    return Counter(
        r["body_sha256"] for r in srv.log() if r["served"] and prefix in r["prompt_head"]
    )


def _run(srv: TestServer, rs: list[ChatRequest], **kw: Any) -> tuple[list[ChatResult], UsageReport]:
    return run_chat_sync(
        _endpoint(srv),
        rs,
        cache_path=kw.pop("cache_path", None),
        journal_path=kw.pop("journal_path", None),
        label="unit",
        progress=False,
    )


# ---------------------------------------------------------------- checksums


def _flip_in_sqlite(path: Path, needle: bytes) -> None:
    """Flip one byte of the first stored `needle` in the SQLite file itself (a disk error, or a
    hostile edit): SQLite has no page checksums, so only the entry's own checksum can see it."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0, "the answer is not in the main database file (still in the WAL?)"
    data[at + 2] ^= 0x01  # "a fixed answer" -> "a gixed answer"
    path.write_bytes(bytes(data))


def test_sqlite_flipped_byte_is_refused_counted_and_fetched_again(
    server: TestServer, tmp_path: Path
) -> None:
    prefix = uuid.uuid4().hex[:10]
    rs = _reqs(3, prefix)
    db = tmp_path / "llm.sqlite"
    _, first = _run(server, rs, cache_path=db)
    assert first.requests_sent == 3 and first.cache_corrupt == 0
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    _flip_in_sqlite(db, ANSWER.encode())

    results, rep = _run(server, rs, cache_path=db)
    assert [r.text for r in results] == [ANSWER] * 3  # the flipped text is never served
    assert rep.cache_corrupt == 1 and rep.cache_hits == 2 and rep.requests_sent == 1
    assert sorted(_served(server, prefix).values()) == [1, 1, 2]  # one entry fetched again

    _, third = _run(server, rs, cache_path=db)  # the new answer replaced the bad entry
    assert third.cache_corrupt == 0 and third.cache_hits == 3 and third.requests_sent == 0


def test_postgres_flipped_byte_is_refused_counted_and_fetched_again(
    server: TestServer, postgres: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres.create_database("flip" + uuid.uuid4().hex[:8])
    monkeypatch.setenv(CACHE_URL_ENV, url)
    prefix = uuid.uuid4().hex[:10]
    rs = _reqs(3, prefix)
    _, first = _run(server, rs)
    assert first.requests_sent == 3
    with psycopg.connect(url, autocommit=True) as conn:
        key = conn.execute("SELECT key FROM responses ORDER BY key LIMIT 1").fetchone()
        assert key is not None
        # one byte of one entry's text, changed where it is stored
        conn.execute(
            "UPDATE responses SET text = overlay(text placing 'g' from 3 for 1) WHERE key = %s",
            (key[0],),
        )
    results, rep = _run(server, rs)
    assert [r.text for r in results] == [ANSWER] * 3
    assert rep.cache_corrupt == 1 and rep.cache_hits == 2 and rep.requests_sent == 1
    _, third = _run(server, rs)
    assert third.cache_corrupt == 0 and third.cache_hits == 3 and third.requests_sent == 0


def test_a_cache_from_before_checksums_is_checksummed_on_open(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TABLE responses (key TEXT PRIMARY KEY, text TEXT NOT NULL, finish_reason TEXT,"
        " input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, model TEXT,"
        " created REAL NOT NULL)"
    )
    conn.execute("INSERT INTO responses VALUES ('k1', 'old text', 'stop', 3, 2, 'm', 0)")
    conn.commit()
    conn.close()
    cache = ResponseCache(db)
    want = CachedAnswer("k1", "old text", "stop", 3, 2, "m")
    assert cache.get("k1") == want and cache.corrupt == 0
    cache.close()
    stored = sqlite3.connect(db).execute("SELECT checksum FROM responses").fetchone()[0]
    assert stored == checksum(want)


def test_checksum_covers_every_field() -> None:
    a = CachedAnswer("k", "text", "stop", 1, 2, "m")
    variants = [
        CachedAnswer("k2", "text", "stop", 1, 2, "m"),
        CachedAnswer("k", "texT", "stop", 1, 2, "m"),
        CachedAnswer("k", "text", "length", 1, 2, "m"),
        CachedAnswer("k", "text", "stop", 9, 2, "m"),
        CachedAnswer("k", "text", "stop", 1, 9, "m"),
        CachedAnswer("k", "text", "stop", 1, 2, None),
    ]
    assert len({checksum(a), *(checksum(v) for v in variants)}) == 7


def test_cache_url_errors_name_the_variable_and_hide_the_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert redact("postgresql://u:s3cret@h:5/db") == "postgresql://u:***@h:5/db"
    # issue 44, point 9: a password in the query (libpq's `?password=`) or a fragment is masked
    shown = redact("postgresql://u@h:5/db?sslmode=require&password=s3cret#s3cret-too")
    assert shown == "postgresql://u@h:5/db?sslmode=require&password=***#***"
    monkeypatch.setenv(CACHE_URL_ENV, "mysql://u:s3cret@h/db")
    with pytest.raises(LfbenchError, match=CACHE_URL_ENV) as e:
        ResponseCache(tmp_path / "x.sqlite")
    assert "s3cret" not in str(e.value)
    monkeypatch.setenv(CACHE_URL_ENV, "postgresql://u:s3cret@127.0.0.1:1/db")
    with pytest.raises(LfbenchError, match="cannot connect") as e:
        ResponseCache(tmp_path / "x.sqlite")
    assert "s3cret" not in str(e.value)


# ---------------------------------------------------------------- claims between workers

_WORKER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pipeline.llm.client import ChatRequest, EndpointConfig, run_chat_sync
    base_url, prefix, first, last, journal, out = sys.argv[1:7]
    ep = EndpointConfig(base_url=base_url, model="unit-model", api_key_env=None,
                        max_concurrency=4, timeout_s=5.0)
    rs = [ChatRequest(key=f"item-{i}",
                      messages=[{"role": "user", "content": f"{prefix} question {i} [fixed]"}],
                      prompt_sha="p1") for i in range(int(first), int(last))]
    results, rep = run_chat_sync(ep, rs, cache_path=None, journal_path=Path(journal),
                                 label="worker", progress=False)
    Path(out).write_text(json.dumps({"results": [r.model_dump() for r in results],
                                     "report": rep.model_dump()}))
    """
)


def _worker(
    srv: TestServer, url: str, prefix: str, span: tuple[int, int], tmp: Path, name: str, **env: str
) -> subprocess.Popen[bytes]:
    import os

    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            _WORKER,
            srv.base_url,
            prefix,
            str(span[0]),
            str(span[1]),
            str(tmp / f"{name}.journal.jsonl"),
            str(tmp / f"{name}.json"),
        ],
        cwd=ROOT,
        env={**os.environ, CACHE_URL_ENV: url, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _out(tmp: Path, name: str) -> tuple[list[ChatResult], UsageReport]:
    raw = json.loads((tmp / f"{name}.json").read_text())
    return [ChatResult(**r) for r in raw["results"]], UsageReport(**raw["report"])


def test_two_workers_overlapping_send_each_request_once(
    server: TestServer, cache_url: str, tmp_path: Path
) -> None:
    """Workers A (items 0-29) and B (items 10-39) at the same moment, one shared cache: the 20
    shared requests are sent once between them, and each gets all its answers."""
    prefix = uuid.uuid4().hex[:10]
    a = _worker(server, cache_url, prefix, (0, 30), tmp_path, "a")
    b = _worker(server, cache_url, prefix, (10, 40), tmp_path, "b")
    assert a.wait(timeout=120) == 0 and b.wait(timeout=120) == 0
    served = _served(server, prefix)
    assert len(served) == 40 and set(served.values()) == {1}  # none twice
    ra, rep_a = _out(tmp_path, "a")
    rb, rep_b = _out(tmp_path, "b")
    assert all(r.status == "ok" and r.text == ANSWER for r in ra + rb)
    assert rep_a.requests_sent + rep_b.requests_sent == 40
    # what one sent, the other took from the cache (found there, or waited for)
    assert rep_a.cache_hits + rep_b.cache_hits == 20
    print(
        f"A sent {rep_a.requests_sent}, waited {rep_a.waited}; "
        f"B sent {rep_b.requests_sent}, waited {rep_b.waited}"
    )


def test_a_killed_worker_holding_claims_does_not_block_the_other(
    cache_url: str, tmp_path: Path
) -> None:
    """A claims and sends (4 at a time, 1 s each); it is killed mid-way while it holds claims.
    B, needing the same 24 requests, waits on A's claims, sends what nobody holds, takes A's
    claims over when their leases run out, and finishes. A's re-run sends nothing."""
    script = [{"match": "[fixed]", "reply": ANSWER}]
    srv = TestServer(script=script, latency_ms=1000, log_path=tmp_path / "slow.log", cwd=ROOT)
    with srv as server:
        _killed_worker(server, cache_url, tmp_path)


def _killed_worker(server: TestServer, cache_url: str, tmp_path: Path) -> None:
    prefix = uuid.uuid4().hex[:10]
    lease = {"LFBENCH_CACHE_LEASE_S": "3"}
    a = _worker(server, cache_url, prefix, (0, 24), tmp_path, "a", **lease)
    deadline = time.monotonic() + 60
    while sum(_served(server, prefix).values()) < 4:  # A's first wave is answered
        assert a.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    b = _worker(server, cache_url, prefix, (0, 24), tmp_path, "b", **lease)
    time.sleep(2.5)  # B is up, waiting on A's claims
    assert a.poll() is None, "A finished before it could be killed"
    a.send_signal(signal.SIGKILL)
    a.wait()
    assert b.wait(timeout=120) == 0
    rb, rep_b = _out(tmp_path, "b")
    assert all(r.status == "ok" for r in rb)
    served = _served(server, prefix)
    assert len(served) == 24
    # a request can be served twice only if A was killed after the server answered it and
    # before A stored the answer: at most A's concurrency of them
    twice = [k for k, n in served.items() if n > 1]
    assert len(twice) <= 4, twice
    # and nothing A had received (its journal) was sent by B
    got_a = {
        json.loads(ln)["cache_key"]
        for ln in (tmp_path / "a.journal.jsonl").read_text().splitlines()
        if ln.strip().endswith("}")
    }
    assert len(got_a) >= 4
    assert not got_a & {r.cache_key for r in rb if r.source == "api"}
    before = sum(served.values())
    a2 = _worker(server, cache_url, prefix, (0, 24), tmp_path, "a2", **lease)
    assert a2.wait(timeout=60) == 0
    _, rep_a2 = _out(tmp_path, "a2")
    assert rep_a2.requests_sent == 0 and sum(_served(server, prefix).values()) == before
    print(f"B sent {rep_b.requests_sent}, waited {rep_b.waited}; served twice: {len(twice)}")
    assert rep_b.requests_sent > 0 and rep_b.waited > 0  # B both waited and took over


def test_postgres_stopped_mid_run_ends_the_stage_and_a_rerun_resends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 point 10: the shared PostgreSQL cache stopped mid-run ends the run with a failed
    stage's error (exit 3), naming the cache without its password and saying the journal keeps
    the finished answers; after a restart, the re-run sends no finished request again."""
    import tempfile

    from pipeline.core.errors import StageFailed
    from pipeline.env.team import Postgres, free_ports
    from pipeline.llm.cache import CacheUnavailable

    root = Path(tempfile.mkdtemp(prefix="lfbench-pg-stop-"))
    root.chmod(0o755)  # the server runs as `postgres` when the tests run as root
    secret = "pw-" + uuid.uuid4().hex[:10]
    pg = Postgres(root / "data", free_ports(1)[0], password=secret).start()
    try:
        db = pg.create_database("stop" + uuid.uuid4().hex[:8])
        url = db.replace("lfbench@", f"lfbench:{secret}@")
        monkeypatch.setenv(CACHE_URL_ENV, url)
        prefix = uuid.uuid4().hex[:10]
        rs = _reqs(40, prefix)
        journal = tmp_path / "j.jsonl"
        with TestServer(
            script=[{"match": "[fixed]", "reply": ANSWER}],
            latency_ms=200,
            log_path=tmp_path / "s.log",
            cwd=ROOT,
        ) as srv:
            errors: list[BaseException] = []

            def first_run() -> None:
                try:
                    _run(srv, rs, journal_path=journal)
                except BaseException as e:  # noqa: BLE001 (checked below)
                    errors.append(e)

            import threading

            t = threading.Thread(target=first_run)
            t.start()
            deadline = time.monotonic() + 30
            while sum(r["served"] for r in srv.log()) < 8:
                assert t.is_alive() and time.monotonic() < deadline
                time.sleep(0.02)
            pg.stop()
            t.join(60)
            assert not t.is_alive()
            assert len(errors) == 1 and isinstance(errors[0], CacheUnavailable)
            assert isinstance(errors[0], StageFailed)  # the CLI exits 3, no traceback
            message = str(errors[0])
            assert redact(url) in message and secret not in message
            assert "journal" in message and "re-run" in message
            first = _served(srv, prefix)
            assert 8 <= sum(first.values()) < 40 and max(first.values()) == 1
            journaled = len(journal.read_text().splitlines())
            assert journaled == sum(first.values())  # every answer received is journalled

            pg.start()
            results, rep = _run(srv, rs, journal_path=journal)
            served = _served(srv, prefix)
        assert all(r.status == "ok" and r.text == ANSWER for r in results)
        assert rep.journal_hits == journaled and rep.requests_sent == 40 - journaled
        assert len(served) == 40 and max(served.values()) == 1  # nothing sent twice
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
