"""`lfbench repro --jobs` and `--cluster` on the real pipeline: two models and an LLM judge
behind the OpenAI-compatible test server (real HTTP), SummHay's stages.

- Side by side on one machine: dvc.lock, every metrics file and the .gitignore lines are the
  bytes a serial `dvc repro` writes; `dvc status` is clean; every MLflow row has one current
  run; the server answered every request body once.
- On a Dask cluster on loopback (a scheduler, two `lfbench worker`s each in its own clone, one
  DVC remote folder with the run cache, one MLflow store, one response cache): the driver's
  workspace ends with the same bytes, restored from the remote (its own logs show no stage ran
  there), both workers ran stages, and every body was served once.
- A worker killed (SIGKILL) while its stage is sending: Dask retries the stage on the other
  worker, which sends no request the killed one had finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import BIN, ROOT, SUMMHAY_TARGETS, make_project, run, run_env

pytestmark = pytest.mark.slow

RESPONDER = "tests.e2e.summhay_responder:by_model"


def _configure(proj: Path, base_url: str) -> None:
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": None,
        "max_concurrency": 2,
        "timeout_s": 20,
    }
    params["runtime"] = "local"
    local = params["judges"]["local"]
    local["train"]["haystacks"] = ["news1"]
    params["models"] = {
        m: {**endpoint, "model": m, "settings": ["oracle", "bm25"]} for m in ("m1", "m2", "slow")
    }
    params["judges"] = {"local": local, "llm": {**endpoint, "model": "judge", "mode": "batched"}}
    s = params["summhay"]
    s.update(haystacks=["news1"], subtopics=3, models=["m1", "m2"], judges=["llm"])
    s["lengths"]["haystacks"] = []
    s["agreement"].update(max_samples=3, bootstrap_resamples=20, llm_max_samples=2)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def _commit(ws: Path, msg: str) -> None:
    run(["git", "add", "-A"], ws)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg], ws)


def _clone(base: Path, dest: Path, mirror: Path, env: dict[str, str]) -> Path:
    run(["git", "clone", "-q", str(base), str(dest)], dest.parent)
    run(["lfbench", "data", "fetch", "--mirror", str(mirror)], dest, env)
    return dest


def _outputs(ws: Path) -> dict[str, Any]:
    """dvc.lock's entries (each as its exact YAML text), the metrics files' bytes and the lines
    of every .gitignore DVC writes. A serial `dvc repro` appends new stages to dvc.lock (and
    their outputs to .gitignore files) in an order that changes with Python's hash seed, so
    the order of new entries and lines is compared apart (`lfbench repro` writes dvc.yaml's)."""
    lock = yaml.safe_load((ws / "dvc.lock").read_text())["stages"]
    out: dict[str, Any] = {
        f"dvc.lock:{name}": yaml.safe_dump(entry, sort_keys=False) for name, entry in lock.items()
    }
    for p in sorted((ws / "metrics").glob("*.json")):
        out[str(p.relative_to(ws))] = p.read_bytes()
    for p in sorted(ws.rglob(".gitignore")):
        if ".dvc" not in p.parts and ".lfbench" not in p.parts:
            out[str(p.relative_to(ws))] = sorted(p.read_text().splitlines())
    return out


def _declared_order(ws: Path) -> bool:
    """dvc.lock's entries in dvc.yaml's order (`dvc stage list`)."""
    lock = list(yaml.safe_load((ws / "dvc.lock").read_text())["stages"])
    listed = [ln.split()[0] for ln in run(["dvc", "stage", "list"], ws).stdout.splitlines()]
    ranks = [listed.index(n) for n in lock]
    return ranks == sorted(ranks)


def _served(server: TestServer, since: int = 0) -> Counter[str]:
    return Counter(r["body_sha256"] for r in server.log()[since:] if r.get("served"))


def _current_runs(uri: str) -> Counter[tuple[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    out: Counter[tuple[str, str]] = Counter()
    for exp in client.search_experiments():
        for r in client.search_runs(
            [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
        ):
            out[(exp.name, r.data.tags["lfbench.row_key"])] += 1
    return out


# the lineage an aggregate gives each MLflow run that a parallel run must give as a serial one
# does (the stage digests read from dvc.lock: a stage's upstream entries written before it starts)
LINEAGE = (
    "dvc.stage_md5",
    "dvc.generate_stage_md5",
    "dvc.construct_stage_md5",
    "model.entry_sha",
    "judge.entry_sha",
    "judge.prompt_sha",
    "dataset.digest",
)


def _lineage(uri: str) -> dict[tuple[str, str], dict[str, str | None]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    out = {}
    for exp in client.search_experiments():
        for r in client.search_runs(
            [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
        ):
            tags = r.data.tags
            out[(exp.name, tags["lfbench.row_key"])] = {k: tags.get(k) for k in LINEAGE}
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, mirror: Path) -> Iterator[dict[str, Any]]:
    """The test server, a base project (committed) and a serial `dvc repro` of it."""
    work = tmp_path_factory.mktemp("parallel")
    with TestServer(
        responder=RESPONDER, latency_ms=200, log_path=work / "server.log", cwd=ROOT
    ) as server:
        base = make_project(work / "base", mirror)
        _configure(base, server.base_url)
        _commit(base, "models")
        env = run_env({"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'serial-mlflow.db'}"})
        serial = _clone(base, work / "serial", mirror, env)
        run(["dvc", "repro", *SUMMHAY_TARGETS], serial, env)
        yield {
            "work": work,
            "base": base,
            "server": server,
            "serial": serial,
            "mirror": mirror,
            "serial_uri": env["MLFLOW_TRACKING_URI"],
        }


def test_side_by_side_writes_what_serial_dvc_repro_writes(setup: dict[str, Any]) -> None:
    work, server = setup["work"], setup["server"]
    uri = f"sqlite:///{work / 'par-mlflow.db'}"
    env = run_env({"MLFLOW_TRACKING_URI": uri})
    par = _clone(setup["base"], work / "par", setup["mirror"], env)
    since = len(server.log())
    proc = run(["lfbench", "repro", "--jobs", "6", *SUMMHAY_TARGETS], par, env)
    assert "failed" not in proc.stderr
    assert _outputs(par) == _outputs(setup["serial"])
    assert _declared_order(par)
    status = run(["dvc", "status", *SUMMHAY_TARGETS], par, env).stdout
    assert "Data and pipelines are up to date" in status
    served = _served(server, since)
    assert served and max(served.values()) == 1  # every body once
    runs = _current_runs(uri)
    assert runs and set(runs.values()) == {1}
    rows = json.loads((par / "metrics" / "summhay.json").read_text())["rows"]
    assert sum(1 for k in runs if k[0] == "summhay") == len(rows)
    lineage, serial = _lineage(uri), _lineage(setup["serial_uri"])
    assert lineage == serial
    # the benchmarks' rows carry their judge stage's digest (agreement rows have none)
    digests = [v["dvc.stage_md5"] for k, v in lineage.items() if k[0] == "summhay"]
    assert len(digests) == len(rows) and "unknown" not in digests and None not in digests


@contextlib.contextmanager
def _cluster(work: Path, env: dict[str, str], clones: list[Path]) -> Iterator[dict[str, Any]]:
    """A scheduler on 127.0.0.1 and one `lfbench worker` per clone."""
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    sched_file = work / "scheduler.json"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    procs["scheduler"] = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--scheduler-file", str(sched_file), "--no-dashboard"],
        cwd=work, env=env, stdout=(logs / "scheduler.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for clone in clones:
            procs[clone.name] = subprocess.Popen(
                ["lfbench", "worker", address, "--clone", str(clone), "--jobs", "3",
                 "--name", clone.name],
                cwd=clone, env=env, stdout=(logs / f"{clone.name}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        from distributed import Client

        with Client(address, timeout="60s") as c:
            c.wait_for_workers(len(clones), timeout=120)
        yield {"address": address, "procs": procs, "logs": logs}
    finally:
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _team(
    work: Path, base: Path, mirror: Path, names: list[str]
) -> tuple[dict[str, str], list[Path]]:
    """Clones sharing one DVC remote folder, one MLflow store and one response cache (what
    `lfbench team up` gives machines, on one host)."""
    env = run_env(
        {
            "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
            "LFBENCH_CACHE_URL": f"sqlite:///{work / 'llm.sqlite'}",
            "LFBENCH_CACHE_LEASE_S": "5",
        }
    )
    clones = []
    for name in names:
        clone = _clone(base, work / name, mirror, env)
        run(["dvc", "remote", "add", "--local", "-d", "-f", "team", str(work / "remote")], clone)
        clones.append(clone)
    return env, clones


def _ran_in(clone: Path) -> set[str]:
    return {p.stem for p in (clone / ".lfbench" / "logs").glob("*.log")}


def _change_m1(ws: Path) -> None:
    """m1's entry changed for a stage already in dvc.lock: a slice of 2 subtopics (it ran on
    all 3) and another temperature."""
    path = ws / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["models"]["m1"].update(slice={"summhay": {"first": 2}}, temperature=0.3)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


M1_FILES = ("generations/summhay/m1.jsonl", "generations/summhay/m1.usage.json")


def test_a_cluster_of_two_workers_gives_the_same_bytes(setup: dict[str, Any]) -> None:
    work = setup["work"] / "cluster"
    work.mkdir()
    server = setup["server"]
    env, (driver, w1, w2) = _team(work, setup["base"], setup["mirror"], ["driver", "w1", "w2"])
    since = len(server.log())
    with _cluster(work, env, [w1, w2]) as c:
        proc = run(
            ["lfbench", "repro", "--jobs", "6", "--cluster", c["address"], *SUMMHAY_TARGETS],
            driver,
            env,
        )
        assert "failed" not in proc.stderr, proc.stderr
        assert _outputs(driver) == _outputs(setup["serial"])
        assert _declared_order(driver)
        status = run(["dvc", "status", *SUMMHAY_TARGETS], driver, env).stdout
        assert "Data and pipelines are up to date" in status
        assert not _ran_in(driver)  # nothing ran in the driver's workspace
        assert _ran_in(w1) and _ran_in(w2)  # both workers did some
        served = _served(server, since)
        assert served and max(served.values()) == 1
        runs = _current_runs(env["MLFLOW_TRACKING_URI"])
        assert runs and set(runs.values()) == {1}
        # the aggregate on a worker read the stage digests the driver's dvc.lock had then
        assert _lineage(env["MLFLOW_TRACKING_URI"]) == _lineage(setup["serial_uri"])
        # the runs belong to the driver's workspace (it retires what it no longer produces)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        exp = client.get_experiment_by_name("summhay")
        owners = {
            r.data.tags["lfbench.workspace"]
            for r in client.search_runs([exp.experiment_id], "tags.`lfbench.current` = 'true'")
        }
        assert owners == {(driver / ".lfbench" / "workspace").read_text().strip()}

        # m1's entry changes for stages already in dvc.lock: the workers run them again (the
        # bug: a worker "restored" the old outputs, 3 subtopics where the slice says 2, under
        # the new params), as `--jobs` does in a copy of the serial workspace
        before = {rel: (driver / rel).read_bytes() for rel in M1_FILES}
        _change_m1(driver)
        since = len(server.log())
        proc = run(
            ["lfbench", "repro", "--jobs", "6", "--cluster", c["address"], *SUMMHAY_TARGETS],
            driver,
            env,
        )
        assert "failed" not in proc.stderr, proc.stderr
        by_cluster = _served(server, since)
    jobs = setup["work"] / "jobs-after-change"
    shutil.copytree(setup["serial"], jobs, symlinks=True)
    _change_m1(jobs)
    since = len(server.log())
    jobs_env = run_env({"MLFLOW_TRACKING_URI": f"sqlite:///{setup['work'] / 'jobs-mlflow.db'}"})
    run(["lfbench", "repro", "--jobs", "6", *SUMMHAY_TARGETS], jobs, jobs_env)
    by_jobs = _served(server, since)
    assert by_cluster and by_cluster == by_jobs  # the same requests, each once
    assert _outputs(driver) == _outputs(jobs)
    for rel in M1_FILES:
        assert (driver / rel).read_bytes() == (jobs / rel).read_bytes(), rel
        assert (driver / rel).read_bytes() != before[rel], rel
    gens = (driver / M1_FILES[0]).read_text().splitlines()
    assert len(gens) == 4  # 2 subtopics x 2 settings
    sha = json.loads((driver / M1_FILES[1]).read_text())["entry_sha"]
    assert sha != json.loads(before[M1_FILES[1]])["entry_sha"]
    status = run(["dvc", "status", *SUMMHAY_TARGETS], driver, env).stdout
    assert "Data and pipelines are up to date" in status


def test_a_killed_worker_s_stage_is_retried_elsewhere_without_paying_twice(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    """The slow model's generate stage (6 requests, 3 s each, 2 at a time) is running on a
    worker when that worker is killed: Dask runs it again on the other, which takes the answers
    the killed one finished from the shared response cache. (The 2 requests in flight at the
    kill were not finished: the new worker sends them once their claims run out.)"""
    with TestServer(
        responder=RESPONDER, latency_ms=3000, log_path=tmp_path / "slow.log", cwd=ROOT
    ) as slow:
        base = tmp_path / "base"
        shutil.copytree(setup["base"], base, symlinks=True)
        params = yaml.safe_load((base / "params.yaml").read_text())
        params["models"]["slow"]["base_url"] = slow.base_url
        params["summhay"]["models"] = ["slow"]
        (base / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        _commit(base, "the slow model")
        work = tmp_path / "cluster"
        work.mkdir()
        env, (driver, w1, w2) = _team(work, base, setup["mirror"], ["driver", "w1", "w2"])
        stage = "summhay-generate@slow"
        with _cluster(work, env, [w1, w2]) as c:
            repro = subprocess.Popen(
                ["lfbench", "repro", "--jobs", "6", "--cluster", c["address"], stage],
                cwd=driver, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            deadline = time.monotonic() + 600
            victim = None
            while time.monotonic() < deadline and victim is None:
                served = sum(1 for r in slow.log() if r.get("served"))
                for w in (w1, w2):
                    if stage in _ran_in(w) and served >= 2:
                        victim = w
                time.sleep(0.2)
            assert victim is not None, "the stage never started"
            finished_before_kill = {r["body_sha256"] for r in slow.log() if r.get("served")}
            os.kill(c["procs"][victim.name].pid, signal.SIGKILL)
            _, err = repro.communicate(timeout=600)
        assert repro.returncode == 0, err
        other = w2 if victim is w1 else w1
        assert stage in _ran_in(other)
        served = Counter(r["body_sha256"] for r in slow.log() if r.get("served"))
        assert finished_before_kill and all(served[b] == 1 for b in finished_before_kill)
        gens = (driver / "generations" / "summhay" / "slow.jsonl").read_text().splitlines()
        assert len(gens) == 6  # 3 subtopics x 2 settings, all there
        assert "Data and pipelines are up to date" in run(["dvc", "status", stage], driver).stdout
