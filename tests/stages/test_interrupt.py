"""Ctrl-C during a generate stage (issue 36, point 3): a real stage process (`lfbench run
generate`, as dvc.yaml runs it) in a project copy, a real SIGINT, the test server over real HTTP.

The first Ctrl-C lets the requests in flight finish into the journal (within a grace time), so
the re-run sends none of them again (the server's request log says what was sent); a second
Ctrl-C, or the grace running out, abandons them. The stage exits 130 saying how many finished
and were kept, and writes no output."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import ROOT, make_project, run, run_env

ITEMS = 6  # one oracle request each, two at a time
LATENCY_MS = 3000


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, mirror: Path) -> Path:
    """A project copy with SummHay's dataset built (no model involved)."""
    project = make_project(tmp_path_factory.mktemp("interrupt") / "proj", mirror)
    params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
    params["runtime"] = "local"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["dvc", "repro", "summhay-construct"], project)
    return project


def _model(project: Path, name: str, base_url: str) -> list[str]:
    """Add model `name` (its first ITEMS subtopics, oracle) and return its stage's command."""
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["models"][name] = {
        "provider": "openai",
        "base_url": base_url,
        "model": "paid-model",
        "api_key_env": None,
        "settings": ["oracle"],
        "max_concurrency": 2,
        "max_retries": 0,
        "timeout_s": 60,
        "slice": {"summhay": {"first": ITEMS}},
    }
    params["summhay"]["models"].append(name)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return [
        "lfbench", "run", "generate", "--benchmark", "summhay", "--model", name,
        "--dataset", "datasets/summhay.jsonl", "--data", "data/summhay",
        "--out", f"generations/summhay/{name}.jsonl",
    ]  # fmt: skip


def _start(project: Path, argv: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        cwd=project,
        env=run_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _second_wave(srv: TestServer, proc: subprocess.Popen[str]) -> set[str]:
    """Wait until the first two answers are served (the next two are then sent), then a moment
    more: two requests are in flight. Returns the bodies answered so far."""
    deadline = time.monotonic() + 120
    while sum(r["served"] for r in srv.log()) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stage sent nothing"
        time.sleep(0.05)
    time.sleep(1.0)
    return {r["body_sha256"] for r in srv.log()}


def _in_flight(log: list[dict[str, Any]], answered: set[str], at: float) -> set[str]:
    """Bodies that had arrived at the server before `at` but were not answered then."""
    return {r["body_sha256"] for r in log if r["time"] < at} - answered


def test_ctrl_c_lets_the_requests_in_flight_finish_and_the_rerun_sends_none_of_them(
    built: Path,
) -> None:
    with TestServer(latency_ms=LATENCY_MS, cwd=ROOT) as srv:
        argv = _model(built, "paid", srv.base_url)
        proc = _start(built, argv)
        answered = _second_wave(srv, proc)
        at = time.time()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        time.sleep(LATENCY_MS / 1000 + 0.5)  # whatever was in flight is answered (and logged)
        first = srv.log()
        in_flight = _in_flight(first, answered, at)
        assert len(in_flight) == 2, first
        wrote = (built / "generations" / "summhay" / "paid.jsonl").exists()

        again = subprocess.run(argv, cwd=built, env=run_env(), capture_output=True, text=True)
        assert again.returncode == 0, again.stderr[-3000:]
        resent = [r["body_sha256"] for r in srv.log()[len(first) :]]
    assert not set(resent) & in_flight, "a request in flight at Ctrl-C was sent again"
    assert not set(resent) & answered
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted (SIGINT): 2 of the 2 requests in flight finished and were kept" in err
    assert "0 abandoned" in err and "Traceback" not in err, err[-3000:]
    assert not wrote
    assert len(resent) == len(set(resent)) == ITEMS - len(answered) - len(in_flight)
    gens = (built / "generations" / "summhay" / "paid.jsonl").read_text().splitlines()
    assert len(gens) == ITEMS
    print(
        f"in flight at Ctrl-C: {len(in_flight)}, kept; re-run sent {len(resent)}"
        f" (none of them), {len(answered)} answered before"
    )


@pytest.mark.parametrize("how", ["second Ctrl-C", "grace ran out"])
def test_a_second_ctrl_c_or_the_grace_abandons_the_requests_in_flight(
    built: Path, how: str
) -> None:
    name = "twice" if how == "second Ctrl-C" else "graceless"
    env = {} if how == "second Ctrl-C" else {"LFBENCH_INTERRUPT_GRACE_S": "0.5"}
    with TestServer(latency_ms=LATENCY_MS, cwd=ROOT) as srv:
        argv = _model(built, name, srv.base_url)
        proc = _start(built, argv, **env)
        _second_wave(srv, proc)
        proc.send_signal(signal.SIGINT)
        if how == "second Ctrl-C":
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "0 of the 2 requests in flight finished and were kept" in err, err[-3000:]
    assert "2 abandoned" in err and "Traceback" not in err


def test_the_grace_time_must_be_a_number() -> None:
    from pipeline.core.errors import ConfigError, interrupt_grace_s

    assert interrupt_grace_s({}) == 60.0
    assert interrupt_grace_s({"LFBENCH_INTERRUPT_GRACE_S": "0"}) == 0.0
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match="LFBENCH_INTERRUPT_GRACE_S"):
            interrupt_grace_s({"LFBENCH_INTERRUPT_GRACE_S": bad})
