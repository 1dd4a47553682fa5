"""The CPU of `lfbench repro`'s driver (its own process: deciding, restoring and saving each
stage through DVC, writing dvc.lock), not of the stages.

    python perf/driver_cpu.py [--code DIR] [--repeat 3] [--mirror DIR] [--json]

Clones this checkout's commit into a temporary folder, fetches the data from the mirror, points
its DVC cache at this checkout's (so the stages the checkout's own `make repro` or `lfbench
repro` ran are restored from the run cache, as in a colleague's workspace) and removes dvc.lock;
then runs `lfbench repro --jobs 2` REPEAT times (dvc.lock removed before each) with the
lfbench code of `--code` (default: this checkout; give a worktree of another commit to compare)
and prints the driver's own CPU seconds each time, from an exit hook in its process. The stages
that cannot be restored run each time (in the warm stage server, not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.suite_cpu import HOOK  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--mirror",
        default=os.environ.get("LFBENCH_DATA_MIRROR", str(ROOT.parent / "shared" / "data")),
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        work, hook, log = Path(tmp) / "clone", Path(tmp) / "hook", Path(tmp) / "cpu.jsonl"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
        for cmd in (
            ["lfbench", "data", "fetch", "--mirror", args.mirror],
            ["dvc", "cache", "dir", "--local", str(ROOT / ".dvc" / "cache")],
        ):
            subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)
        env |= {
            "PYTHONPATH": f"{hook}{os.pathsep}{args.code.resolve()}",
            "LFBENCH_CPU_LOG": str(log),
            "DOCKER_HOST": "unix:///nonexistent.sock",  # the stages run here, not in the image
        }
        cpu, walls, said = [], [], ""
        for _ in range(args.repeat):
            (work / "dvc.lock").unlink(missing_ok=True)
            log.unlink(missing_ok=True)
            out = subprocess.run(
                ["lfbench", "repro", "--jobs", "2"],
                cwd=work,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            said = (out.stdout + out.stderr).strip().splitlines()[-1]
            rows = [json.loads(line) for line in log.read_text().splitlines()]
            (driver,) = [r for r in rows if r["argv"][1:2] == ["repro"]]
            cpu.append(driver["cpu"])
            walls.append(driver["wall"])
    result = {
        "code": str(args.code.resolve()),
        "stages": said,
        "driver_cpu_s": [round(c, 2) for c in cpu],
        "median_cpu_s": round(statistics.median(cpu), 2),
        "median_wall_s": round(statistics.median(walls), 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{said}: driver CPU {result['median_cpu_s']} s (median of {len(cpu)}: "
            f"{result['driver_cpu_s']}), wall {result['median_wall_s']} s; code {args.code}"
        )


if __name__ == "__main__":
    main()
