"""CPU time of opening a new SQLite MLflow store: migrated by MLflow vs seeded from the template.

    python perf/mlflow_store.py [--repeat 5]

Each measurement is a new interpreter that imports MLflow first (not timed), then opens a store
in a new folder and lists its experiments (timed: CPU seconds of the process, its own clock):

- "migrated": `MlflowClient` on a file that does not exist (MLflow runs its schema migrations);
- "seeded": `pipeline.stages.mlflow_store.seed_sqlite_store` first (a copy of the template made
  once by `mlflow db upgrade`, in a scratch cache folder made before the runs), then the same.
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

CHILD = r"""
import sys, time
import mlflow
from mlflow.tracking import MlflowClient
import mlflow.store.tracking.sqlalchemy_store
from pipeline.stages.mlflow_store import seed_sqlite_store
uri = "sqlite:///" + sys.argv[1]
t = time.process_time()
if sys.argv[2] == "seeded":
    assert seed_sqlite_store(uri)
MlflowClient(tracking_uri=uri).search_experiments()
print(time.process_time() - t)
"""


def _once(folder: Path, how: str, env: dict[str, str]) -> float:
    folder.mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder / "mlflow.db"), how],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        _once(Path(tmp) / "warm", "migrated", env)  # bytecode, page cache
        from pipeline.stages import mlflow_store

        os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]
        assert mlflow_store._schema_template() is not None
        result = {}
        for how in ("migrated", "seeded"):
            runs = [_once(Path(tmp) / f"{how}{i}", how, env) for i in range(args.repeat)]
            result[how] = {"median_cpu_s": round(statistics.median(runs), 3), "runs": runs}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
