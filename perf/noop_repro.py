"""Wall time of a no-op `dvc repro` (everything up to date) on a fresh clone.

    python perf/noop_repro.py [--mirror DIR] [--repeat 5] [--json]

Clones the committed project into a temporary folder, fetches the data from the mirror, runs
the default pipeline once, then times `dvc repro` REPEAT more times (nothing to do) and prints
the median and the spread. The goal stated by the pipeline issue is under 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(cmd: list[str], cwd: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mirror",
        default=os.environ.get("LFBENCH_DATA_MIRROR", str(ROOT.parent / "shared" / "data")),
    )
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        sh(["git", "clone", "-q", str(ROOT), str(clone)], Path(tmp))
        sh(["lfbench", "data", "fetch", "--mirror", args.mirror], clone)
        start = time.monotonic()
        sh(["dvc", "repro"], clone)
        first = time.monotonic() - start
        times = []
        for _ in range(args.repeat):
            start = time.monotonic()
            sh(["dvc", "repro"], clone)
            times.append(time.monotonic() - start)
    result = {
        "first_repro_s": round(first, 2),
        "noop_repro_median_s": round(statistics.median(times), 3),
        "noop_repro_min_s": round(min(times), 3),
        "noop_repro_max_s": round(max(times), 3),
        "repeat": args.repeat,
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
