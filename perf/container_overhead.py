"""Cost of running stages in the container: per-stage overhead and image build times.

    python perf/container_overhead.py [--base IMAGE] [--repeat 10] [--skip-cold]

(i) per-stage overhead: wall time of an empty command (`python -c pass`, then `lfbench
--version`) through the container runner (`containers.run_stage_in_container`, what `lfbench
run` uses) against the same command as a local process; median of REPEAT runs each.
(ii) image build time on a copy of the build context (Dockerfile, lock, package): warm (layer
cache, no change) and cold (`--no-cache`; the wheelhouse download is cached per lock and not
counted). Prints JSON. Needs a Docker engine and the base image (default $LFBENCH_BASE_IMAGE,
else lfbench-base:bookworm from scripts/build-base-image.sh).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import containers  # noqa: E402


def _median(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
    }


def _context(dest: Path) -> Path:
    for name in (
        "Dockerfile",
        ".dockerignore",
        "requirements.lock",
        "requirements-nodeps.lock",
        "pyproject.toml",
    ):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "pipeline", dest / "pipeline", ignore=shutil.ignore_patterns("__py*"))
    return dest


def _build(ctx: Path, client: Any, base: str, nocache: bool) -> tuple[float, str]:
    start = time.perf_counter()
    record = containers.build_image(
        ctx, client=client, base=base, tag="lfbench:bench", nocache=nocache
    )
    return time.perf_counter() - start, str(record["image_id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=os.environ.get("LFBENCH_BASE_IMAGE", "lfbench-base:bookworm"))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--skip-cold", action="store_true", help="Skip the --no-cache build.")
    args = ap.parse_args()

    client = containers.docker_client()
    if client is None:
        sys.exit("no Docker engine answers")
    result: dict[str, Any] = {"base_image": args.base, "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = _context(Path(tmp))
        containers.wheelhouse(containers.lock_files(ctx))  # download once, outside the timings
        _, image = _build(ctx, client, args.base, nocache=False)  # make sure the cache is there
        warm, warm_id = _build(ctx, client, args.base, nocache=False)
        result["build_warm_s"] = round(warm, 2)
        result["build_warm_same_image"] = warm_id == image
        if not args.skip_cold:
            cold, _ = _build(ctx, client, args.base, nocache=True)
            result["build_cold_s"] = round(cold, 2)
        result["image_id"] = image
        workdir = Path(tmp)

        def in_container(argv: list[str]) -> Callable[[], object]:
            def go() -> None:
                out, err = io.StringIO(), io.StringIO()
                code = containers.run_stage_in_container(
                    image, argv, workdir, {}, client=client, stdout=out, stderr=err
                )
                if code != 0:
                    raise RuntimeError(err.getvalue())

            return go

        def local(argv: list[str]) -> Callable[[], object]:
            return lambda: subprocess.run(argv, cwd=workdir, check=True, capture_output=True)

        lfbench = str(Path(sys.executable).parent / "lfbench")
        for label, c_argv, l_argv in (
            ("python -c pass", ["python", "-c", "pass"], [sys.executable, "-c", "pass"]),
            ("lfbench --version", ["lfbench", "--version"], [lfbench, "--version"]),
        ):
            dock = _median(in_container(c_argv), args.repeat)
            loc = _median(local(l_argv), args.repeat)
            result[label] = {
                "container": dock,
                "local": loc,
                "overhead_median_s": round(dock["median_s"] - loc["median_s"], 3),
            }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
