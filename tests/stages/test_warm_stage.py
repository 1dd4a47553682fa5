"""The warm stage server (pipeline/stages/warm_stage.py): `lfbench run|stage` forked from a
process that has the stages' imports done stands in for the stage's own process: the caller's
streams, folder, status and program name; a signal to the caller reaches the stage; a caller
killed takes the stage and everything it started down; off, or in a container, nothing of it.

A real Ctrl-C through the server, and a real SIGKILL of a caller mid-stage, are in
tests/stages/test_interrupt.py (on a real generate stage and the test server). This module's
server has a socket folder of its own (TMPDIR)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core import lineage
from pipeline.stages import warm_stage, warm_sync
from tests.conftest import BIN, ROOT, run_env


@pytest.fixture(scope="module")
def tmpdir_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of this module's `lfbench` commands: a TMPDIR (socket folder) of its
    own, the server of this code running in it; stopped at the end."""
    tmp = tmp_path_factory.mktemp("warmstage")
    env = run_env({"TMPDIR": str(tmp), warm_stage.ENV_SWITCH: "1"})
    env.pop("LFBENCH_RUNTIME", None)
    folder = tmp / f"lfbench-{os.getuid()}"
    deadline = time.monotonic() + 120
    while not _served(folder, str(tmp)):  # the first caller starts it and runs its own
        subprocess.run(
            [str(BIN / "lfbench"), "stage", "--help"], cwd=tmp, env=env, capture_output=True
        )
        assert time.monotonic() < deadline, _log(folder)
        time.sleep(0.3)
    yield env
    for lock in folder.glob("stage-*.lock"):
        pid = lock.read_text().strip()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)


def _log(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.glob("stage-*.log"))


def _served(folder: Path, cwd: str) -> list[str]:
    """The server's log lines of the stages it ran in folder `cwd`."""
    return [ln for ln in _log(folder).splitlines() if ln.endswith(f" in {cwd}")]


def test_the_switches() -> None:
    assert warm_stage.ENV_RUNTIME == lineage.ENV_RUNTIME
    argv = ["lfbench", "run", "judge"]
    off = (warm_stage.ENV_SWITCH, "LFBENCH_RUNTIME")
    env = {k: v for k, v in os.environ.items() if k not in off}
    with pytest.MonkeyPatch.context() as mp:
        for k in (warm_stage.ENV_SWITCH, "LFBENCH_RUNTIME"):
            mp.delenv(k, raising=False)
        on = sys.platform == "linux"  # on by default, where a fork without exec is safe
        assert warm_stage.wanted(argv) == on
        mp.setenv(warm_stage.ENV_SWITCH, "1")
        assert warm_stage.wanted(argv) == warm_stage.wanted(["lfbench", "stage", "judge"]) == on
        assert not warm_stage.wanted(["lfbench", "repro"])  # only a stage's process
        mp.setenv(warm_stage.ENV_SWITCH, "0")
        assert not warm_stage.wanted(argv)
        mp.setenv(warm_stage.ENV_SWITCH, "1")
        mp.setenv("LFBENCH_RUNTIME", "docker")  # inside a stage's container
        assert not warm_stage.wanted(argv)
    # the server's name follows what modules read at import, and the module search path
    key = warm_stage.code_key(env)
    assert warm_stage.code_key(env) == key
    assert warm_stage.code_key({**env, "OMP_NUM_THREADS": "3"}) != key
    assert warm_stage.code_key({**env, "PYTHONPATH": "/elsewhere"}) != key
    assert warm_stage.code_key({**env, "OPENAI_API_KEY": "sk-x"}) == key  # not a secret's


def test_an_install_names_another_server_and_a_new_file_does_not(tmp_path: Path) -> None:
    env = dict(os.environ)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "path", [*sys.path, str(tmp_path)])
        key = warm_stage.code_key(env)
        (tmp_path / "notes.txt").write_text("a file written beside the packages")
        assert warm_stage.code_key(env) == key
        (tmp_path / "somepkg-1.0.dist-info").mkdir()  # what an install adds
        assert warm_stage.code_key(env) != key


