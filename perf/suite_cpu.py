"""Where the test suite's CPU goes, by command: every Python process it starts, its CPU time.

    python perf/suite_cpu.py [--log F] [-- PYTEST ARGS ...]   run pytest, then the table
    python perf/suite_cpu.py --log F --report-only             the table of an earlier log

The tests start thousands of processes (`dvc repro`, each stage's `lfbench run ...`, servers),
so pytest's own --durations (wall time, shared between two workers) does not say what to make
cheaper. This puts a `sitecustomize` on PYTHONPATH whose exit hook appends each Python process's
argv, own CPU time and its reaped children's to a JSON-lines log, then sums own CPU by command
(`dvc repro`, `lfbench run results`, ...). Not counted: processes that are not Python (git,
Docker's containers, PostgreSQL, Chromium) and those killed by a signal before their exit hook.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = """
import atexit, json, os, resource, sys, time
_t0 = time.time()
def _lfbench_cpu_log():
    try:
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(os.environ["LFBENCH_CPU_LOG"], "a") as f:
            f.write(json.dumps({"argv": sys.argv[:6], "cpu": s.ru_utime + s.ru_stime,
                                "children": c.ru_utime + c.ru_stime,
                                "wall": time.time() - _t0}) + "\\n")
    except Exception:
        pass
if os.environ.get("LFBENCH_CPU_LOG"):
    atexit.register(_lfbench_cpu_log)
"""


def command(argv: list[str]) -> str:
    words = [a.rsplit("/", 1)[-1] for a in argv]
    if not words:
        return "?"
    if words[0] == "lfbench" and words[1:2] == ["run"]:
        return " ".join(words[:3])
    return " ".join(words[:2])


def report(log: Path, top: int) -> None:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    by: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        if "pytest" in r["argv"][0]:
            continue
        k = command(r["argv"])
        by[k][0] += 1
        by[k][1] += r["cpu"]
    total = sum(v[1] for v in by.values())
    print(f"{total:.0f} CPU-s in {sum(int(v[0]) for v in by.values())} Python processes")
    print(f"{'CPU-s':>8} {'share':>6} {'n':>5} {'each':>6}  command")
    for k, (n, cpu) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{cpu:8.1f} {cpu / total:6.1%} {int(n):5d} {cpu / n:6.2f}  {k}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=Path("suite-cpu.jsonl"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    if not args.report_only:
        args.log.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as hook:
            (Path(hook) / "sitecustomize.py").write_text(HOOK)
            path = os.pathsep.join(p for p in (hook, os.environ.get("PYTHONPATH")) if p)
            env = {**os.environ, "PYTHONPATH": path, "LFBENCH_CPU_LOG": str(args.log.resolve())}
            cmd = [sys.executable, "-m", "pytest", "-n", "auto", "--dist", "loadfile"]
            subprocess.run([*cmd, *args.pytest_args], env=env, check=False)
    report(args.log, args.top)


if __name__ == "__main__":
    main()
