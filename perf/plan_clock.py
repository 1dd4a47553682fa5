"""`lfbench plan --jobs N`'s clock against a measured `lfbench repro --jobs N` (issue 42, point 4).

    python perf/plan_clock.py [--latencies 2,4,6,8] [--concurrency 2] [--questions 12]
        [--jobs 4] [--keep] [--json]

A scratch project (this checkout's tracked files, a fresh git repository, data from the mirror)
is sliced to Long²RAG's derived questions (`--questions`: 3 subtopics of each of the first
haystacks), answered by the lead baseline and judged by the local judge and the overlap judge;
`lfbench repro --jobs N long2rag-aggregate` makes it once, which records the CPU stages' times
(the timeline in .lfbench/logs/). Then four models are added, each behind its own test server
that takes a fixed time per answer (`--latencies`, seconds), each running only `rag_512` (a
model's own settings) with `--concurrency` requests in flight. Then, in that order:

- `lfbench plan --jobs N --probe`: three real requests per model measure its rate (cached, so
  the run reuses them), and the plan's wall time from those rates;
- `lfbench plan --jobs N --rate m1=S ...`: the rates given (the servers' latencies);
- `lfbench repro --jobs N long2rag-aggregate`, timed.

Prints both predictions against the measured wall time (the goal: within 25%), and the
per-model times the plan gave.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.parallel_models import BIN, sh  # noqa: E402
from pipeline.testing.server import TestServer  # noqa: E402
from tests.conftest import make_project  # noqa: E402

TARGET = "long2rag-aggregate"
RESPONDER = "perf.parallel_responder:respond"


def base_params(proj: Path, questions: int) -> None:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    params["runtime"] = "local"
    l2r = params["long2rag"]
    n_hay = max(1, -(-questions // 3))
    l2r["derived"].update(haystacks=[f"news{i + 1}" for i in range(n_hay)], subtopics=3)
    l2r["models"] = ["lead"]
    local = params["judges"]["local"]
    local["train"]["haystacks"] = ["news1"]
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def add_models(proj: Path, urls: list[str], args: argparse.Namespace) -> list[str]:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    names = []
    for i, url in enumerate(urls):
        name = f"m{i + 1}"
        names.append(name)
        params["models"][name] = {
            "provider": "openai",
            "base_url": url,
            "model": name,
            "api_key_env": None,
            "settings": {"long2rag": ["rag_512"]},
            "max_concurrency": args.concurrency,
            "timeout_s": 120,
            "slice": {"long2rag": {"first": args.questions}},
        }
        params["long2rag"]["models"].append(name)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return names


def plan_json(proj: Path, env: dict[str, str], extra: list[str], jobs: int) -> dict[str, Any]:
    out = sh(["lfbench", "plan", "--jobs", str(jobs), "--json", *extra, TARGET], proj, env)
    doc: dict[str, Any] = json.loads(out[out.index("{") : out.rindex("}") + 1])
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latencies", default="2,4,6,8", help="seconds per answer, one per model")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    latencies = [float(x) for x in args.latencies.split(",")]
    mirror = Path(os.environ.get("LFBENCH_DATA_MIRROR", ROOT.parent / "shared" / "data"))
    work = Path(tempfile.mkdtemp(prefix="lfbench-clock-"))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "LFBENCH_EMBEDDING_CACHE": str(work / "embeddings.sqlite"),
    }
    for k in ("MLFLOW_TRACKING_URI", "LFBENCH_CACHE_URL", "PYTHONDONTWRITEBYTECODE"):
        env.pop(k, None)
    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "latencies_s": latencies}
    try:
        proj = work / "proj"
        make_project(proj, mirror)
        base_params(proj, args.questions)
        t0 = time.monotonic()
        sh(["lfbench", "repro", "--jobs", str(args.jobs), TARGET], proj, env)
        out["base_s"] = round(time.monotonic() - t0, 1)
        with ExitStack() as stack:
            servers = [
                stack.enter_context(
                    TestServer(
                        responder=RESPONDER,
                        latency_ms=1000 * lat,
                        log_path=work / f"server{i}.log",
                        cwd=ROOT,
                    )
                )
                for i, lat in enumerate(latencies)
            ]
            names = add_models(proj, [s.base_url for s in servers], args)
            probe = plan_json(proj, env, ["--probe"], args.jobs)
            rates = [
                x for n, lat in zip(names, latencies, strict=True) for x in ("--rate", f"{n}={lat}")
            ]
            given = plan_json(proj, env, rates, args.jobs)
            t0 = time.monotonic()
            sh(["lfbench", "repro", "--jobs", str(args.jobs), TARGET], proj, env)
            measured = round(time.monotonic() - t0, 1)
            served = sum(len([r for r in s.log() if r.get("served")]) for s in servers)
        out.update(
            measured_s=measured,
            served=served,
            probe={
                "predicted_s": probe["clock"]["wall_s"],
                "rates": probe.get("probe"),
                "models": probe["clock"]["models"],
            },
            rate={"predicted_s": given["clock"]["wall_s"], "models": given["clock"]["models"]},
            requests_planned=given["totals"]["requests"],
            stages=given["clock"]["stages"],
            unknown=given["clock"]["unknown"],
        )
        for k in ("probe", "rate"):
            out[k]["error"] = round(out[k]["predicted_s"] / measured - 1, 3)
    finally:
        out["loadavg_after"] = os.getloadavg()
        if args.keep:
            out["scratch"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    print(
        f"4 models at {args.latencies} s per answer, {args.concurrency} in flight, "
        f"{args.questions} Long2RAG questions each (rag_512 only), --jobs {args.jobs}; "
        f"base pipeline {out.get('base_s')} s"
    )
    for k, label in (("rate", "--rate (given)"), ("probe", "--probe (measured)")):
        r = out[k]
        print(
            f"  {label:20} predicted {r['predicted_s']:7.1f} s  measured {out['measured_s']:7.1f}"
            f" s  error {100 * r['error']:+.0f}%"
        )
        for m, v in r["models"].items():
            print(f"      {m}: stages {v['stages_s']:.1f} s, done at {v['done_at_s']:.1f} s")
    print(f"  probe rates: {out['probe']['rates']}")
    print(f"  requests: planned {out['requests_planned']}, served {out['served']} (incl. probe)")
    print(f"  unknown stages: {out['unknown'] or 'none'}")
    for n, v in out["stages"].items():
        print(f"      {n}: {v['s']} s from {v['from']}")
    print(f"  load average before {out['loadavg_before']}, after {out['loadavg_after']}")


if __name__ == "__main__":
    main()
