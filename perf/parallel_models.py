"""Many models at once (issue 33): serial `dvc repro` against `lfbench repro --jobs N`, and
against a two-worker Dask cluster.

    python perf/parallel_models.py [--models 8] [--latency-ms 2000] [--concurrency 4]
        [--l2r-items 40] [--summhay-subtopics 4] [--jobs 8] [--cluster] [--json]

A scratch project (this checkout's tracked files, a fresh git repository, data from the mirror)
is sliced to SummHay's news1 (the released gpt-4o summaries, judged by the released GPT-4o
judgements and the local judge trained on news1) and Long²RAG's derived questions, and its
pipeline is made once (the "committed results"). Then N models are added, each behind its own
OpenAI-compatible test server (`--latency-ms` per answer, `--concurrency` requests in flight),
each on its own slice: the first `--l2r-items` Long²RAG questions (every setting) and the first
`--summhay-subtopics` SummHay subtopics (oracle), judged by the local judge (and Long²RAG's
overlap judge). The same change is reproduced three ways, each in its own copy of the project:

- serial: `dvc repro`;
- parallel: `lfbench repro --jobs N`;
- cluster (`--cluster`): a Dask scheduler and two `lfbench worker`s, each in its own clone (the
  two "machines"), sharing a SeaweedFS S3 server as the DVC remote (with the run cache), an
  MLflow tracking server and a PostgreSQL response cache (`lfbench team up --seaweedfs`); the
  driver's clone runs `lfbench repro --jobs N --cluster ADDR`.

For each: wall time, requests the servers answered (every body once), and whether dvc.lock and
metrics/*.json are byte-identical to the serial run's. Prints a table (or `--json`).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.testing.server import TestServer  # noqa: E402
from tests.conftest import keep_builtin_entries, make_project, slice_summhay  # noqa: E402

BIN = Path(sys.executable).parent
TARGETS = ["summhay-aggregate", "summhay-agreement", "long2rag-aggregate"]
RESPONDER = "perf.parallel_responder:respond"


def sh(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def base_params(proj: Path) -> None:
    """The sliced project the models are added to."""
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    params["runtime"] = "local"
    models, judges = keep_builtin_entries(params, "news1")
    slice_summhay(params)
    params["models"] = {**models, "published": params["models"]["published"]}
    params["judges"] = {**judges, "published-gpt-4o": params["judges"]["published-gpt-4o"]}
    s = params["summhay"]
    s["judges"] = ["published-gpt-4o", "local"]
    s["subtopics"] = None
    l2r = params["long2rag"]
    l2r["derived"].update(haystacks=["news1", "news2", "news3", "news4", "news5"], subtopics=None)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def add_models(proj: Path, urls: list[str], args: argparse.Namespace) -> list[str]:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    names = []
    for i, url in enumerate(urls):
        name = f"m{i + 1}"
        names.append(name)
        params["models"][name] = {
            "provider": "openai",
            "base_url": url,
            "model": name,
            "api_key_env": None,
            "settings": ["oracle"],
            "max_concurrency": args.concurrency,
            "timeout_s": 120,
            "slice": {
                "long2rag": {"first": args.l2r_items},
                "summhay": {"first": args.summhay_subtopics},
            },
        }
        params["summhay"]["models"].append(name)
        params["long2rag"]["models"].append(name)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return names


def copy_project(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=True)


def compare(a: Path, b: Path) -> dict[str, bool]:
    """Each metrics file byte for byte, and dvc.lock's entries (each stage's). A serial `dvc
    repro` appends new stages to dvc.lock in an order that follows Python's hash seed, so the
    entries are compared as parsed, and the bytes apart (`dvc.lock bytes`)."""
    files = sorted(str(p.relative_to(a)) for p in (a / "metrics").glob("*.json"))
    out = {f: (b / f).exists() and filecmp.cmp(a / f, b / f, shallow=False) for f in files}
    la, lb = (yaml.safe_load((x / "dvc.lock").read_text())["stages"] for x in (a, b))
    out["dvc.lock entries"] = la == lb
    out["dvc.lock bytes"] = filecmp.cmp(a / "dvc.lock", b / "dvc.lock", shallow=False)
    return out


def served(servers: list[TestServer], since: list[int]) -> tuple[int, int]:
    """Requests the servers answered since `since` (their log lengths then), and how many of
    those repeated a body."""
    bodies = [
        r["body_sha256"]
        for s, n in zip(servers, since, strict=True)
        for r in s.log()[n:]
        if r.get("served")
    ]
    return len(bodies), len(bodies) - len(set(bodies))


def marks(servers: list[TestServer]) -> list[int]:
    return [len(s.log()) for s in servers]


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    sh(cmd, cwd, env)
    return round(time.monotonic() - t0, 1)


def phases(proj: Path) -> dict[str, Any]:
    """Where an `lfbench repro` run's time went, from its timeline (.lfbench/logs/repro-*.json):
    per kind of stage (generate, judge, results, aggregate) the first start and last end in
    seconds from the run's start, the longest a ready stage waited for a slot, and the longest
    the driver took to save a finished stage."""
    logs = sorted(
        (proj / ".lfbench" / "logs").glob("repro-*.json"), key=lambda p: p.stat().st_mtime
    )
    if not logs:
        return {}
    rows = [r for r in json.loads(logs[-1].read_text())["stages"] if r["started"] is not None]
    out: dict[str, Any] = {}
    for kind in ("generate", "judge", "results", "aggregate"):
        rs = [r for r in rows if f"-{kind}" in r["stage"]]
        if rs:
            out[kind] = {
                "n": len(rs),
                "first_start": min(r["started"] for r in rs),
                "last_end": max(r["ended"] or 0 for r in rs),
                "longest": max((r["ended"] or 0) - r["started"] for r in rs),
            }
    parts: dict[str, float] = {}
    for r in rows:
        for k, v in (r.get("phases") or {}).items():
            parts[k] = round(parts.get(k, 0.0) + v, 1)
    if parts:  # a cluster's stages: seconds summed over stages in each part of a worker's task
        out["worker_parts"] = parts
    out["max_wait_for_slot"] = max((r["started"] - r["ready"] for r in rows), default=0)
    out["max_save_lag"] = max(
        ((r["settled"] or r["ended"] or 0) - (r["ended"] or 0) for r in rows), default=0
    )
    return out


def read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip().strip("'\"")
    return out


def run_cluster(
    work: Path, base: Path, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    """Two worker clones and a driver clone on one team's services (`lfbench team up`: MLflow
    server on PostgreSQL, SeaweedFS as the S3 DVC remote, the PostgreSQL response cache)."""
    team = work / "team"
    work.mkdir(parents=True, exist_ok=True)
    sh(["lfbench", "team", "up", "--dir", str(team), "--seaweedfs"], work, env)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        tenv = {**env, **read_env(team / "team.env"), **read_env(team / "secrets.env")}
        clones = {}
        for name in ("driver", "w1", "w2"):
            clone = work / name
            copy_project(base, clone)
            remote, endpoint = tenv["LFBENCH_TEAM_DVC_REMOTE"], tenv["LFBENCH_TEAM_S3_ENDPOINT"]
            sh(["dvc", "remote", "add", "-f", "--local", "-d", "team", remote], clone, tenv)
            sh(["dvc", "remote", "modify", "--local", "team", "endpointurl", endpoint], clone, tenv)
            clones[name] = clone
        sched_file = work / "scheduler.json"
        with (work / "scheduler.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        str(BIN / "dask"),
                        "scheduler",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "0",
                        "--scheduler-file",
                        str(sched_file),
                        "--no-dashboard",
                    ],
                    cwd=work,
                    env=tenv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        for _ in range(300):
            if sched_file.exists():
                break
            time.sleep(0.2)
        addr = json.loads(sched_file.read_text())["address"]
        for name in ("w1", "w2"):
            with (work / f"{name}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            "lfbench",
                            "worker",
                            addr,
                            "--clone",
                            str(clones[name]),
                            "--jobs",
                            str(args.jobs),
                            "--name",
                            name,
                        ],
                        cwd=clones[name],
                        env=tenv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        from distributed import Client

        with Client(addr, timeout="60s") as c:
            c.wait_for_workers(2, timeout=120)
        cmd = ["lfbench", "repro", "--jobs", str(args.jobs), "--cluster", addr, *TARGETS]
        seconds = timed(cmd, clones["driver"], tenv)
        return {"seconds": seconds, "driver": clones["driver"]}
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        sh(["lfbench", "team", "down", "--dir", str(team)], work, env, check=False)


def run_parallel(
    parallel: Path,
    env: dict[str, str],
    servers: list[TestServer],
    serial: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """`lfbench repro --jobs N` in its copy of the project."""
    m = marks(servers)
    run: dict[str, Any] = {
        "seconds": timed(["lfbench", "repro", "--jobs", str(args.jobs), *TARGETS], parallel, env)
    }
    n, dup = served(servers, m)
    run.update(requests=n, repeated=dup, phases=phases(parallel))
    status = sh(["dvc", "status", *TARGETS], parallel, env)
    run["dvc_status_clean"] = "up to date" in status
    if not args.skip_serial:
        run["same_as_serial"] = compare(serial, parallel)
    print(f"parallel: {run}", file=sys.stderr, flush=True)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=2000.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--l2r-items", type=int, default=40)
    ap.add_argument("--summhay-subtopics", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--cluster", action="store_true", help="also a two-worker Dask cluster")
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument(
        "--skip-parallel", action="store_true", help="with --cluster: only the cluster run"
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mirror = Path(os.environ.get("LFBENCH_DATA_MIRROR", ROOT.parent / "shared" / "data"))
    work = Path(tempfile.mkdtemp(prefix="lfbench-parallel-"))
    work.chmod(0o755)  # the team's PostgreSQL (run as `postgres` under root) enters it
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "LFBENCH_EMBEDDING_CACHE": str(work / "embeddings.sqlite"),
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("LFBENCH_CACHE_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "models": args.models}
    try:
        base = work / "base"
        make_project(base, mirror)
        base_params(base)
        out["base_s"] = timed(["dvc", "repro", *TARGETS], base, env)
        sh(["git", "add", "-A"], base, env)
        sh(["git", "-c", "user.name=p", "-c", "user.email=p@p", "commit", "-qm", "base"], base, env)
        with ExitStack() as stack:
            servers = [
                stack.enter_context(
                    TestServer(
                        responder=RESPONDER,
                        latency_ms=args.latency_ms,
                        log_path=work / f"server{i}.log",
                        cwd=ROOT,
                    )
                )
                for i in range(args.models)
            ]
            urls = [s.base_url for s in servers]
            add_models(base, urls, args)
            sh(["git", "add", "-A"], base, env)
            sh(["git", "-c", "user.name=p", "-c", "user.email=p@p", "commit", "-qm", "models"],
               base, env)  # fmt: skip
            runs: dict[str, dict[str, Any]] = {}
            serial = work / "serial"
            copy_project(base, serial)
            parallel = work / "parallel"
            copy_project(base, parallel)
            if not args.skip_serial:
                m = marks(servers)
                runs["serial"] = {"seconds": timed(["dvc", "repro", *TARGETS], serial, env)}
                n, dup = served(servers, m)
                runs["serial"].update(requests=n, repeated=dup)
                print(f"serial: {runs['serial']}", file=sys.stderr, flush=True)
            if not (args.skip_parallel and args.cluster):
                runs["parallel"] = run_parallel(parallel, env, servers, serial, args)
            if args.cluster:
                m = marks(servers)
                c = run_cluster(work / "cluster", base, env, args)
                n, dup = served(servers, m)
                runs["cluster"] = {
                    "seconds": c["seconds"],
                    "requests": n,
                    "repeated": dup,
                    "phases": phases(c["driver"]),
                }
                if not args.skip_serial:
                    runs["cluster"]["same_as_serial"] = compare(serial, c["driver"])
        out["runs"] = runs
        if "parallel" in runs and "cluster" in runs:
            ratio = runs["cluster"]["seconds"] / runs["parallel"]["seconds"]
            runs["cluster"]["times_parallel"] = round(ratio, 2)
        if "serial" in runs:
            for k in ("parallel", "cluster"):
                if k in runs:
                    runs[k]["speedup"] = round(runs["serial"]["seconds"] / runs[k]["seconds"], 2)
    finally:
        out["loadavg_after"] = os.getloadavg()
        if args.keep:
            out["scratch"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    print(f"{args.models} models x ({args.l2r_items} Long2RAG items x every setting + "
          f"{args.summhay_subtopics} SummHay subtopics), {args.latency_ms:.0f} ms per answer, "
          f"{args.concurrency} in flight; base pipeline {out.get('base_s')} s")  # fmt: skip
    for k, r in out.get("runs", {}).items():
        same = r.get("same_as_serial")
        same_txt = (
            ""
            if same is None
            else ", identical to serial: "
            + str(all(v for k, v in same.items() if k != "dvc.lock bytes"))
        )
        print(
            f"  {k:9} {r['seconds']:7.1f} s  x{r.get('speedup', 1.0):<5} "
            f"{r.get('requests')} requests ({r.get('repeated', 0)} repeated){same_txt}"
        )
        if "times_parallel" in r:
            print(f"      {r['times_parallel']:.2f}x the --jobs {args.jobs} time (goal 1.2x)")
        for kind, ph in (r.get("phases") or {}).items():
            if kind == "worker_parts":
                print(
                    "      worker parts (s, summed): "
                    + ", ".join(f"{k} {v}" for k, v in ph.items())
                )
            elif isinstance(ph, dict):
                print(
                    f"      {kind:9} {ph['n']:3} stages  {ph['first_start']:6.1f} s -> "
                    f"{ph['last_end']:6.1f} s  (longest {ph['longest']:.1f} s)"
                )
            else:
                print(f"      {kind}: {ph:.1f} s")


if __name__ == "__main__":
    main()
