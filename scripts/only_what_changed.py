"""Only what changed runs (issue 33): add a model to SummHay and Long²RAG in a scratch clone of the
committed results, reproduce, change its temperature, reproduce, remove it, reproduce.

    python scripts/only_what_changed.py [--keep]

The scratch clone is `git clone` of this checkout, its DVC cache this checkout's (the committed
outputs checked out, nothing run) and its MLflow store a copy of this checkout's (the runs of the
committed results). The model `mine` is an OpenAI-compatible test server (its answers a function
of the prompt), on a slice: two SummHay subtopics (oracle) and ten Long²RAG questions. Each step
runs `dvc repro` and says which stages ran, and for every MLflow experiment which current run
ids changed; the removal step runs `lfbench prune` first (the model's stage entries and outputs)
and compares `dvc.lock` and the metrics files with the committed ones after its `dvc repro`.
Exits non-zero when a stage outside the model's own and its benchmarks' aggregates ran, or
another row's run id changed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.testing.server import TestServer  # noqa: E402

BIN = Path(sys.executable).parent
MODEL = "mine"
BENCHMARKS = ("summhay", "long2rag")
EXPERIMENTS = ("summhay", "long2rag", "crux", "crud_rag", "agreement")


def sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def current_ids(proj: Path) -> dict[str, dict[str, str]]:
    """experiment -> row key -> run id of its current runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{proj / 'mlruns' / 'mlflow.db'}")
    out: dict[str, dict[str, str]] = {}
    for name in EXPERIMENTS:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            continue
        runs = client.search_runs(
            [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
        )
        out[name] = {r.data.tags["lfbench.row_key"]: r.info.run_id for r in runs}
    return out


def edit(proj: Path, change: Any) -> None:
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text())
    change(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def step(
    proj: Path, env: dict[str, str], name: str, before: dict[str, dict[str, str]]
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    t0 = time.monotonic()
    out = sh([str(BIN / "dvc"), "repro"], proj, env)
    wall = round(time.monotonic() - t0, 1)
    ran = re.findall(r"Running stage '([^']+)'", out)
    # a stage whose dependencies the run cache already knows (e.g. the same answers as an
    # earlier run of this script, whose entries are in this checkout's cache) is restored
    restored = re.findall(r"Stage '([^']+)' is cached - skipping run", out)
    acted = set(ran) | set(restored)
    own = {s for s in acted if s.split("@", 1)[-1].startswith(MODEL) and "@" in s}
    aggregates = {f"{b}-aggregate" for b in BENCHMARKS}
    others = sorted(acted - own - aggregates)
    after = current_ids(proj)
    changed: dict[str, list[str]] = {}
    for exp in EXPERIMENTS:
        a, b = before.get(exp, {}), after.get(exp, {})
        keys = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        if keys:
            changed[exp] = sorted(keys)
    foreign = {e: [k for k in ks if MODEL not in k] for e, ks in changed.items()}
    foreign = {e: ks for e, ks in foreign.items() if ks}
    return {
        "step": name,
        "wall_s": wall,
        "ran": ran,
        "restored_from_run_cache": restored,
        "stages_outside_the_model_and_its_aggregates": others,
        "rows_with_new_run_ids": {e: len(ks) for e, ks in changed.items()},
        "other_rows_with_new_run_ids": foreign,
    }, after


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    work = Path(tempfile.mkdtemp(prefix="lfbench-only-what-changed-"))
    proj = work / "proj"
    report: list[dict[str, Any]] = []
    ok = True
    try:
        sh(["git", "clone", "-q", str(ROOT), str(proj)], work, env)
        sh([str(BIN / "dvc"), "cache", "dir", "--local", str(ROOT / ".dvc" / "cache")], proj, env)
        sh([str(BIN / "dvc"), "checkout", "-q"], proj, env)
        shutil.copytree(ROOT / "mlruns", proj / "mlruns")
        status = sh([str(BIN / "dvc"), "status"], proj, env)
        if "Data and pipelines are up to date" not in status:
            raise SystemExit(f"the scratch clone is not the committed results:\n{status}")
        committed = {
            p.name: p.read_bytes() for p in [proj / "dvc.lock", *(proj / "metrics").glob("*.json")]
        }
        ids = current_ids(proj)

        with TestServer(
            responder="perf.parallel_responder:respond", log_path=work / "server.log", cwd=ROOT
        ) as srv:

            def add(params: dict[str, Any]) -> None:
                params["models"][MODEL] = {
                    "provider": "openai",
                    "base_url": srv.base_url,
                    "model": MODEL,
                    "api_key_env": None,
                    "settings": ["oracle"],
                    "timeout_s": 60,
                    "slice": {"summhay": {"first": 2}, "long2rag": {"first": 10}},
                }
                for b in BENCHMARKS:
                    params[b]["models"].append(MODEL)

            def warmer(params: dict[str, Any]) -> None:
                params["models"][MODEL]["temperature"] = 0.7

            def remove(params: dict[str, Any]) -> None:
                del params["models"][MODEL]
                for b in BENCHMARKS:
                    params[b]["models"].remove(MODEL)

            for name, change in (("add", add), ("temperature 0.7", warmer), ("remove", remove)):
                edit(proj, change)
                pruned = ""
                if name == "remove":  # its stages' lock entries and outputs go first (README)
                    pruned = sh([str(BIN / "lfbench"), "prune"], proj, env)
                entry, ids = step(proj, env, name, ids)
                if name == "remove":
                    entry["prune"] = pruned.strip().splitlines()
                    entry["same_as_committed"] = {
                        n: (proj / ("metrics" if n != "dvc.lock" else "") / n).read_bytes() == b
                        for n, b in committed.items()
                    }
                    ok &= all(entry["same_as_committed"].values())
                ok &= not entry["stages_outside_the_model_and_its_aggregates"]
                ok &= not entry["other_rows_with_new_run_ids"]
                report.append(entry)
                print(json.dumps(entry, indent=1), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
