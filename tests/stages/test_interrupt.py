"""Ctrl-C during a generate stage (issue 36, point 3): a real stage process (`lfbench run
generate`, as dvc.yaml runs it) in a project copy, a real SIGINT, the test server over real HTTP.

The first Ctrl-C lets the requests in flight finish into the journal (within a grace time), so
the re-run sends none of them again (the server's request log says what was sent); a second
Ctrl-C, or the grace running out, abandons them. The stage exits 130 saying how many finished
and were kept, and writes no output."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.stages import warm_stage
from pipeline.testing.server import TestServer
from tests.conftest import BIN, ROOT, make_project, run, run_env

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
    # this one through the warm stage server: the caller passes the Ctrl-C on to its stage
    warm = {warm_stage.ENV_SWITCH: "1"}
    _warm_server_up(run_env(warm), built)
    with TestServer(latency_ms=LATENCY_MS, cwd=ROOT) as srv:
        argv = _model(built, "paid", srv.base_url)
        proc = _start(built, argv, **warm)
        answered = _second_wave(srv, proc)
        assert [ln for ln in _warm_log(run_env(warm), built) if "run generate" in ln]
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
    # these two in the stage's own process (the warm stage server off): the stage itself hears
    # the Ctrl-C
    env = {warm_stage.ENV_SWITCH: "0"}
    if how != "second Ctrl-C":
        env["LFBENCH_INTERRUPT_GRACE_S"] = "0.5"
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


# ---------------------------------------------------------------- the warm stage server


def _warm_log(env: dict[str, str], cwd: Path) -> list[str]:
    """The warm stage server's log lines of the stages it ran in folder `cwd`."""
    folder = Path(env.get("TMPDIR", "/tmp")) / f"lfbench-{os.getuid()}"
    text = "\n".join(p.read_text(errors="replace") for p in folder.glob("stage-*.log"))
    return [ln for ln in text.splitlines() if ln.endswith(f" in {cwd}")]


def _warm_server_up(env: dict[str, str], cwd: Path) -> None:
    """Until a stage command runs in the server (the first caller starts it, runs itself)."""
    deadline = time.monotonic() + 120
    before = len(_warm_log(env, cwd))
    while len(_warm_log(env, cwd)) == before:
        subprocess.run([str(BIN / "lfbench"), "stage", "--help"], cwd=cwd, env=env,
                       capture_output=True)  # fmt: skip
        assert time.monotonic() < deadline, "no warm stage server started"
        time.sleep(0.3)


def _alive(pid: int) -> bool:
    """Not a zombie (a dead child's /proc entry may linger a moment)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_killed_stage_process_in_the_warm_server_takes_its_stage_down(built: Path) -> None:
    """`lfbench run` SIGKILLed with its group (as when `dvc repro` is killed) while its stage
    runs in a child of the warm stage server (pipeline/stages/warm_stage.py): the child and all
    it started end at once, and nothing more is sent."""
    env = run_env({warm_stage.ENV_SWITCH: "1"})
    env.pop("LFBENCH_RUNTIME", None)
    _warm_server_up(env, built)
    with TestServer(latency_ms=1500, cwd=ROOT) as srv:
        argv = _model(built, "killed", srv.base_url)
        proc = subprocess.Popen(
            argv, cwd=built, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a group of its own, killed whole as dvc repro's would be
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while sum(r["served"] for r in srv.log()) < 2:  # the stage is sending
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        line = [ln for ln in _warm_log(env, built) if "run generate" in ln][-1]
        stage_pid = int(line.split()[1].rstrip(":"))  # a child of the server, not `proc`
        assert stage_pid != proc.pid and _alive(stage_pid)
        killed_at = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # answered by now: sent at least the server's latency (1.5 s) before the kill
        answered = {r["body_sha256"] for r in srv.log()}
        gone = time.monotonic() + 5
        while _alive(stage_pid):
            assert time.monotonic() < gone, "the stage outlived its caller"
            time.sleep(0.05)
        time.sleep(LATENCY_MS / 1000 + 1.0)  # a stage still alive would send its next ones
        log = srv.log()
    # Counted, not timed: beyond those answered at the kill, at most the two the stage had in
    # flight (max_concurrency); on a busy machine the server may take those in just after
    # `killed_at`. A stage still sending would have sent its next two by now.
    extra = {r["body_sha256"] for r in log} - answered
    late = sorted(round(r["time"] - killed_at, 3) for r in log if r["time"] > killed_at)
    assert len(answered) >= 2 and len(extra) <= 2, (
        f"requests were sent after the caller was killed: {len(answered)} answered at the "
        f"kill, {len(extra)} more; arrivals after the kill (s): {late}"
    )
    assert not (built / "generations" / "summhay" / "killed.jsonl").exists()
