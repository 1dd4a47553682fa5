"""Parts of the LLM client without a server: Retry-After, backoff, journal, rate limiter, fault
plan; and the throughput bench's command on a small run."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from pathlib import Path

from click.testing import CliRunner

from pipeline.authoring.commands import bench
from pipeline.llm.client import backoff_delay, parse_retry_after
from pipeline.llm.journal import JournalEntry, JournalWriter, load_journal
from pipeline.llm.ratelimit import RateLimiter
from pipeline.testing.server import FaultPlan


def test_parse_retry_after() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "0.5"}) == 0.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 17 <= (parse_retry_after({"retry-after": date}) or 0) <= 20
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None and parse_retry_after(None) is None


def test_backoff_grows_caps_and_honours_retry_after() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(k, None, rng) for k in range(10)]
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0
    assert max(delays) <= 30.0 and delays[9] >= 15.0
    assert 2.0 <= backoff_delay(0, 2.0, rng) <= 2.1
    assert backoff_delay(0, 500.0, rng) <= 60.1  # capped


def _entry(i: int) -> JournalEntry:
    return JournalEntry(f"ck{i}", f"k{i}", f"text {i}", "stop", 3, 4)


def test_journal_torn_tail_is_ignored_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    w = JournalWriter(path)
    for i in range(3):
        w.append(_entry(i))
    w.close()
    with path.open("a") as f:
        f.write('{"cache_key": "ck9", "key": "k9", "text": "tor')
    assert set(load_journal(path)) == {"ck0", "ck1", "ck2"}
    w = JournalWriter(path)
    w.append(_entry(3))
    w.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and [json.loads(x)["key"] for x in lines] == ["k0", "k1", "k2", "k3"]
    assert load_journal(tmp_path / "missing.jsonl") == {}


def test_rate_limiter_requests_and_tokens() -> None:
    async def go(limiter: RateLimiter, n: int, tokens: int) -> float:
        t0 = time.monotonic()
        for _ in range(n):
            await limiter.acquire(tokens)
        return time.monotonic() - t0

    assert asyncio.run(go(RateLimiter(1200, None), 6, 0)) >= 0.25 - 0.01  # 5 gaps of 50 ms
    # 6000 tokens/min = 100/s: 4 requests of 20 tokens -> 3 gaps of 0.2 s
    assert asyncio.run(go(RateLimiter(None, 6000), 4, 20)) >= 0.6 - 0.01
    limiter = RateLimiter(None, 6000)
    limiter.reconcile(estimated=100, actual=10)  # used less than reserved: schedule moves back
    assert asyncio.run(go(limiter, 1, 10)) < 0.05
    assert not RateLimiter(None, None).active


def test_fault_plan_is_deterministic_and_bounded() -> None:
    def faults(plan: FaultPlan, bodies: list[str]) -> list[tuple[int, str | None]]:
        return [plan.next(b) for b in bodies]

    bodies = [f"body{i % 50}" for i in range(400)]
    a = faults(FaultPlan(0.5, ["429", "500"], 7, 2), bodies)
    b = faults(FaultPlan(0.5, ["429", "500"], 7, 2), bodies)
    assert a == b
    # arrival order does not matter: the n-th attempt of a body gets the same fault
    rev = bodies[::-1]
    c = {
        (x, n): f
        for x, (n, f) in zip(rev, faults(FaultPlan(0.5, ["429", "500"], 7, 2), rev), strict=True)
    }
    assert all(c[(x, n)] == f for x, (n, f) in zip(bodies, a, strict=True))
    per_body: dict[str, int] = {}
    for x, (_, f) in zip(bodies, a, strict=True):
        per_body[x] = per_body.get(x, 0) + (f is not None)
    assert max(per_body.values()) <= 2 and sum(per_body.values()) > 20


def test_bench_llm_command_small() -> None:
    result = CliRunner().invoke(
        bench, ["llm", "--requests", "60", "--concurrency", "8", "--latency-ms", "20", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["requests"] == 60 and out["requests_sent"] == 60
    assert out["cached_requests_sent"] == 0 and out["cache_hits"] == 60
    assert out["ideal_rps"] == 400.0 and 0 < out["ratio"] <= 1.05
    for k in ("wall_s", "achieved_rps", "cached_wall_s", "concurrency", "latency_ms"):
        assert k in out
