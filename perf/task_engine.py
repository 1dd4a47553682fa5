"""Dask distributed against Ray as the engine under `lfbench repro --jobs` (issue 33).

What the driver needs from an engine: start on one machine in a moment, run a few dozen tasks
(each a stage's process, seconds to hours) as soon as their dependencies are done, N at once,
with per-task resources (cores), and reach the same API on a cluster. Measured for each engine
importable by the Python that runs this script, in a fresh process each time:

- import: `import distributed` / `import ray`, seconds;
- start: a local cluster (`LocalCluster(processes=False)` / `ray.init()`), seconds;
- dispatch: 200 no-op tasks in a chain (each waits for the one before), ms per task;
- fan-out: 8 tasks each running `sleep 1` as a subprocess, 8 at once: wall seconds;
- memory: resident memory of this process and the engine's processes after start (MB);
- shutdown, seconds; and the installed size of the engine's packages.

The project's venv has only Dask; to measure both, make a scratch venv:

    uv venv /tmp/engines && uv pip install --python /tmp/engines/bin/python distributed ray
    /tmp/engines/bin/python perf/task_engine.py            # --json for a script
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, subprocess, sys, time
engine = sys.argv[1]
out = {}
t = time.perf_counter()
if engine == "dask":
    import distributed
else:
    import ray
out["import_s"] = time.perf_counter() - t

def rss_mb(pids):
    import psutil
    total = 0
    for p in pids:
        try:
            total += psutil.Process(p).memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20

def sleeper(_=None):
    subprocess.run(["sleep", "1"], check=True)
    return 1

def noop(x=None):
    return 0

import psutil
before = {p.pid for p in psutil.process_iter()}
t = time.perf_counter()
if engine == "dask":
    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=1, threads_per_worker=8, processes=False,
                           dashboard_address=None, resources={"cores": 2})
    client = Client(cluster)
    client.submit(noop, pure=False).result()
else:
    ray.init(num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rnoop = ray.remote(noop)
    ray.get(rnoop.remote())
out["start_s"] = time.perf_counter() - t
engine_pids = [p.pid for p in psutil.process_iter() if p.pid not in before]
out["processes_started"] = len(engine_pids)
out["rss_mb"] = rss_mb([os.getpid(), *engine_pids])

t = time.perf_counter()
if engine == "dask":
    f = client.submit(noop, pure=False)
    for _ in range(199):
        f = client.submit(noop, f, pure=False)
    f.result()
else:
    r = rnoop.remote()
    for _ in range(199):
        r = rnoop.remote(r)
    ray.get(r)
out["dispatch_ms_per_task"] = (time.perf_counter() - t) / 200 * 1000

t = time.perf_counter()
if engine == "dask":
    client.gather([client.submit(sleeper, i, pure=False) for i in range(8)])
else:
    rs = ray.remote(num_cpus=1)(sleeper)
    ray.get([rs.remote(i) for i in range(8)])
out["fanout_8x1s_wall_s"] = time.perf_counter() - t

t = time.perf_counter()
if engine == "dask":
    client.close(); cluster.close()
else:
    ray.shutdown()
out["shutdown_s"] = time.perf_counter() - t
print(json.dumps(out))
"""

PACKAGES = {
    "dask": ["distributed", "dask", "tornado", "zict", "tblib", "sortedcontainers", "toolz"],
    "ray": ["ray"],
}


def installed_mb(names: list[str]) -> float:
    total = 0
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for p in Path(folder).rglob("*"):
                if p.is_file():
                    total += p.stat().st_size
    return total / 2**20


def measure(engine: str, repeats: int) -> dict[str, object]:
    runs = []
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, engine],
            capture_output=True,
            text=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
            timeout=600,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{engine}: {proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    keys = runs[0].keys()
    median = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in keys}
    return {
        "engine": engine,
        "repeats": repeats,
        **median,
        "installed_mb": installed_mb(PACKAGES[engine]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    engines = [
        e for e, mod in (("dask", "distributed"), ("ray", "ray")) if importlib.util.find_spec(mod)
    ]
    rows = [measure(e, args.repeats) for e in engines]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    cols = [
        "import_s",
        "start_s",
        "dispatch_ms_per_task",
        "fanout_8x1s_wall_s",
        "processes_started",
        "rss_mb",
        "shutdown_s",
        "installed_mb",
    ]
    print(f"median of {args.repeats} fresh processes each")
    print(f"{'':24}" + "".join(f"{r['engine']:>12}" for r in rows))
    for c in cols:
        print(f"{c:24}" + "".join(f"{float(r[c]):12.2f}" for r in rows))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
