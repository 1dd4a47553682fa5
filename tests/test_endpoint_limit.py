"""One `max_concurrency` per endpoint across the stages of `lfbench repro` (issue 42, point 3):
two stages calling one endpoint (its base URL and model) with `max_concurrency: 2`, run side by
side, on one machine and on a two-worker cluster on loopback. The test server counts the
requests it is handling at once: never more than 2 (each stage alone kept 2, so the server saw
4 before). Toy stages: each a small program sending 10 requests through the model client."""

from __future__ import annotations

import contextlib
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import ROOT, dvc_workspace, run
from tests.test_cluster import _commit, _scheduler, _worker

ASK = textwrap.dedent(
    """
    import json, logging, os, pathlib, sys, time
    logging.basicConfig(level=logging.INFO)
    from pipeline.core.types import ChatRequest, EndpointConfig
    from pipeline.llm.client import run_chat_sync
    name, N = sys.argv[-1], 10
    ep = EndpointConfig(base_url=os.environ["LIMIT_TEST_URL"], model="m", api_key_env=None,
                        max_concurrency=2, timeout_s=60)
    reqs = [ChatRequest(key=f"{name}-{i}", messages=[{"role": "user", "content": f"{name} {i}"}],
                        prompt_sha=f"{name}-{i}") for i in range(N)]
    results, report = run_chat_sync(ep, reqs, cache_path=None, journal_path=None, label=name,
                                    progress=False)
    assert all(r.status == "ok" for r in results), results
    out = pathlib.Path("out")
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"name": name}))
    """
)
STAGES = ("a", "b")


def _project(path: Path, remote: Path | None, cores: str | None) -> Path:
    """A stage per name sending 10 requests to one endpoint; `cores: all` makes each take a whole
    worker (on a cluster: one stage per worker), otherwise they wait on the endpoint (0 cores,
    as a generate stage of an `openai` model)."""
    ws = dvc_workspace(path, remote)
    (ws / "ask.py").write_text(ASK)
    (ws / ".gitignore").write_text(".lfbench/\n")
    stage: dict[str, Any] = {
        "matrix": {"m": list(STAGES)},
        "cmd": "python ask.py generate --model ${item.m} ${item.m}",
        "deps": ["ask.py"],
        "outs": ["out/${item.m}.json"],
    }
    if cores is not None:
        stage["cmd"] = "python ask.py ${item.m}"
        stage["meta"] = {"lfbench": {"cores": cores}}
    (ws / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"ask": stage}}, sort_keys=False))
    models = {m: {"provider": "openai"} for m in STAGES}
    (ws / "params.yaml").write_text(yaml.safe_dump({"models": models}))
    _commit(ws, "toy")
    return ws


@contextlib.contextmanager
def _server(tmp_path: Path) -> Iterator[TestServer]:
    with TestServer(latency_ms=1000, log_path=tmp_path / "server.log", cwd=ROOT) as server:
        yield server


def _overlapped(server: TestServer) -> bool:
    """The two stages' requests reached the server at the same time (not one stage's after the
    other's: their starts are seconds apart on a busy machine)."""
    spans = {}
    for name in STAGES:
        t = [r["time"] for r in server.log() if r["prompt_head"].startswith(f"{name} ")]
        assert len(t) == 10, name
        spans[name] = (min(t), max(t))
    (a0, a1), (b0, b1) = spans.values()
    return a0 < b1 and b0 < a1


