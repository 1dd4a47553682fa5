"""A stage's MLflow sync with the warm sync server and without (pipeline/stages/warm_sync.py).

    python perf/warm_sync.py [--repeat 5] [--rows 40] [--save perf/warm_sync.json]

Each measurement is a new interpreter, as a stage is: it imports the stage code
(`pipeline.stages.aggregate`, not timed apart), marks itself a stage's process and syncs `--rows`
result rows into a SQLite store of its own folder, twice per folder: "new" (every row a new
run) and "unchanged" (every row skipped: a stage re-run that changed nothing, the common case
in a `dvc repro` after an edit elsewhere). Timed: the interpreter's wall clock and CPU
(its own and its children's, from the parent), plus, with the server, the CPU of the server's
child that did the sync (the server's reaped children, /proc/PID/stat cutime + cstime).
"here": `LFBENCH_WARM_SYNC=0`; "warm": the server of this code already running.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys
from pathlib import Path
import pipeline.stages.aggregate  # what a results stage imports before it syncs
from pipeline.stages import warm_sync
from pipeline.stages.tracking import RunSpec, sync
warm_sync.enable()
rows = int(sys.argv[2])
specs = [RunSpec(row_key=f"k{i}", name=f"n{i}", metrics={"joint": 0.5 + i}, params={"p": str(i)},
                 tags={"model": "m"}, artifacts={"row.json": {"joint": 0.5 + i}})
         for i in range(rows)]
r = sync("perf", specs, Path(sys.argv[1]), producer="perf")
assert r.created + r.skipped == rows, r
"""


def _server_children_cpu(folder: Path) -> float:
    """CPU seconds of the server's reaped children (0 without a server)."""
    locks = list((folder / f"lfbench-{os.getuid()}").glob("sync-*.lock"))
    total = 0.0
    for lock in locks:
        pid = lock.read_text().strip()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError, ValueError):
            continue
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return total


def _once(ws: Path, rows: int, env: dict[str, str], tmp: Path) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    served0 = _server_children_cpu(tmp)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, str(ws), str(rows)], env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    time.sleep(1.2)  # the server reaps its child within a second
    served = _server_children_cpu(tmp) - served0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "stage_cpu": cpu, "server_cpu": served, "total_cpu": cpu + served}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--save", type=Path)
    args = ap.parse_args()
    out: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        base = {
            **os.environ,
            "TMPDIR": str(tmp),
            "PYTHONPATH": str(ROOT),
            "LFBENCH_WORKSPACE": "perf",
            "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
        }
        base.pop("MLFLOW_TRACKING_URI", None)
        for mode in ("here", "warm"):
            env = {**base, "LFBENCH_WARM_SYNC": "0" if mode == "here" else "1"}
            # bytecode and page cache; for "warm", the first call starts the server
            _once(tmp / f"{mode}-warmup", args.rows, env, tmp)
            if mode == "warm":
                time.sleep(5)
                assert _server_children_cpu(tmp) >= 0 and list(tmp.glob("lfbench-*/*.sock"))
            samples: dict[str, list[dict[str, float]]] = {"new": [], "unchanged": []}
            for i in range(args.repeat):
                ws = tmp / f"{mode}-{i}"
                ws.mkdir()
                samples["new"].append(_once(ws, args.rows, env, tmp))
                samples["unchanged"].append(_once(ws, args.rows, env, tmp))
            out[mode] = {
                case: {k: round(statistics.median(s[k] for s in runs), 3) for k in runs[0]}
                for case, runs in samples.items()
            }
    print(f"{args.rows} rows, median of {args.repeat} (seconds)")
    print(f"{'':10s} {'case':10s} {'wall':>6s} {'stage':>6s} {'server':>7s} {'total':>6s}")
    for mode, cases in out.items():
        for case, m in cases.items():
            print(
                f"{mode:10s} {case:10s} {m['wall']:6.2f} {m['stage_cpu']:6.2f} "
                f"{m['server_cpu']:7.2f} {m['total_cpu']:6.2f}"
            )
    if args.save:
        args.save.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
