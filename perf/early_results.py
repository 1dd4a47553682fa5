"""A fast model's results while a slow one still runs (issue 42): `lfbench repro --jobs 3` with
two models behind test servers, one `--ratio` (100) times slower than the other.

    python perf/early_results.py [--fast-ms 40] [--ratio 100] [--items 20] [--jobs 3] [--json]

A scratch project (this checkout's tracked files, a fresh git repository, data from the mirror)
is sliced to Long²RAG's derived questions of three haystacks, one setting (rag_512) and its
no-model overlap judge, and its pipeline made once (the "committed results"). Then two models
are added, each behind its own OpenAI-compatible test server answering one request at a time
(`max_concurrency: 1`): `fast` (`--fast-ms` per answer) and `slow` (`--ratio` times that), each
on the first `--items` questions. In one copy `lfbench repro --jobs 3` runs the change, and while
it runs this script polls:

- when the fast model's rows are in `results/long2rag/fast.json` (its `long2rag-results@fast`
  stage done, from `lfbench status --json`), its runs in MLflow (current runs tagged
  `model.entry=fast`), `lfbench compare fast lead` and `lfbench audit sample --model fast`
  answer (exit 0): "available";
- once, while the slow model still runs: `lfbench plan`, `lfbench compare` and `lfbench status`
  (exit status and time; no lock error).

The fast model's own stages' time is the sum of its generate, judge and results stages' wall
times (the driver's timeline); the goal is "available" within 2x that, while the slow model's
stages still run. Then a serial `dvc repro` of the same change in another copy: metrics/,
reports/ and results/ must be byte-identical.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf.parallel_models import RESPONDER, copy_project, phases, sh  # noqa: E402
from pipeline.testing.server import TestServer  # noqa: E402
from tests.conftest import keep_builtin_entries, make_project, slice_summhay  # noqa: E402

BIN = Path(sys.executable).parent
TARGETS = ["long2rag-aggregate"]
BENCH = "long2rag"
SETTING = "rag_512"
JUDGE = "l2r-overlap"


def base_params(proj: Path) -> None:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    params["runtime"] = "local"
    models, judges = keep_builtin_entries(params, "news1")
    slice_summhay(params)
    params["models"] = {**models, "published": params["models"]["published"]}
    params["judges"] = {**judges, "published-gpt-4o": params["judges"]["published-gpt-4o"]}
    l2r = params[BENCH]
    l2r["derived"].update(haystacks=["news1", "news2", "news3"], subtopics=None)
    l2r.update(models=["lead"], judges=[JUDGE], settings=[SETTING])
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def add_models(proj: Path, urls: dict[str, str], items: int) -> None:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text())
    for name, url in urls.items():
        params["models"][name] = {
            "provider": "openai",
            "base_url": url,
            "model": name,
            "api_key_env": None,
            "max_concurrency": 1,
            "timeout_s": 120,
            "slice": {BENCH: {"first": items}},
        }
        params[BENCH]["models"].append(name)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def probe(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return {
        "rc": proc.returncode,
        "s": round(time.monotonic() - t0, 1),
        "out": (proc.stdout + proc.stderr)[-600:],
    }


def fast_runs_in_mlflow(proj: Path) -> int:
    from mlflow.tracking import MlflowClient

    db = proj / "mlruns" / "mlflow.db"
    if not db.exists():
        return 0
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(BENCH)
    if exp is None:
        return 0
    runs = client.search_runs(
        [exp.experiment_id],
        "tags.`lfbench.current` = 'true' and tags.`model.entry` = 'fast'",
        max_results=1000,
    )
    return len(runs)


def stage_states(proj: Path) -> dict[str, str]:
    try:
        doc = json.loads((proj / ".lfbench" / "repro-state.json").read_text())
    except (OSError, ValueError):
        return {}
    return {s["stage"]: s["state"] for s in doc.get("stages", [])}


COMPARE = [
    "lfbench", "compare", "fast", "lead", "--benchmark", BENCH, "--setting", SETTING,
    "--judge", JUDGE, "--resamples", "1000",
]  # fmt: skip
AUDIT = [
    "lfbench", "audit", "sample", "--benchmark", BENCH, "--model", "fast", "--setting", SETTING,
    "--judge", JUDGE, "-n", "5", "--no-traces", "--name", "early-fast",
]  # fmt: skip


def _in_thread(into: dict[str, Any], key: str, cmd: list[str], cwd: Path, env: dict[str, str],
               t0: float) -> threading.Thread:  # fmt: skip
    """`probe(cmd)` in a thread, its result (with when it returned, from t0) into `into[key]`."""

    def go() -> None:
        res = probe(cmd, cwd, env)
        res["answered_at_s"] = round(time.monotonic() - t0, 1)
        into[key] = res

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def _mlflow_in_thread(into: dict[str, Any], proj: Path, t0: float) -> threading.Thread:
    def go() -> None:
        into["mlflow_runs"] = fast_runs_in_mlflow(proj)
        into["mlflow_at_s"] = round(time.monotonic() - t0, 1)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def watch(proj: Path, env: dict[str, str], jobs: int) -> dict[str, Any]:
    """`lfbench repro --jobs N` in `proj`, polled as the module's docstring says (every 0.2 s,
    the probes each in its own thread so that none delays another)."""
    out: dict[str, Any] = {"during": {}, "fast": {}}
    threads: list[threading.Thread] = []
    t0 = time.monotonic()
    log = (proj.parent / "repro.log").open("w")
    proc = subprocess.Popen(
        ["lfbench", "repro", "--jobs", str(jobs), *TARGETS],
        cwd=proj,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    slow_gen = f"{BENCH}-generate@slow"
    try:
        while proc.poll() is None:
            now = round(time.monotonic() - t0, 1)
            states = stage_states(proj)
            if "at_s" not in out["during"] and states.get(slow_gen) == "running":
                # while the slow model generates: the looks that were refused before
                during = out["during"]
                during["at_s"] = now
                for key, cmd in (
                    ("plan", ["lfbench", "plan", *TARGETS]),
                    ("compare", COMPARE),
                    ("status", ["lfbench", "status"]),
                    ("dvc_status", ["dvc", "status"]),
                ):
                    threads.append(_in_thread(during, key, cmd, proj, env, t0))
            fast = out["fast"]
            if "seen_at_s" not in fast and states.get(f"{BENCH}-results@fast") == "done":
                fast["seen_at_s"] = now
                fast["slow_generating"] = states.get(slow_gen) == "running"
                rows = json.loads((proj / "results" / BENCH / "fast.json").read_text())["rows"]
                fast["rows"] = len(rows)
                threads.append(_mlflow_in_thread(fast, proj, t0))
                threads.append(_in_thread(fast, "compare", COMPARE, proj, env, t0))
                threads.append(_in_thread(fast, "audit", AUDIT, proj, env, t0))
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.wait()
        log.close()
    for th in threads:
        th.join(timeout=300)
    out["rc"] = proc.returncode
    out["seconds"] = round(time.monotonic() - t0, 1)
    out["status_after"] = probe(["lfbench", "status"], proj, env)["out"].splitlines()[:2]
    logs = sorted(
        (proj / ".lfbench" / "logs").glob("repro-*.json"), key=lambda p: p.stat().st_mtime
    )
    rows = {r["stage"]: r for r in json.loads(logs[-1].read_text())["stages"]}
    mine = [f"{BENCH}-generate@fast", f"{BENCH}-judge@fast-{JUDGE}", f"{BENCH}-results@fast"]
    durations = {s: round((rows[s]["ended"] or 0) - (rows[s]["started"] or 0), 1) for s in mine}
    out["fast_stages_s"] = durations
    out["fast_own_s"] = round(sum(durations.values()), 1)
    # the driver's clock starts a moment after this script's (the process's start)
    out["fast_results_ended_s"] = rows[mine[-1]]["ended"]
    out["fast_generate_started_s"] = rows[mine[0]]["started"]
    out["slow_generate_ended_s"] = rows.get(slow_gen, {}).get("ended")
    out["slow_results_ended_s"] = rows.get(f"{BENCH}-results@slow", {}).get("ended")
    out["aggregate_ended_s"] = rows.get(f"{BENCH}-aggregate", {}).get("ended")
    out["phases"] = phases(proj)
    return out


def same_files(a: Path, b: Path) -> dict[str, bool]:
    files = sorted(
        str(p.relative_to(a))
        for folder in ("metrics", "reports", "results")
        for p in (a / folder).rglob("*")
        if p.is_file()
    )
    others = sorted(
        str(p.relative_to(b))
        for folder in ("metrics", "reports", "results")
        for p in (b / folder).rglob("*")
        if p.is_file()
    )
    out = {f: (b / f).exists() and _same(a / f, b / f) for f in files}
    out.update({f: False for f in others if f not in out})
    return out


def _same(a: Path, b: Path) -> bool:
    """Byte for byte; DVC's .gitignore files of output folders as sets of lines: a serial `dvc
    repro` appends new outputs in an order that follows Python's hash seed (README, "Many
    models at once"), and they are not part of any hash."""
    if a.name == ".gitignore":
        return sorted(a.read_text().splitlines()) == sorted(b.read_text().splitlines())
    return filecmp.cmp(a, b, shallow=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast-ms", type=float, default=40.0)
    ap.add_argument("--ratio", type=float, default=100.0)
    ap.add_argument("--items", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="a scratch folder kept by --keep: its base project (made once) is reused",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mirror = Path(os.environ.get("LFBENCH_DATA_MIRROR", ROOT.parent / "shared" / "data"))
    work = Path(tempfile.mkdtemp(prefix="lfbench-early-"))
    if args.reuse is not None:
        shutil.copy2(args.reuse / "embeddings.sqlite", work / "embeddings.sqlite")
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "LFBENCH_EMBEDDING_CACHE": str(work / "embeddings.sqlite"),
    }
    for k in ("MLFLOW_TRACKING_URI", "LFBENCH_CACHE_URL", "PYTHONDONTWRITEBYTECODE"):
        env.pop(k, None)
    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "args": vars(args)}
    t_all = time.monotonic()
    try:
        base = work / "base"
        if args.reuse is not None:  # its base commit, before the models were added
            copy_project(args.reuse / "base", base)
            if "models" in sh(["git", "log", "-1", "--format=%s"], base, env):
                sh(["git", "reset", "-q", "--hard", "HEAD~1"], base, env)
        else:
            make_project(base, mirror)
            base_params(base)
            t = time.monotonic()
            sh(["dvc", "repro", *TARGETS], base, env)
            out["base_s"] = round(time.monotonic() - t, 1)
            sh(["git", "add", "-A"], base, env)
            sh(["git", "-c", "user.name=p", "-c", "user.email=p@p", "commit", "-qm", "base"],
               base, env)  # fmt: skip
        slow_ms = args.fast_ms * args.ratio
        with (
            TestServer(responder=RESPONDER, latency_ms=args.fast_ms, cwd=ROOT) as fast,
            TestServer(responder=RESPONDER, latency_ms=slow_ms, cwd=ROOT) as slow,
        ):
            add_models(base, {"fast": fast.base_url, "slow": slow.base_url}, args.items)
            sh(["git", "add", "-A"], base, env)
            sh(["git", "-c", "user.name=p", "-c", "user.email=p@p", "commit", "-qm", "models"],
               base, env)  # fmt: skip
            parallel, serial = work / "parallel", work / "serial"
            copy_project(base, parallel)
            copy_project(base, serial)
            out["parallel"] = watch(parallel, env, args.jobs)
            print(f"parallel: {json.dumps(out['parallel'])}", file=sys.stderr, flush=True)
            if not args.skip_serial:
                t = time.monotonic()
                sh(["dvc", "repro", *TARGETS], serial, env)
                out["serial_s"] = round(time.monotonic() - t, 1)
                out["same_as_serial"] = same_files(serial, parallel)
    finally:
        out["total_s"] = round(time.monotonic() - t_all, 1)
        out["loadavg_after"] = os.getloadavg()
        if args.keep:
            out["scratch"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    p = out.get("parallel", {})
    print(
        f"two models on {args.items} Long2RAG questions ({SETTING}), fast {args.fast_ms:.0f} ms"
        f" and slow {args.fast_ms * args.ratio:.0f} ms per answer, one at a time;"
        f" base pipeline {out.get('base_s')} s; total {out['total_s']} s"
    )
    print(f"  lfbench repro --jobs {args.jobs}: {p.get('seconds')} s (rc {p.get('rc')})")
    own = p.get("fast_own_s")
    print(f"  fast model's own stages: {own} s {p.get('fast_stages_s')}")
    f = p.get("fast") or {}
    ended = p.get("fast_results_ended_s")
    print(
        f"  fast's rows in results/ and its runs in MLflow: at {ended} s of the run (its results"
        f" stage ended; {f.get('rows')} rows, {f.get('mlflow_runs')} current MLflow runs);"
        f" seen by this script at {f.get('seen_at_s')} s, slow still generating:"
        f" {f.get('slow_generating')}"
    )
    for k in ("compare", "audit"):
        r = f.get(k) or {}
        print(
            f"  lfbench {k} on fast, started then: rc {r.get('rc')}, answered at"
            f" {r.get('answered_at_s')} s ({r.get('s')} s for the command)"
        )
    if ended and own:
        print(f"  rows and runs available / own stages = {ended / own:.2f} (goal <= 2)")
        answered = max((f.get(k) or {}).get("answered_at_s") or 0 for k in ("compare", "audit"))
        print(f"  compare and audit answered / own stages = {answered / own:.2f}")
    print(
        f"  slow: generate ended {p.get('slow_generate_ended_s')} s, results"
        f" {p.get('slow_results_ended_s')} s; aggregate ended {p.get('aggregate_ended_s')} s"
    )
    d = p.get("during") or {}
    if d:
        print(f"  during the run (from {d.get('at_s')} s, while the slow model generates):")
        for k in ("plan", "compare", "status", "dvc_status"):
            r = d.get(k) or {}
            print(
                f"    {k}: rc {r.get('rc')}, {r.get('s')} s"
                f" (answered at {r.get('answered_at_s')} s)"
            )
        print("    status: " + " | ".join((d.get("status") or {}).get("out", "").splitlines()[:2]))
    same = out.get("same_as_serial")
    if same is not None:
        print(
            f"  metrics/, reports/, results/ byte-identical to serial dvc repro"
            f" ({out.get('serial_s')} s): {all(same.values())} ({len(same)} files)"
        )
        for f, ok in same.items():
            if not ok:
                print(f"    differs: {f}")


if __name__ == "__main__":
    main()
