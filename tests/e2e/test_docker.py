"""Stages in the pinned image: same numbers as a local run, lineage, the environment allow-list.

Needs a Docker engine and a base image present locally (no registry is reachable here), named
in params `image_base`: $LFBENCH_TEST_BASE_IMAGE, else `lfbench-base:bookworm` (made by
scripts/build-base-image.sh; .ci/run builds it). Skipped, with the reason, otherwise.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.env import containers
from pipeline.env import image as img
from tests.conftest import (
    ROOT,
    SUMMHAY_TARGETS,
    run,
    share_dvc_cache,
    slice_crud_rag,
    slice_crux,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _base_image() -> str:
    return os.environ.get("LFBENCH_TEST_BASE_IMAGE") or "lfbench-base:bookworm"


@pytest.fixture(scope="module")
def engine() -> Any:
    client = containers.docker_client()
    if client is None:
        pytest.skip("no Docker engine answers (DOCKER_HOST / /var/run/docker.sock)")
    import docker.errors

    try:
        client.images.get(_base_image())
    except docker.errors.ImageNotFound:
        pytest.skip(
            f"base image {_base_image()} is not present locally (no registry here): "
            "run scripts/build-base-image.sh or set LFBENCH_TEST_BASE_IMAGE"
        )
    return client


@pytest.fixture(scope="module")
def image(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recipe of the working tree (Dockerfile, .dockerignore, locks) on the test base, and
    its image, built here unless present: the recipe of every project these tests copy."""
    ctx = tmp_path_factory.mktemp("ctx")
    for name in img.RECIPE_FILES:
        shutil.copy2(ROOT / name, ctx / name)
    rec = img.recipe(ctx, _base_image())
    found = img.find_image(engine, rec)
    if found is None:
        found = img.build_image(ctx, rec, client=engine)
    return {**rec, "image_id": found}


@pytest.fixture(scope="module")
def image_id(image: dict[str, Any]) -> str:
    return str(image["image_id"])


