"""A sweep on DVC's experiment queue: N experiments with `dvc queue start --jobs J`, against the
same number run one by one with `dvc exp run`.

    python perf/exp_queue.py [--experiments 4] [--jobs 2] [--latency-ms 2000] [--haystacks news1]

A scratch clone of this checkout shares its DVC cache (`dvc cache dir --local`), so the stages a
sweep does not touch are checked out, not re-run (run `make repro` here first). One model entry,
`sweep`, sits behind the OpenAI-compatible test server (`--latency-ms` per answer, as a hosted
model would take), judged by `sweep-judge` (batched), on SummHay's oracle setting. The
experiments differ in the model's temperature (each a new set of requests: nothing is served
from the cache across them). Every experiment logs to one MLflow store and one response cache
named by absolute paths (`MLFLOW_TRACKING_URI`, `LFBENCH_CACHE_URL`), as a team's would.

Prints one JSON line: the serial and queued wall times, the speed-up, the requests the server
answered, and each experiment's Joint from `dvc exp show`. The machine's load is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
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
from tests.conftest import list_entries  # noqa: E402

BIN = Path(sys.executable).parent
KEY_ENV = "LFBENCH_SWEEP_KEY"


def sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def configure(proj: Path, base_url: str, haystacks: list[str]) -> None:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_concurrency": 2,
        "timeout_s": 60,
    }
    params["models"]["sweep"] = {
        **endpoint,
        "model": "sweep",
        "settings": ["oracle"],
        "temperature": 0.0,
    }
    params["judges"]["sweep-judge"] = {**endpoint, "model": "sweep-judge", "mode": "batched"}
    params["summhay"]["haystacks"] = haystacks
    params["summhay"]["models"] = ["sweep"]
    params["summhay"]["judges"] = ["sweep-judge"]
    params["summhay"]["agreement"]["max_samples"] = 4
    params["crux"]["answers"]["generations"] = None  # CRUX compares with the released summaries
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    list_entries(proj)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiments", type=int, default=4)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=2000.0)
    p.add_argument("--haystacks", nargs="+", default=["news1"])
    args = p.parse_args()
    if not (ROOT / ".dvc" / "cache").exists():
        raise SystemExit("run `make repro` in this checkout first (its DVC cache is shared)")

    tmp = Path(tempfile.mkdtemp(prefix="lfbench-sweep-"))
    proj = tmp / "proj"
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        KEY_ENV: "sk-lfbench-sweep",
        "LFBENCH_CACHE_URL": f"sqlite:///{tmp / 'cache' / 'llm.sqlite'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlruns' / 'mlflow.db'}",
        "LFBENCH_EMBEDDING_CACHE": str(ROOT / ".lfbench" / "cache" / "embeddings.sqlite"),
    }
    (tmp / "mlruns").mkdir()
    server = TestServer(
        responder="tests.e2e.summhay_responder:respond",
        latency_ms=args.latency_ms,
        log_path=tmp / "server.log",
        cwd=ROOT,
    )
    out: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    try:
        with server as srv:
            sh(["git", "clone", "-q", str(ROOT), str(proj)], tmp, env)
            sh(["dvc", "cache", "dir", "--local", str(ROOT / ".dvc" / "cache")], proj, env)
            sh(["dvc", "checkout", "-q"], proj, env)
            configure(proj, srv.base_url, args.haystacks)
            t0 = time.monotonic()
            sh(["dvc", "repro"], proj, env)  # the baseline: temperature 0
            out["baseline_s"] = round(time.monotonic() - t0, 1)
            sh(["git", "add", "-A"], proj, env)
            sh(
                ["git", "-c", "user.name=p", "-c", "user.email=p@p", "commit", "-qm", "sweep"],
                proj,
                env,
            )
            n0 = len(srv.log())

            temps = [round(0.1 * (i + 1), 2) for i in range(2 * args.experiments)]
            serial, queued = temps[: args.experiments], temps[args.experiments :]
            t0 = time.monotonic()
            for t in serial:
                sh(["dvc", "exp", "run", "-S", f"models.sweep.temperature={t}"], proj, env)
            out["serial_s"] = round(time.monotonic() - t0, 1)
            n1 = len(srv.log())
            sh(["git", "checkout", "--", "params.yaml"], proj, env)
            sh(["dvc", "checkout", "-q", "--force"], proj, env)

            for t in queued:
                sh(
                    ["dvc", "exp", "run", "--queue", "-S", f"models.sweep.temperature={t}"],
                    proj,
                    env,
                )
            t0 = time.monotonic()
            sh(["dvc", "queue", "start", "--jobs", str(args.jobs)], proj, env)
            while True:
                status = sh(["dvc", "queue", "status"], proj, env)
                busy = [ln for ln in status.splitlines() if " Queued " in ln or " Running " in ln]
                if not busy:
                    break
                time.sleep(2)
            out["queued_s"] = round(time.monotonic() - t0, 1)
            failed = [ln for ln in status.splitlines() if " Failed " in ln]
            if failed:
                raise SystemExit(f"experiments failed:\n{status}")
            n2 = len(srv.log())
            shown = json.loads(sh(["dvc", "exp", "show", "--json"], proj, env))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    exps = []
    for rev in shown:
        for exp in rev.get("experiments") or []:
            for run in exp.get("revs", []):
                data = run.get("data") or {}
                temp = (
                    ((data.get("params") or {}).get("params.yaml") or {})
                    .get("data", {})
                    .get("models", {})
                    .get("sweep", {})
                    .get("temperature")
                )
                exps.append({"name": run.get("name"), "temperature": temp})
    out.update(
        experiments=args.experiments,
        jobs=args.jobs,
        latency_ms=args.latency_ms,
        haystacks=args.haystacks,
        requests_serial=n1 - n0,
        requests_queued=n2 - n1,
        speedup=round(out["serial_s"] / out["queued_s"], 2),
        experiments_shown=exps,
        loadavg_after=os.getloadavg(),
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
