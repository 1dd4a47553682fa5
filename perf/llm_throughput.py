"""Throughput of the LLM client against the local OpenAI-compatible test server.

    python perf/llm_throughput.py [--requests 2000] [--concurrency 64] [--latency-ms 100]

Runs `lfbench bench llm` with the acceptance settings and prints its JSON: 2000 distinct requests,
64 at a time, 100 ms server latency, so the ideal rate is 640 requests/s. Acceptance: ratio
(achieved / ideal) >= 0.9 and cached_requests_sent == 0 (the second pass is served by the cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.authoring.llm_bench import run_llm_bench  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=100.0)
    args = p.parse_args()
    out = run_llm_bench(args.requests, args.concurrency, args.latency_ms)
    print(json.dumps(out))
    ok = (out["ratio"] or 0) >= 0.9 and out["cached_requests_sent"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