def _params(proj: Path, runtime: str) -> None:
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["runtime"] = runtime
    params["image_base"] = _base_image()  # the air-gapped base: no registry is reachable here
    params["summhay"]["haystacks"] = ["news1"]
    params["summhay"]["lengths"]["haystacks"] = []  # no length study here
    params["models"]["published"]["systems"] = ["gpt-4o"]
    params["models"]["published"]["settings"] = ["oracle", "full"]
    params["long2rag"]["derived"].update(haystacks=["news1"], subtopics=2)
    # The local judge (trained on one haystack, to stay quick) judges in both runtimes, so its
    # numbers must match too; the baselines are left out.
    params["summhay"]["models"] = ["published"]
    params["summhay"]["judges"] = ["published-gpt-4o", "local"]
    params["summhay"]["agreement"]["bootstrap_resamples"] = 50
    params["judges"]["local"]["train"]["haystacks"] = ["news1"]
    params["long2rag"]["models"] = ["lead"]
    params["long2rag"]["judges"] = ["local"]
    slice_crux(params, judges=("crux-labels", "local"))
    slice_crud_rag(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    run(["git", "add", "-A"], proj)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", runtime], proj)


def _records(proj: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name.split("-")[0]: json.loads(p.read_text())
        for p in sorted((proj / ".lfbench" / "stages").glob("*.json"))
    }


def test_docker_by_default_and_local_give_identical_results(
    engine: Any,
    image: dict[str, Any],
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default `runtime: auto` with an engine runs every stage in the recipe's image; without
    an engine the same params run locally, warned once. Same outputs, same dvc.lock. Then a
    colleague's clone gets data and image from the DVC remote and runs in the same image id.

    Both runs compute every stage (`--no-run-cache`) and save what they ran in the session's
    shared DVC cache, where the next test of this file finds the local judge it trained."""
    share_dvc_cache(project)
    local = tmp_path / "local"
    shutil.copytree(project, local, symlinks=True)
    _params(project, "auto")
    _params(local, "auto")

    out = run(["dvc", "repro", "--no-run-cache"], project)
    # the runtime is decided, and said, once per dvc repro (the first stage); every stage's
    # record below shows it ran in that image
    said = re.findall(r"stage (\S+): runtime (\S+) \((.*)\)", out.stderr)
    assert len(said) == 1 and said[0][1] == "docker", out.stderr[-3000:]
    assert said[0][2] == f"auto: image {image['image_id'][:19]} (present)"
    dead = {"DOCKER_HOST": f"unix://{tmp_path / 'dead.sock'}"}
    out_local = run(["dvc", "repro", "--no-run-cache"], local, dead)
    assert out_local.stderr.count("stages of this run go local") == 1, out_local.stderr[-3000:]

    for rel in (
        "dvc.lock",
        "build/image.json",
        "metrics/summhay.json",
        "metrics/summhay.summary.json",
        "reports/summhay.md",
        "metrics/agreement.json",
        "metrics/local_judge.json",
        "models/local-judge/model.json",
        "metrics/long2rag.json",
        "reports/long2rag.md",
        "metrics/crux.json",
        "reports/crux.md",
        "reports/crux.png",
        "metrics/crud_rag.json",
        "reports/crud_rag.md",
    ):
        assert (project / rel).read_bytes() == (local / rel).read_bytes(), rel

    recipe = json.loads((project / "build" / "image.json").read_text())
    assert recipe["recipe"] == image["recipe"] and recipe["base_image"] == _base_image()

    docker_records, local_records = _records(project), _records(local)
    assert set(docker_records) == set(local_records)
    assert {"construct", "generate", "judge", "agreement", "aggregate"} <= set(docker_records)
    for rec in docker_records.values():
        assert rec["runtime"] == "docker" and rec["image_digest"] == image["image_id"]
        assert rec["image_recipe"] == image["recipe"]
        assert HEX64.match(rec["container_id"]), rec
        assert rec["python"] == "/opt/lfbench/bin/python"
        assert (rec["uid"], rec["gid"]) == (os.getuid(), os.getgid())
    for rec in local_records.values():
        assert rec["runtime"] == "local" and rec["container_id"] is None
        assert rec["image_digest"] is None and rec["image_recipe"] == image["recipe"]

    # Files the containers wrote belong to the caller.
    for rel in ("datasets/summhay.jsonl", "metrics/summhay.json", "mlruns/mlflow.db"):
        st = (project / rel).stat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()), rel

    from mlflow.tracking import MlflowClient

    from pipeline.stages.tracking import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for proj, runtime, digest in ((project, "docker", image["image_id"]), (local, "local", "none")):
        client = MlflowClient(tracking_uri=tracking_uri(proj))
        exp = client.get_experiment_by_name("summhay")
        runs = client.search_runs([exp.experiment_id])
        n_rows = len(json.loads((proj / "metrics" / "summhay.json").read_text())["rows"])
        assert len(runs) == n_rows == 4  # gpt-4o x (oracle, full) x (published-gpt-4o, local)
        for r in runs:
            assert r.data.tags["runtime"] == runtime
            assert r.data.tags["image.digest"] == digest
            assert r.data.tags["image.recipe"] == image["recipe"]

    # Nothing left to do in either, and no container left behind.
    for proj in (project, local):
        assert "Data and pipelines are up to date" in run(["dvc", "status"], proj).stdout
    assert not engine.containers.list(all=True, filters={"ancestor": image["image_id"]})

    # ---- A colleague: clone B of this commit, on an engine without the image (its name is
    # removed here; another tag keeps the layers, as a machine that has the base would). Data
    # and image come from the shared DVC remote: `dvc repro` runs nothing, and a forced stage
    # runs in A's image id, loaded, not built.
    remote = tmp_path / "remote"
    run(["dvc", "remote", "modify", "--local", "team", "url", str(remote)], project)
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results"], project)
    run(["dvc", "push"], project)
    pushed = run(["lfbench", "image", "push", "--dvc"], project)
    assert f"lfbench-images/{image['recipe']}.tar" in pushed.stdout
    b = tmp_path / "b"
    run(["git", "clone", "-q", str(project), str(b)], tmp_path)
    run(["dvc", "remote", "modify", "--local", "team", "url", str(remote)], b)
    engine.images.get(image["image_id"]).tag("lfbench-test-keep", image["recipe"][:12])
    engine.images.remove(image["tag"])
    assert img.find_image(engine, image) is None
    run(["dvc", "pull"], b)
    nothing = run(["dvc", "repro"], b)
    assert "Running stage" not in nothing.stdout, nothing.stdout
    forced = run(["dvc", "repro", "-f", "-s", "summhay-aggregate"], b)
    assert f"auto: image {image['image_id'][:19]} (pulled from the DVC remote)" in forced.stderr
    assert "building" not in forced.stderr
    (rec,) = _records(b).values()
    assert rec["runtime"] == "docker" and rec["image_digest"] == image["image_id"]
    assert img.find_image(engine, image) == image["image_id"]
    for rel in ("metrics/summhay.json", "dvc.lock"):
        assert (b / rel).read_bytes() == (project / rel).read_bytes(), rel


def test_container_sees_only_allowed_environment(
    engine: Any, image_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LFBENCH_SECRET_PROBE", "must-not-cross")
    monkeypatch.setenv("SOME_RANDOM_VAR", "must-not-cross")
    monkeypatch.setenv("PASSED_PROBE", "allowed")
    monkeypatch.setenv("JUDGE_KEY_PROBE", "sk-judge")
    raw = {
        "env_passthrough": ["PASSED_PROBE", "UNSET_PROBE"],
        "judges": {"j": {"provider": "openai", "api_key_env": "JUDGE_KEY_PROBE"}},
    }
    env = containers.container_env(
        raw, os.environ, {"LFBENCH_RUNTIME": "docker", "LFBENCH_IMAGE_DIGEST": image_id}
    )
    script = (
        "import os, json, pathlib; pathlib.Path('made-inside.txt').write_text('x'); "
        "print(json.dumps(dict(os.environ)))"
    )
    stdout, stderr = io.StringIO(), io.StringIO()
    code = containers.run_stage_in_container(
        image_id,
        ["python", "-c", script],
        tmp_path,
        env,
        client=engine,
        stdout=stdout,
        stderr=stderr,
    )
    assert code == 0, stderr.getvalue()
    seen = json.loads(stdout.getvalue())
    assert seen["PASSED_PROBE"] == "allowed"
    assert seen["JUDGE_KEY_PROBE"] == "sk-judge"
    assert seen["LFBENCH_RUNTIME"] == "docker" and seen["LFBENCH_IMAGE_DIGEST"] == image_id
    for hidden in ("LFBENCH_SECRET_PROBE", "SOME_RANDOM_VAR", "UNSET_PROBE"):
        assert hidden not in seen
    assert seen["HOME"] == "/tmp" and seen["HF_HUB_OFFLINE"] == "1"
    st = (tmp_path / "made-inside.txt").stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())

    # Exit status and stderr come back; the container is removed either way.
    before = len(engine.containers.list(all=True))
    code = containers.run_stage_in_container(
        image_id,
        ["python", "-c", "import sys; print('bad', file=sys.stderr); sys.exit(7)"],
        tmp_path,
        {},
        client=engine,
        stdout=stdout,
        stderr=stderr,
    )
    assert code == 7 and "bad" in stderr.getvalue()
    assert len(engine.containers.list(all=True)) == before


def test_llm_stages_in_container_reach_a_loopback_server(
    engine: Any, image_id: str, shared_project: Path, tmp_path: Path
) -> None:
    """A model and a judge on 127.0.0.1 answer stages that run in the image (host network); the
    key crosses by the name params.yaml gives it, and nowhere else. The stages that talk to no
    server and that another test already ran in the image (the local judge's training, after
    the first test of this file) are restored from the session's shared DVC cache."""
    project = shared_project
    from pipeline.testing.server import TestServer
    from tests.e2e import test_llm_pipeline as llm

    with TestServer(
        responder=f"{llm.RESPONDER}:respond", log_path=tmp_path / "server.log", cwd=ROOT
    ) as srv:
        llm._configure(project, srv.base_url, judges={"llm-batch": {"mode": "batched"}})
        path = project / "params.yaml"
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
        params["runtime"] = "docker"
        params["image_base"] = _base_image()
        path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        out = run(["dvc", "repro", *SUMMHAY_TARGETS], project, {llm.KEY_ENV: llm.FAKE_KEY})
        served = [r for r in srv.log() if r["served"]]
    assert "runtime docker" in out.stderr
    # 2 subtopics x 2 settings, one batched judge call each, and the agreement stage's batched
    # calls on the first annotated summaries
    assert len(served) == 4 + 4 + llm.AGREEMENT_SAMPLES
    gens = llm._jsonl(project / "generations/summhay/tiny.jsonl")
    assert len(gens) == 4 and all(g["status"] == "ok" for g in gens)
    records = _records(project)
    assert records["generate"]["runtime"] == "docker"
    assert HEX64.match(records["generate"]["container_id"])
    rows = llm._rows(project)
    assert rows and all(r["n_scored"] == 2 and r["coverage"] is not None for r in rows)
    assert llm.FAKE_KEY not in out.stdout + out.stderr
    for p in (project / "dvc.lock", project / "params.yaml", project / "mlruns" / "mlflow.db"):
        assert llm.FAKE_KEY.encode() not in p.read_bytes(), p


IN_IMAGE = """
import os, sys
from pathlib import Path
from pipeline.env.containers import docker_client, run_stage_in_container
ws, root = Path.cwd(), Path(os.environ["LIMIT_TEST_ROOT"])
names = ("LFBENCH_SCHEDULER", "LIMIT_TEST_URL")
env = {n: os.environ[n] for n in names if n in os.environ}
env |= {"PYTHONPATH": str(root), "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
sys.exit(run_stage_in_container(os.environ["LIMIT_TEST_IMAGE"], ["python", "ask.py", sys.argv[1]],
                                ws, env, client=docker_client(), mounts=[root]))
"""


def test_stages_in_the_image_share_their_endpoint_s_limit(
    engine: Any, image_id: str, tmp_path: Path
) -> None:
    """Issue 42 point 3 in the image: two stages calling one endpoint (`max_concurrency: 2`), each
    run in a container by `lfbench repro --jobs 4`, lease the endpoint's Dask Semaphore from the
    driver's scheduler (the image has `distributed`): the server never sees more than 2 at once
    (4 if each kept its own 2), and neither stage says it fell back to its own limit."""
    from tests import test_endpoint_limit as lim

    ws = lim._project(tmp_path / "ws", None, None)
    (ws / "in_image.py").write_text(IN_IMAGE)
    spec = yaml.safe_load((ws / "dvc.yaml").read_text(encoding="utf-8"))
    spec["stages"]["ask"]["cmd"] = "python in_image.py ${item.m} # generate --model ${item.m}"
    spec["stages"]["ask"]["deps"].append("in_image.py")
    (ws / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    lim._commit(ws, "in the image")
    with lim._server(tmp_path) as server:
        env = lim._env(server, tmp_path) | {
            "LIMIT_TEST_IMAGE": image_id,
            "LIMIT_TEST_ROOT": str(ROOT),
        }
        proc = run(["lfbench", "repro", "--jobs", "4"], ws, env)
        assert "2 done" in proc.stderr, proc.stderr
        assert len(server.log()) == 20
        assert lim._overlapped(server)
        assert server.max_in_flight() == 2
    for name in lim.STAGES:
        log = (ws / ".lfbench" / "logs" / f"ask@{name}.log").read_text()
        assert "at most 2 requests in flight to 'http://127.0.0.1:" in log, log
        assert "no Dask distributed" not in log and "did not answer" not in log, log
