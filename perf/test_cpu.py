"""Each test's CPU time, its whole process tree included, and how busy the machine was.

    python perf/test_cpu.py [--log F] [-- PYTEST ARGS ...]   run pytest (-n 3 --dist loadfile
                                                              unless ARGS say otherwise), then
                                                              the table
    python perf/test_cpu.py --log F --report-only            the table of an earlier log

`perf/suite_cpu.py` counts the Python processes that exit normally, by command. This counts by
test, and everything a test starts: each pytest-xdist worker moves itself into its own cgroup
(cgroup v1 `cpuacct` or v2; needs root), which every process it starts inherits (`dvc repro`,
the stages, llama.cpp's and the test servers, QEMU, Chromium, PostgreSQL), killed or not, and
the worker's CPU counter is read before and after each test (setup and teardown included).
Not counted: what Docker's daemon and its containers spend (they are the daemon's children).
The last line compares the machine's busy CPU time (/proc/stat) with its cores x wall time:
near 100% means the suite is CPU-bound and only less CPU makes it faster.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from busy import busy_seconds  # perf/, this script's folder (and the plugin's PYTHONPATH)

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
_GROUP: dict[str, Path] = {}


def _usage_s() -> float:
    group = _GROUP.get("dir")
    if group is None:
        return 0.0
    if (group / "cpuacct.usage").exists():
        return int((group / "cpuacct.usage").read_text()) / 1e9
    for line in (group / "cpu.stat").read_text().splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) / 1e6
    return 0.0


# ---------------------------------------------------------------- the pytest plugin (-p test_cpu)


def pytest_configure(config: Any) -> None:
    if not os.environ.get("LFBENCH_TEST_CPU_LOG"):
        return
    root = V1 if V1.is_dir() else V2
    worker = os.environ.get("PYTEST_XDIST_WORKER", "master")
    group = root / f"lfbench-test-cpu-{os.getpid()}-{worker}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    _GROUP["dir"] = group


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    cpu0, t0 = _usage_s(), time.time()
    yield
    if "dir" not in _GROUP:
        return
    row = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "master"),
        "start": t0,
        "wall": time.time() - t0,
        "cpu": _usage_s() - cpu0,
    }
    with Path(os.environ["LFBENCH_TEST_CPU_LOG"]).open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------- the script


def report(log: Path, top: int) -> None:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += r["cpu"]
        f[1] += r["wall"]
        f[2] += 1
    total = sum(r["cpu"] for r in rows)
    print(f"{total:.0f} CPU-s in {len(rows)} tests (the workers' process trees)")
    print("   CPU-s   wall-s  share  tests  file")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {wall:8.1f} {cpu / total:6.1%} {int(n):6d}  {name}")
    print("   CPU-s   wall-s  test")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:8.1f} {r['wall']:8.1f}  {r['test']}")
    machine = log.with_suffix(".machine.json")
    if machine.exists():
        m = json.loads(machine.read_text())
        cores = m["cores"]
        print(
            f"machine: {m['busy']:.0f} CPU-s busy of {cores} cores x {m['wall']:.0f} s"
            f" = {m['busy'] / (cores * m['wall']):.0%}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", type=Path, default=None)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("pytest_args", nargs="*")
    args = p.parse_args()
    if args.report_only:
        if args.log is None:
            p.error("--report-only needs --log")
        report(args.log, args.top)
        return
    if os.geteuid() != 0:
        sys.exit("perf/test_cpu.py moves pytest's workers into cgroups: run it as root")
    log = args.log or Path(tempfile.mkdtemp()) / "test-cpu.jsonl"
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "LFBENCH_TEST_CPU_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    extra = args.pytest_args or ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
    busy0 = busy_seconds()
    t0 = time.time()
    rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "test_cpu", *extra], env=env)
    busy1 = busy_seconds()
    log.with_suffix(".machine.json").write_text(
        json.dumps({"busy": busy1 - busy0, "wall": time.time() - t0, "cores": os.cpu_count()})
    )
    root = V1 if V1.is_dir() else V2
    for group in root.glob("lfbench-test-cpu-*"):
        if not (group / "cgroup.procs").read_text().strip():
            group.rmdir()  # empty once its worker and the worker's processes are gone
    report(log, args.top)
    print(f"log: {log}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
