"""Wall time of a cold `make repro` from a fresh clone, with the time of each stage.

    python perf/cold_repro.py [--mirror DIR] [--keep-download-cache] [--json] [--keep DIR]
                              [--rev COMMIT]

Clones the committed project (or commit `--rev`) into a temporary folder and runs the README's
main command there (`make repro`: venv set-up, data fetch from the mirror, `lfbench check`, `dvc
repro` on the default params), reading its output as it comes. The package download cache is a
new empty folder (UV_CACHE_DIR) unless --keep-download-cache, so the set-up downloads what a
fresh machine downloads; the embedding cache, the ONNX model and the MLflow store start empty
because the clone does. Prints the total, the set-up (until the first stage starts), and the
seconds of each stage (from one "Running stage" line to the next), slowest first.

The issue-27 goal: at most 6 minutes on 2 cores, set-up included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE_RE = re.compile(r"^Running stage '([^']+)'")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mirror",
        default=os.environ.get("LFBENCH_DATA_MIRROR", str(ROOT.parent / "shared" / "data")),
    )
    ap.add_argument("--keep-download-cache", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log", type=Path, help="also write make's output here")
    ap.add_argument(
        "--keep", type=Path, help="clone into this new folder and keep it (its dvc.lock, metrics)"
    )
    ap.add_argument(
        "--rev", help="check this commit out in the clone (a before/after on the same machine)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clone = args.keep.resolve() if args.keep else Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        if args.rev:
            subprocess.run(["git", "checkout", "-q", args.rev], cwd=clone, check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
        # the clone's own venv, not the caller's
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p
        )
        env["LFBENCH_DATA_MIRROR"] = str(Path(args.mirror).resolve())
        env.pop("LFBENCH_EMBEDDING_CACHE", None)
        if not args.keep_download_cache:
            env["UV_CACHE_DIR"] = str(Path(tmp) / "uv-cache")
            env["PIP_NO_CACHE_DIR"] = "1"
        marks: list[tuple[str, float]] = []
        lines: list[str] = []
        start = time.monotonic()
        proc = subprocess.Popen(
            ["make", "repro"],
            cwd=clone,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = STAGE_RE.match(line)
            if m:
                marks.append((m.group(1), time.monotonic() - start))
        rc = proc.wait()
        total = time.monotonic() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        if args.log:
            args.log.write_text("".join(lines), encoding="utf-8")
        if rc != 0:
            raise SystemExit(f"make repro failed ({rc}):\n{''.join(lines[-40:])}")
    ends = [t for _, t in marks[1:]] + [total]
    stages = {name: round(end - t, 1) for (name, t), end in zip(marks, ends, strict=True)}
    result = {
        "total_s": round(total, 1),
        "setup_s": round(marks[0][1], 1) if marks else None,
        # CPU seconds of the clone, make and everything it ran: steadier than wall time on a machine
        # whose speed varies from run to run (both cores busy: wall time is about half)
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "stages": len(stages),
        "slowest": dict(sorted(stages.items(), key=lambda kv: -kv[1])[:12]),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"cold make repro: {result['total_s']} s ({result['total_s'] / 60:.1f} min)")
    print(f"set-up (venv, data, check) until the first stage: {result['setup_s']} s")
    print(f"CPU time of make and all it ran (user + system): {result['cpu_s']} s")
    print(f"{len(stages)} stages; the slowest:")
    for name, s in result["slowest"].items():
        print(f"  {s:7.1f} s  {name}")


if __name__ == "__main__":
    main()
