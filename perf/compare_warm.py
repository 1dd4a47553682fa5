"""CPU of one `lfbench compare` with the warm sync server and without it (LFBENCH_WARM_SYNC=0).

    python perf/compare_warm.py [--runs 3] -- COMPARE ARGS ...    (in a project with results)

e.g. after `make repro`: `python perf/compare_warm.py -- --benchmark summhay lead extractive
--setting oracle --judge local --domain news --collection released`. Each way runs the command
`--runs` times (the first warm run starts the server if none runs, and is left out); prints,
per way, the median CPU of the command's process and, warm, of the server's children (read
from the server's /proc entry: its reaped children's time), and whether the outputs are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf import warm_sync as warm_sync_perf


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _server_children_cpu() -> float:
    """Reaped children's CPU of every warm sync server of this user (0 when none)."""
    return warm_sync_perf._server_children_cpu(Path(os.environ.get("TMPDIR", "/tmp")))


def _one(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    c0, s0 = _children_cpu(), _server_children_cpu()
    out = subprocess.run(["lfbench", "compare", *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    time.sleep(0.5)  # the server reaps its child
    return _children_cpu() - c0, _server_children_cpu() - s0, out.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("compare_args", nargs="+")
    a = p.parse_args()
    result = {}
    outputs = {}
    for way, extra in (("warm", {}), ("off", {"LFBENCH_WARM_SYNC": "0"})):
        env = {**os.environ, **extra}
        if way == "warm":
            _one(a.compare_args, env)  # starts a server if none runs
            time.sleep(5)
        rows = [_one(a.compare_args, env) for _ in range(a.runs)]
        outputs[way] = {r[2] for r in rows}
        result[way] = {
            "command_cpu_s": round(statistics.median(r[0] for r in rows), 2),
            "server_child_cpu_s": round(statistics.median(r[1] for r in rows), 2),
        }
    result["same_output"] = len(outputs["warm"] | outputs["off"]) == 1
    print(json.dumps(result))


if __name__ == "__main__":
    main()