def test_the_stage_has_the_callers_streams_folder_status_and_name(
    tmpdir_env: dict[str, str], tmp_path: Path
) -> None:
    folder = Path(tmpdir_env["TMPDIR"]) / f"lfbench-{os.getuid()}"
    (tmp_path / "params.yaml").write_text("models: [not, a, mapping]\n")
    argv = [
        str(BIN / "lfbench"), "run", "construct", "--benchmark", "summhay",
        "--data", "data/summhay", "--out", "datasets/summhay.jsonl",
    ]  # fmt: skip
    warm = subprocess.run(argv, cwd=tmp_path, env=tmpdir_env, capture_output=True, text=True)
    assert len(_served(folder, str(tmp_path))) == 1, _log(folder)  # it ran in the server
    own = subprocess.run(
        argv,
        cwd=tmp_path,
        env={**tmpdir_env, warm_stage.ENV_SWITCH: "0"},
        capture_output=True,
        text=True,
    )
    assert len(_served(folder, str(tmp_path))) == 1  # off: in its own process
    # the same error, naming the file in the caller's folder, on its stderr; the same status
    assert own.returncode == warm.returncode == 2, (own.stderr, warm.stderr)
    assert (warm.stdout, warm.stderr) == (own.stdout, own.stderr)
    assert "params.yaml" in warm.stderr
    # click names the program as the caller was called, not after the server's module
    bad = subprocess.run(
        [str(BIN / "lfbench"), "stage", "nosuch"],
        cwd=tmp_path,
        env=tmpdir_env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "Usage: lfbench stage" in bad.stderr, bad.stderr
    assert len(_served(folder, str(tmp_path))) == 2


def test_a_stage_in_the_server_belongs_to_its_callers_dvc_run(
    tmpdir_env: dict[str, str], tmp_path: Path
) -> None:
    """Where a `dvc repro`'s stages run is decided, and said, once per run: the `dvc` process
    among a stage's ancestors names the run (`containers.repro_key`). A stage forked from the
    server is the server's child, so it must look from its caller's parent instead."""
    from pipeline.env import image as img

    folder = Path(tmpdir_env["TMPDIR"]) / f"lfbench-{os.getuid()}"
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("params.yaml", *img.RECIPE_FILES):
        (proj / name).write_bytes((ROOT / name).read_bytes())
    env = {**tmpdir_env, "DOCKER_HOST": f"unix://{tmp_path / 'dead.sock'}"}
    subprocess.run([str(BIN / "lfbench"), "image", "recipe"], cwd=proj, env=env, check=True)
    stage = (
        f"{BIN / 'lfbench'} run construct --benchmark summhay --data data/summhay"
        " --out datasets/summhay.jsonl"
    )
    dvc = tmp_path / "bin" / "dvc"  # a stand-in for dvc: two stages, one after the other
    dvc.parent.mkdir()
    dvc.write_text(f"#!/bin/sh\n{stage}\n{stage}\n")
    dvc.chmod(0o755)
    out = subprocess.run([str(dvc)], cwd=proj, env=env, capture_output=True, text=True)
    assert len(_served(folder, str(proj))) == 2, out.stderr  # both ran in the server
    assert out.stderr.count("stages of this run go local") == 1, out.stderr


def test_the_sync_of_a_stage_forked_from_the_server_runs_in_that_stage() -> None:
    """MLflow is imported there already: handing the sync to the sync server saves nothing."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warm_sync, "_enabled", True)
        mp.delenv(warm_sync.ENV_SWITCH, raising=False)
        mp.delenv("LFBENCH_RUNTIME", raising=False)
        assert warm_sync._wanted() == (os.uname().sysname == "Linux")
        mp.setattr(warm_sync, "_warm_here", True)
        assert not warm_sync._wanted()
