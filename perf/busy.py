"""How busy the machine's CPUs are while a command runs, minute by minute.

    python perf/busy.py [--every 5] [--json] -- COMMAND [ARG...]

e.g. `python perf/busy.py -- .ci/run` in a fresh clone. Reads the busy time of all CPUs
(/proc/stat: user, nice, system, irq, softirq, steal; `perf/test_cpu.py` reads it here) every
`--every` seconds while COMMAND runs and prints, for each minute of its run, the share of the
machine's CPU time that was busy, then the busy CPU-seconds of the whole run. Whatever else runs
on the machine is counted too (the point: whether the cores are the limit, not whose work it
is; `perf/test_cpu.py` gives each test's own CPU). A run whose cores stay near 100% cannot be
made shorter by more pytest-xdist workers or another file order, only by less CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def busy_seconds() -> float:
    """Busy CPU seconds of the machine since boot (stdlib only: this script wraps `.ci/run`,
    which makes the venv; `perf/test_cpu.py` reads it from here)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=5.0, help="seconds between readings")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given (after --)")
    ncpu = len(os.sched_getaffinity(0))
    start, first = time.monotonic(), busy_seconds()
    readings: list[tuple[float, float]] = [(0.0, first)]
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        time.sleep(args.every)
        readings.append((time.monotonic() - start, busy_seconds()))
    wall = time.monotonic() - start
    readings.append((wall, busy_seconds()))

    minutes: dict[int, float] = {}
    for (t0, b0), (_, b1) in itertools.pairwise(readings):
        minutes[int(t0 // 60)] = minutes.get(int(t0 // 60), 0.0) + (b1 - b0)
    share = {
        m: round(100 * cpu / (ncpu * min(60.0, wall - 60 * m)), 1)
        for m, cpu in sorted(minutes.items())
        if wall - 60 * m > 1
    }
    total = readings[-1][1] - first
    result = {
        "command": cmd,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "cpus": ncpu,
        "busy_cpu_s": round(total, 1),
        "busy_share": round(total / (ncpu * wall), 3),
        "busy_percent_by_minute": share,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(" ".join(f"{m}:{p:.0f}%" for m, p in share.items()))
        print(
            f"{wall:.0f} s, {total:.0f} busy CPU-s of {ncpu} CPUs "
            f"({100 * result['busy_share']:.0f}%), exit {proc.returncode}"
        )
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
