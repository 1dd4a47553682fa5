"""lfbench: a reproducible, containerized runner for long-form RAG benchmarks."""

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    """The installed version, else (the code mounted in the image, not installed) pyproject's."""
    try:
        return version("lfbench")
    except PackageNotFoundError:
        import re

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            m = re.search(r'^version = "([^"]+)"', pyproject.read_text(encoding="utf-8"), re.M)
        except OSError:
            m = None
        return m.group(1) if m else "0.0.0+unknown"


__version__ = _version()


def _pin_float_kernels() -> None:
    """Make float results the same on every x86-64 CPU with AVX2, before numpy loads.

    OpenBLAS and numpy pick their SIMD kernels by CPU: on an AVX-512 machine (e.g. Sapphire
    Rapids) they round differently from an AVX2 one, and a float16-rounded MiniLM vector or a
    bootstrap interval can then differ in its last bit, which flips a near-tied local-judge
    verdict (measured: link accuracy 0.8208 vs 0.8209) and breaks byte-for-byte reproduction.
    Pinning OpenBLAS to its Haswell kernels and turning off numpy's AVX-512 dispatch gives an
    AVX-512 machine the AVX2 machines' bits (measured: the committed metrics, byte for byte).
    Set either variable yourself to override; nothing is pinned without AVX2 or off x86-64."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        if " avx2" not in Path("/proc/cpuinfo").read_text(encoding="utf-8"):
            return
    except OSError:
        return
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
    os.environ.setdefault("NPY_DISABLE_CPU_FEATURES", "X86_V4 AVX512_ICL AVX512_SPR")


_pin_float_kernels()

# No usage reports leave the machine: MLflow's client records and sends telemetry unless told
# not to (its own switches; a user who sets them keeps theirs). Stages log to MLflow offline.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
# Nor does an MLflow server lfbench starts (`lfbench ui`, the team's) run MLflow's job runner:
# its Huey consumer processes serve MLflow's GenAI jobs, which lfbench does not use, and each
# imports MLflow (about 3 CPU-seconds a server). A user who sets it keeps theirs.
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
