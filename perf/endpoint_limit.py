"""One `max_concurrency` per endpoint across stages (issue 42, point 3): what the server sees.

    python perf/endpoint_limit.py [--stages 2] [--requests 20] [--concurrency 2] [--latency-ms 500]

Starts the test server and, as `lfbench repro` runs stages side by side, `--stages` processes at
once, each sending `--requests` distinct requests to the one endpoint with `max_concurrency:
--concurrency` through the model client (`run_chat_sync`, the stages' own path):

- without the shared limit (no `LFBENCH_SCHEDULER`: plain `dvc repro`, or lfbench before);
- with it: a Dask scheduler on 127.0.0.1 (a LocalCluster, as the driver's), each process told
  its address, so they share one Dask `Semaphore` for the endpoint.

Prints, for each, the most requests the server handled at once (its log), the server's busy
span (first arrival to last, plus one latency) against the ideal (every request at
`--concurrency` at once), the wall time of the processes' sending (`report.wall_s`, the slowest:
it includes the client's start), and the cost of a lease (acquire and release) and of a shared
per-minute schedule's slot, timed over `--leases` rounds from one client on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.testing.server import TestServer  # noqa: E402

STAGE = """
import json, sys
from pipeline.core.types import ChatRequest, EndpointConfig
from pipeline.llm.client import run_chat_sync
name, n, c, url = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ep = EndpointConfig(base_url=url, model="m", api_key_env=None, max_concurrency=c, timeout_s=120)
reqs = [ChatRequest(key=f"{name}-{i}", messages=[{"role": "user", "content": f"{name} {i}"}],
                    prompt_sha=f"{name}-{i}") for i in range(n)]
results, report = run_chat_sync(ep, reqs, cache_path=None, journal_path=None, label=name,
                                progress=False)
assert all(r.status == "ok" for r in results)
print(json.dumps({"wall_s": report.wall_s}))
"""


def _stages(
    args: argparse.Namespace, server: TestServer, scheduler: str | None
) -> dict[str, float]:
    since = len(server.log())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LFBENCH_SCHEDULER", None)
    if scheduler:
        env["LFBENCH_SCHEDULER"] = scheduler
    tag = "shared" if scheduler else "alone"
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                STAGE,
                f"{tag}{i}",
                str(args.requests),
                str(args.concurrency),
                server.base_url,
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(args.stages)
    ]
    walls = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        walls.append(json.loads(out.strip().splitlines()[-1])["wall_s"])
    arrivals = [r["time"] for r in server.log()[since:]]
    return {
        "max_in_flight": server.max_in_flight(since),
        # the server busy: its first request's arrival to its last one's (plus one latency)
        "server_span_s": round(max(arrivals) - min(arrivals) + args.latency_ms / 1000, 2),
        "sending_wall_s": max(walls),
        "processes_wall_s": round(time.monotonic() - t0, 2),
        "ideal_s": round(
            args.stages * args.requests / args.concurrency * args.latency_ms / 1000
            if scheduler
            else args.requests / args.concurrency * args.latency_ms / 1000,
            2,
        ),
    }


async def _lease_cost(address: str, rounds: int) -> dict[str, float]:
    from pipeline.llm.shared_limit import open_slots

    os.environ["LFBENCH_SCHEDULER"] = address
    slots = await open_slots("http://127.0.0.1:1/v1", "lease-probe", 4, "perf")
    assert slots is not None
    acquire: list[float] = []
    for _ in range(rounds):
        t = time.perf_counter()
        await slots.semaphore.acquire()
        acquire.append(time.perf_counter() - t)
        await slots.semaphore.release()
    held: list[float] = []
    for _ in range(rounds):  # what a request pays: acquire, then a release not waited for
        t = time.perf_counter()
        async with slots.hold():
            pass
        held.append(time.perf_counter() - t)
    rates = slots.shared_rates(1e9, None)  # a shared schedule never waiting: its own cost
    assert rates is not None
    scheduled: list[float] = []
    for _ in range(rounds):
        t = time.perf_counter()
        await rates.acquire(0)
        scheduled.append(time.perf_counter() - t)
    await slots.aclose()
    return {
        "rate_acquire_ms_median": round(statistics.median(scheduled) * 1000, 2),
        "acquire_ms_median": round(statistics.median(acquire) * 1000, 2),
        "acquire_ms_p95": round(sorted(acquire)[int(0.95 * rounds) - 1] * 1000, 2),
        "per_request_ms_median": round(statistics.median(held) * 1000, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=500.0)
    p.add_argument("--leases", type=int, default=200)
    args = p.parse_args()
    from distributed import LocalCluster

    from pipeline.runner.driver import local_cluster_options

    with tempfile.TemporaryDirectory() as tmp, TestServer(
        latency_ms=args.latency_ms, log_path=Path(tmp) / "server.log", cwd=ROOT
    ) as server, LocalCluster(**local_cluster_options(2)) as cluster:  # fmt: skip
        logging.getLogger("distributed").setLevel(logging.ERROR)
        alone = _stages(args, server, None)
        shared = _stages(args, server, cluster.scheduler_address)
        lease = asyncio.run(_lease_cost(cluster.scheduler_address, args.leases))
    out = {
        "stages": args.stages,
        "requests_each": args.requests,
        "max_concurrency": args.concurrency,
        "latency_ms": args.latency_ms,
        "without_shared_limit": alone,
        "with_shared_limit": shared,
        "lease": lease,
    }
    print(json.dumps(out, indent=1))
    sys.exit(0 if shared["max_in_flight"] <= args.concurrency else 1)


if __name__ == "__main__":
    main()
