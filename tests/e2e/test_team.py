"""A team on one host, as `lfbench team up` starts it: PostgreSQL (MLflow's runs and the shared
response cache), SeaweedFS (S3: MLflow's artifacts and the DVC remote) and the MLflow server.

Two workspaces run `dvc repro` at the same moment on overlapping model sets (A: tiny-a and
tiny-shared, B: tiny-shared and tiny-b) against the OpenAI-compatible test server, logging to the
one MLflow server and sharing the one response cache: every request body is served once, and
every result is exactly one current MLflow run. Both push to the S3 remote with their run cache.
A third workspace (B's commit) pulls and reproduces with no stage run and no model call; a fourth
(A's commit, switched to B's models) gets B's model stages from the shared run cache, with no
model call. The default local-folder remote serves a fifth the same bytes; a wrong S3 key is
refused, and no key reaches `.dvc/config`. Then the two workspaces sync their results into the
server at once, and two fresh syncs race on a new experiment: one current run per row, no
traceback. (This replaces the two-clone sharing test: every check it made is here.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import (
    ROOT,
    SUMMHAY_TARGETS,
    list_entries,
    run,
    run_env,
    slice_crud_rag,
    slice_crux,
)
from tests.stages.test_tracking import _syncs_at_once, check_one_current_run_per_row

pytestmark = pytest.mark.slow

KEY_ENV = "LFBENCH_TEST_API_KEY"
MODELS_A = ["tiny-a", "tiny-shared"]
MODELS_B = ["tiny-shared", "tiny-b"]


# The workspaces reproduce SummHay's stages only: they pull those and what they depend on.
PULL = ("--with-deps", *SUMMHAY_TARGETS)


def _read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


@pytest.fixture(scope="module")
def team() -> Iterator[dict[str, str]]:
    folder = Path(tempfile.mkdtemp(prefix="lfbench-team-"))
    start = time.monotonic()
    run(["lfbench", "team", "up", "--dir", str(folder), "--seaweedfs"], ROOT)
    print(f"lfbench team up: {time.monotonic() - start:.1f} s")
    env = {**_read_env(folder / "team.env"), **_read_env(folder / "secrets.env")}
    assert (folder / "secrets.env").stat().st_mode & 0o077 == 0  # the keys: owner only
    assert "PGPASSWORD" not in (folder / "team.env").read_text()
    try:
        yield env
    finally:
        run(["lfbench", "team", "down", "--dir", str(folder)], ROOT, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _configure(ws: Path, base_url: str, models: list[str], team: dict[str, str]) -> None:
    path = ws / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 10,
    }
    params["runtime"] = "local"
    lead = {k: v for k, v in params["models"].items() if v["provider"] == "long2rag-lead"}
    overlap = {k: v for k, v in params["judges"].items() if v["provider"] == "long2rag-overlap"}
    local = params["judges"]["local"]
    local["train"]["haystacks"] = ["news1"]
    params["long2rag"]["derived"].update(haystacks=["news1"], subtopics=1)
    params["long2rag"]["models"] = list(lead)
    params["long2rag"]["judges"] = list(overlap)
    params["models"] = lead | {
        m: {**endpoint, "model": m, "settings": ["oracle"], "price_input_per_1m": 1.0}
        for m in sorted({*MODELS_A, *MODELS_B})
    }
    params["judges"] = overlap | {
        "local": local,
        "llm": {**endpoint, "model": "tiny-judge", "mode": "batched"},
    }
    slice_crux(params)
    slice_crud_rag(params)
    params["summhay"]["haystacks"] = ["news1"]
    params["summhay"]["lengths"]["haystacks"] = []
    params["summhay"]["subtopics"] = 2
    params["summhay"]["models"] = models
    params["summhay"]["judges"] = ["llm"]
    params["summhay"]["agreement"] = {"max_samples": 4, "bootstrap_resamples": 20}
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    list_entries(ws)
    run(["dvc", "remote", "add", "-d", "-f", "team-s3", team["LFBENCH_TEAM_DVC_REMOTE"]], ws)
    run(["dvc", "remote", "modify", "team-s3", "endpointurl", team["LFBENCH_TEAM_S3_ENDPOINT"]], ws)


def _commit(ws: Path, msg: str) -> None:
    run(["git", "add", "-A"], ws)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg], ws)


def _ran(out: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", out)


def _outputs(ws: Path, folders: tuple[str, ...]) -> dict[str, bytes]:
    out = {}
    for folder in folders:
        for f in sorted((ws / folder).rglob("*")):
            if f.is_file() and f.name != ".gitignore":
                out[str(f.relative_to(ws))] = f.read_bytes()
    return out


def _usage(ws: Path, rel: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ws / rel).read_text())
    return data


def test_two_workspaces_one_server_one_cache_one_remote(
    project: Path, tmp_path: Path, mirror: Path, team: dict[str, str]
) -> None:
    from mlflow.tracking import MlflowClient

    origin = tmp_path / "origin.git"
    run(["git", "clone", "-q", "--bare", str(project), str(origin)], tmp_path)
    env = {**team, KEY_ENV: "sk-lfbench-team-" + uuid.uuid4().hex}
    with TestServer(
        responder="tests.e2e.summhay_responder:respond",
        latency_ms=40,
        log_path=tmp_path / "llm.log",
        cwd=ROOT,
    ) as srv:
        ws = {}
        for name, models in (("a", MODELS_A), ("b", MODELS_B)):
            w = tmp_path / name
            run(["git", "clone", "-q", str(origin), str(w)], tmp_path)
            run(["lfbench", "data", "fetch", "--mirror", str(mirror)], w)
            _configure(w, srv.base_url, models, team)
            _commit(w, f"workspace {name}")
            ws[name] = w

        # ---- A and B at the same moment
        start = time.monotonic()
        procs = {
            n: subprocess.Popen(
                ["dvc", "repro", *SUMMHAY_TARGETS],
                cwd=w,
                env=run_env(env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n, w in ws.items()
        }
        outs = {n: p.communicate(timeout=1200)[0] for n, p in procs.items()}
        wall = time.monotonic() - start
        for n, p in procs.items():
            assert p.returncode == 0, outs[n][-4000:]
        log = srv.log()
        served = Counter(r["body_sha256"] for r in log if r["served"])
        assert served and max(served.values()) == 1, "a request was sent twice"
        calls = len(log)

        # the shared model's generations: sent once between them, the rest from the cache
        gen = "generations/summhay/tiny-shared.usage.json"
        ua, ub = _usage(ws["a"], gen), _usage(ws["b"], gen)
        assert ua["items"] == ub["items"] > 0
        assert ua["requests_sent"] + ub["requests_sent"] == ua["items"]
        assert ua["cache_hits"] + ub["cache_hits"] == ua["items"]
        shared_gen = [r for r in log if r["served"] and r.get("model") == "tiny-shared"]
        assert len(shared_gen) == ua["items"]
        for n in ws:
            assert (ws[n] / gen).exists()
        assert _outputs(ws["a"], ("generations/summhay/tiny-shared.jsonl",)) == _outputs(
            ws["b"], ("generations/summhay/tiny-shared.jsonl",)
        )

        # ---- the one MLflow server: each result exactly one current run
        client = MlflowClient(team["MLFLOW_TRACKING_URI"])
        exp = client.get_experiment_by_name("summhay")
        current = client.search_runs(
            [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
        )
        per_row = Counter(r.data.tags["lfbench.row_key"] for r in current)
        assert per_row and set(per_row.values()) == {1}
        rows = {
            n: json.loads((w / "metrics/summhay.json").read_text())["rows"] for n, w in ws.items()
        }
        assert {r.data.tags["model.entry"] for r in current} >= {*MODELS_A, *MODELS_B}
        # the shared model's rows are one run, not one per workspace
        shared_rows = [r for r in current if r.data.tags["model.entry"] == "tiny-shared"]
        assert len(shared_rows) == sum(1 for r in rows["a"] if r["model"] == "tiny-shared")
        assert len(per_row) < len(rows["a"]) + len(rows["b"])
        run_ = current[0]
        assert run_.inputs.dataset_inputs, "the run's dataset is logged (UI's Dataset column)"
        assert run_.data.tags["mlflow.source.git.commit"] == run_.data.tags["git.commit"]

        # ---- both push, with their run cache
        for n, w in ws.items():
            _commit(w, f"results {n}")
            run(["dvc", "push", "--run-cache"], w, env=env)
        run(["git", "push", "-q", "origin", "HEAD:main"], ws["a"])
        run(["git", "push", "-q", "origin", "HEAD:b"], ws["b"])

        # ---- C: B's commit, a fresh workspace: nothing runs, nothing is asked of a model
        c = tmp_path / "c"
        run(["git", "clone", "-q", "-b", "b", str(origin), str(c)], tmp_path)
        run(["dvc", "pull", *PULL], c, env=env)
        again = run(["dvc", "repro", *SUMMHAY_TARGETS], c, env=env)
        assert _ran(again.stdout) == [], again.stdout
        assert len(srv.log()) == calls
        folders = ("metrics", "generations", "judgements", "datasets")
        assert _outputs(c, folders) == _outputs(ws["b"], folders)

        # ---- the default local-folder remote (`team`), pointed at a folder, serves as well
        folder_remote = tmp_path / "team-folder"
        run(["dvc", "remote", "modify", "--local", "team", "url", str(folder_remote)], ws["b"])
        run(["dvc", "push", "-r", "team"], ws["b"])
        e = tmp_path / "e"
        run(["git", "clone", "-q", "-b", "b", str(origin), str(e)], tmp_path)
        run(["dvc", "remote", "modify", "--local", "team", "url", str(folder_remote)], e)
        run(["dvc", "pull", "-r", "team", *PULL], e)
        status = run(["dvc", "status", *SUMMHAY_TARGETS], e).stdout
        assert "Data and pipelines are up to date" in status
        assert _outputs(e, folders) == _outputs(ws["b"], folders)
        # the keys stay in the environment; a wrong one is refused by the store
        for w in ws.values():
            config = (w / ".dvc" / "config").read_text()
            assert team["AWS_SECRET_ACCESS_KEY"] not in config
            assert team["AWS_ACCESS_KEY_ID"] not in config
        denied = run(
            ["dvc", "pull", *PULL], e, env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"}, check=False
        )
        assert denied.returncode != 0

        # ---- D: A's commit switched to B's models: B's model stages come from the run cache
        d = tmp_path / "d"
        run(["git", "clone", "-q", "-b", "main", str(origin), str(d)], tmp_path)
        run(["dvc", "pull", "--run-cache", *PULL], d, env=env)  # A's outputs, everyone's run cache
        shutil.copy2(ws["b"] / "params.yaml", d / "params.yaml")
        restored = run(["dvc", "repro", "--pull", *SUMMHAY_TARGETS], d, env=env)
        ran = _ran(restored.stdout)
        # a stage with a git-tracked metrics file (cache: false) has no run-cache entry: only
        # those (no model in them) run again
        # (and the per-model results stages, persistent outputs too: they call no model)
        assert all(s.endswith(("-aggregate", "-agreement")) or "-results@" in s for s in ran), ran
        assert "summhay-generate@tiny-b" not in ran and "summhay-judge@tiny-b-llm" not in ran
        assert len(srv.log()) == calls, "the run cache should have spared every model call"
        # B's own model: its files, as B made them (the shared model's usage files are A's:
        # A and B split its requests differently)
        mine = ("generations/summhay", "judgements/summhay/tiny-b")
        got, want = _outputs(d, mine), _outputs(ws["b"], mine)
        same = [k for k in want if "tiny-b" in k or k.endswith(".jsonl")]
        assert len([k for k in same if "tiny-b" in k]) == 4
        assert {k: got.get(k) for k in same} == {k: want[k] for k in same}

        # ---- the two workspaces sync their results into the filled server at once
        syncs = {
            n: subprocess.Popen(
                ["lfbench", "track", "summhay"],
                cwd=w,
                env=run_env(env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n, w in ws.items()
        }
        for p in syncs.values():
            out = p.communicate(timeout=600)[0]
            assert p.returncode == 0 and "Traceback" not in out, out[-3000:]
        current = client.search_runs(
            [exp.experiment_id], "tags.`lfbench.current` = 'true'", max_results=5000
        )
        assert Counter(r.data.tags["lfbench.row_key"] for r in current) == per_row
        assert len(srv.log()) == calls  # syncing asks no model

    # ---- two syncs racing on a fresh experiment of the server
    fresh = _syncs_at_once(tmp_path / "fresh", 20, ("1", "1"), env=team)
    check_one_current_run_per_row(client, fresh, 20)
    print(
        f"A and B at once: {wall:.1f} s, {calls} model requests, none twice; "
        f"tiny-shared: A sent {ua['requests_sent']}, waited {ua.get('waited')}; "
        f"B sent {ub['requests_sent']}, waited {ub.get('waited')}; "
        f"{len(per_row)} current runs; D ran {ran}"
    )
