"""`lfbench bench llm`: the client's throughput against the local test server.

Starts the test server (a subprocess, so that server and client use different cores) with a fixed
latency, sends N distinct requests through :func:`pipeline.llm.client.run_chat` with a response
cache and a journal in a temporary directory, then sends the same requests again (all from the
cache). The ideal rate is concurrency / latency; ``ratio`` is achieved / ideal.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.llm.client import ChatRequest, EndpointConfig, run_chat


def bench_requests(n: int) -> list[ChatRequest]:
    return [
        ChatRequest(
            key=f"bench-{i}",
            messages=[
                {"role": "system", "content": "You are a benchmark."},
                {"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"},
            ],
            prompt_sha="bench",
        )
        for i in range(n)
    ]


def _warm_imports() -> None:
    """Import the HTTP stack before the clock starts (a one-off, not throughput)."""
    import aiohttp  # noqa: F401
    import httpx2  # noqa: F401
    import openai  # noqa: F401


def run_llm_bench(requests: int, concurrency: int, latency_ms: float) -> dict[str, Any]:
    from pipeline.testing.server import TestServer

    with tempfile.TemporaryDirectory(prefix="lfbench-bench-") as tmp_s:
        tmp = Path(tmp_s)
        with TestServer(latency_ms=latency_ms, log_path=tmp / "server.log") as srv:
            endpoint = EndpointConfig(
                base_url=srv.base_url,
                model="bench-model",
                api_key_env=None,
                max_concurrency=concurrency,
                max_tokens=64,
                timeout_s=30.0,
                max_retries=3,
            )
            reqs = bench_requests(requests)
            _warm_imports()
            cache, journal = tmp / "cache.sqlite", tmp / "journal.jsonl"

            t0 = time.perf_counter()
            results, report = asyncio.run(
                run_chat(
                    endpoint,
                    reqs,
                    cache_path=cache,
                    journal_path=journal,
                    label="bench",
                    progress=False,
                )
            )
            wall = time.perf_counter() - t0
            sent_1 = len(srv.log())
            journal.unlink(missing_ok=True)

            t1 = time.perf_counter()
            results2, report2 = asyncio.run(
                run_chat(
                    endpoint,
                    reqs,
                    cache_path=cache,
                    journal_path=journal,
                    label="bench-cached",
                    progress=False,
                )
            )
            cached_wall = time.perf_counter() - t1
            sent_2 = len(srv.log()) - sent_1
    ideal = concurrency / (latency_ms / 1000.0) if latency_ms > 0 else float("inf")
    achieved = requests / wall if wall > 0 else 0.0
    return {
        "requests": requests,
        "concurrency": concurrency,
        "latency_ms": latency_ms,
        "wall_s": round(wall, 3),
        "achieved_rps": round(achieved, 1),
        "ideal_rps": round(ideal, 1),
        "ratio": round(achieved / ideal, 4) if ideal not in (0.0, float("inf")) else None,
        "requests_sent": sent_1,
        "client_requests_sent": report.requests_sent,
        "ok": report.ok,
        "errors": report.errors,
        "cached_wall_s": round(cached_wall, 3),
        "cached_requests_sent": sent_2,
        "cache_hits": report2.cache_hits,
        "cached_ok": sum(1 for r in results2 if r.status == "ok"),
        "identical_answers": [r.text for r in results] == [r.text for r in results2],
    }


def render(out: dict[str, Any]) -> list[str]:
    """The result as aligned `name  value` lines."""
    rows = [
        ("requests", out["requests"]),
        ("concurrency", out["concurrency"]),
        ("latency", f"{out['latency_ms']:g} ms"),
        ("wall", f"{out['wall_s']:.2f} s"),
        ("achieved", f"{out['achieved_rps']:.1f} req/s"),
        ("ideal", f"{out['ideal_rps']:.1f} req/s"),
        ("ratio", out["ratio"]),
        ("server requests (pass 1)", out["requests_sent"]),
        (
            "cached pass",
            f"{out['cached_wall_s']:.2f} s, {out['cache_hits']} cache hits,"
            f" {out['cached_requests_sent']} server requests",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]
