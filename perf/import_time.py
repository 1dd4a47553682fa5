"""Start-up cost of a stage's process with and without bytecode caches.

    python perf/import_time.py [--repeat 3] [MODULE ...]

Every stage of `dvc repro` is a new `lfbench` process, so what its imports cost is paid 33 times in
a cold run. uv installs packages without bytecode, and some machines set PYTHONDONTWRITEBYTECODE:
then each process compiles every module it imports from source again. This times
`python -c "import M"` for each module (median of --repeat runs, each a new interpreter):

- "no bytecode": PYTHONPYCACHEPREFIX is a new empty folder and PYTHONDONTWRITEBYTECODE=1, so
  Python finds no cached bytecode and writes none (what each stage paid before `make` stopped
  passing PYTHONDONTWRITEBYTECODE on);
- "bytecode": the same prefix after one warm-up run that wrote it (what each stage pays once
  the first one has compiled the modules).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODULES = ["pipeline.cli", "mlflow", "sklearn.linear_model", "pandas", "dvc.repo", "onnxruntime"]


def _time(module: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", default=MODULES)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'module':24} {'no bytecode':>12} {'bytecode':>10} {'ratio':>6}")
    totals = [0.0, 0.0]
    for module in args.modules:
        with tempfile.TemporaryDirectory() as none, tempfile.TemporaryDirectory() as cached:
            base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            cold_env = {**base, "PYTHONPYCACHEPREFIX": none, "PYTHONDONTWRITEBYTECODE": "1"}
            warm_env = {**base, "PYTHONPYCACHEPREFIX": cached}
            cold = statistics.median(_time(module, cold_env) for _ in range(args.repeat))
            _time(module, warm_env)  # writes the bytecode
            warm = statistics.median(_time(module, warm_env) for _ in range(args.repeat))
        totals[0] += cold
        totals[1] += warm
        print(f"{module:24} {cold:11.2f}s {warm:9.2f}s {cold / warm:5.1f}x")
    print(f"{'sum':24} {totals[0]:11.2f}s {totals[1]:9.2f}s {totals[0] / totals[1]:5.1f}x")


if __name__ == "__main__":
    main()