def _env(server: TestServer, tmp_path: Path) -> dict[str, str]:
    return {
        "LIMIT_TEST_URL": server.base_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def test_two_stages_of_one_endpoint_share_its_limit_on_one_machine(tmp_path: Path) -> None:
    ws = _project(tmp_path / "ws", None, None)
    with _server(tmp_path) as server:
        proc = run(["lfbench", "repro", "--jobs", "4"], ws, _env(server, tmp_path))
        assert "2 done" in proc.stderr, proc.stderr
        assert _overlapped(server)  # side by side
        assert len(server.log()) == 20
        assert server.max_in_flight() == 2  # each stage alone kept 2: 4 before
    # each stage's log says what it shares
    log = (ws / ".lfbench" / "logs" / "ask@a.log").read_text()
    assert "at most 2 requests in flight to 'http://127.0.0.1:" in log, log


@pytest.mark.slow
def test_two_stages_of_one_endpoint_share_its_limit_on_a_two_worker_cluster(
    tmp_path: Path,
) -> None:
    remote = tmp_path / "remote"
    origin = _project(tmp_path / "origin", remote, "all")
    for name in ("driver", "w1", "w2"):
        run(["git", "clone", "-q", str(origin), str(tmp_path / name)], tmp_path)
    driver = tmp_path / "driver"
    with _server(tmp_path) as server:
        env = {
            **_env(server, tmp_path),
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "LFBENCH_CACHE_URL": f"sqlite:///{tmp_path / 'llm.sqlite'}",
        }
        with (
            _scheduler(tmp_path) as address,
            _worker(address, tmp_path / "w1", env),
            _worker(address, tmp_path / "w2", env),
        ):
            from distributed import Client

            with Client(address, timeout="30s") as c:
                c.wait_for_workers(2, timeout=120)
            proc = run(["lfbench", "repro", "--jobs", "4", "--cluster", address], driver, env)
        assert "2 done" in proc.stderr, proc.stderr
        logs = {w: list((tmp_path / w / ".lfbench" / "logs").glob("ask@*")) for w in ("w1", "w2")}
        assert all(len(v) == 1 for v in logs.values()), logs  # one stage on each worker
        assert _overlapped(server)
        assert len(server.log()) == 20
        assert server.max_in_flight() == 2  # each stage alone kept 2: 4 before


RATED = textwrap.dedent(
    """
    import os, sys, time
    from pipeline.core.types import ChatRequest, EndpointConfig
    from pipeline.llm import client, shared_limit  # imported before the start: both at once
    import distributed, openai, aiohttp
    name, start_at = sys.argv[1], float(sys.argv[2])
    ep = EndpointConfig(base_url=os.environ["LIMIT_TEST_URL"], model="m", api_key_env=None,
                        max_concurrency=4, requests_per_minute=240, timeout_s=60)
    reqs = [ChatRequest(key=f"{name}-{i}", messages=[{"role": "user", "content": f"{name} {i}"}],
                        prompt_sha=f"{name}-{i}") for i in range(8)]
    time.sleep(max(0.0, start_at - time.time()))
    results, _ = client.run_chat_sync(ep, reqs, cache_path=None, journal_path=None, label=name,
                                      progress=False)
    assert all(r.status == "ok" for r in results), results
    """
)


def test_two_stages_of_one_endpoint_share_its_requests_per_minute(tmp_path: Path) -> None:
    """`requests_per_minute: 240` (a request every 0.25 s) on two stages sending 8 requests
    each, started at once, with the scheduler `lfbench repro` gives them: the 16 requests
    reach the server about 15 x 0.25 s apart from first to last (each stage alone: 7 x 0.25
    s, the two streams side by side)."""
    import subprocess
    import sys
    import time

    from distributed import LocalCluster

    from pipeline.runner.driver import local_cluster_options

    with (
        TestServer(latency_ms=50, log_path=tmp_path / "server.log", cwd=ROOT) as server,
        LocalCluster(**local_cluster_options(2)) as cluster,
    ):
        env = {
            **os.environ,
            **_env(server, tmp_path),
            "LFBENCH_SCHEDULER": cluster.scheduler_address,
        }
        start_at = time.time() + 15
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RATED, name, str(start_at)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name in STAGES
        ]
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
        arrivals = sorted(r["time"] for r in server.log())
    assert len(arrivals) == 16
    assert arrivals[0] >= start_at - 0.5, "a stage was not ready at the start"
    # 15 intervals of 0.25 s, less the jitter of the first and last arrival (alone: 1.75 s)
    assert arrivals[-1] - arrivals[0] >= 3.25, arrivals


def test_an_endpoint_s_semaphore_is_named_by_its_url_and_model_never_a_secret() -> None:
    from pipeline.llm.shared_limit import semaphore_name

    a = semaphore_name("https://user:s3cret@api.example.com/v1/?api_key=T0KEN", "gpt-x")
    assert "s3cret" not in a and "T0KEN" not in a and "gpt-x" in a
    assert a == semaphore_name("https://user:other@api.example.com/v1?api_key=else", "gpt-x")
    # one server, whoever calls it (the user and key are not the endpoint)
    assert a == semaphore_name("https://API.example.com/v1", "gpt-x")
    assert a != semaphore_name("https://api.example.com:8443/v1", "gpt-x")
    assert a != semaphore_name("https://user:s3cret@api.example.com/v1/?api_key=T0KEN", "gpt-y")
