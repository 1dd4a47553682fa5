"""Issue 36, points 10 and 11: commands given what cannot work end with one clear line and
status 2, never a traceback: `lfbench plan` of a stage that does not exist or while a `dvc
repro` holds DVC's lock, `lfbench report --out` a file or a folder nobody can write, a plan's
pace that is not a positive, finite number of seconds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from tests.conftest import BIN, ROOT, run, run_env, tracked_files


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tracked files (params, dvc.yaml, committed metrics) as a git repository:
    enough for DVC to read its pipeline and for `lfbench report` (no data, no outputs)."""
    dest = tmp_path_factory.mktemp("bare")
    for rel in tracked_files():
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    run(["git", "init", "-q"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], dest)
    return dest


def _lfbench(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "lfbench"), *args],
        cwd=cwd,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _one_line(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_plan_of_a_stage_that_does_not_exist(bare: Path) -> None:
    """Before: rc 1 and a traceback ending in dvc's NoOutputOrStageError."""
    line = _one_line(_lfbench(["plan", "nosuchstage"], bare), "nosuchstage")
    assert "summhay-aggregate" in line  # the stages it could have named


def test_plan_while_a_dvc_command_holds_the_lock(bare: Path) -> None:
    """Before: rc 1 and a traceback ending in dvc's LockError."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom dvc.repo import Repo\nr = Repo('.')\nr.lock.lock()\n"
            "print('locked', flush=True)\nsys.stdin.read()\n",
        ],
        cwd=bare,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        _one_line(_lfbench(["plan"], bare), "another DVC command", "dvc repro")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


def test_report_out_a_file_or_an_unwritable_folder(bare: Path, tmp_path: Path) -> None:
    """Before: rc 1 and a traceback (FileExistsError from mkdir; FileNotFoundError under /proc),
    after the report's work."""
    a_file = tmp_path / "report.html"
    a_file.write_text("mine", encoding="utf-8")
    proc = _lfbench(["report", "--out", str(a_file)], bare)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Invalid value for '--out'" in proc.stderr and "is a file" in proc.stderr
    assert a_file.read_text(encoding="utf-8") == "mine"
    proc = _lfbench(["report", "--out", "/proc/lfbench-report"], bare)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Invalid value for '--out'" in proc.stderr and "cannot write in /proc" in proc.stderr


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "-inf"])
def test_plan_pace_must_be_a_positive_finite_number_of_seconds(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: -5 planned "-5 s" (and -50 s for ten waves); nan and inf came out as NaN and
    Infinity in --json, which is not JSON. Refused as the command line is read."""
    monkeypatch.chdir(tmp_path)  # no params.yaml: refused before it is read
    done = CliRunner().invoke(
        cli, ["plan", f"--seconds-per-request={value}", "--json"], catch_exceptions=False
    )
    assert done.exit_code == 2, done.output
    assert "Invalid value for '--seconds-per-request'" in done.output
    assert "a positive, finite number of seconds" in done.output


@pytest.mark.parametrize(
    ("run_id", "shown"),
    [("0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
     ("../x' OR '1'='1", "../x' OR '1'='1")],
)  # fmt: skip
def test_audit_sample_of_an_unknown_or_malformed_run_id(
    tmp_path: Path, run_id: str, shown: str
) -> None:
    """Issue 44, point 10. Before: rc 1 and a traceback ending in MlflowException `Run with
    id=... not found`."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    proc = _lfbench(["audit", "sample", "--benchmark", "summhay", "--run", run_id], tmp_path)
    _one_line(proc, "--run", shown, "no MLflow run")
