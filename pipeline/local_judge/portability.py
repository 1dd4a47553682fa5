"""The local judge's encoder on other x86-64 CPUs, by emulation: are its vectors the same bits?

ONNX Runtime picks some of its kernels by CPU at run time (SSE, AVX, AVX2/FMA, AVX-512), so an
encoder graph can give other bits on another CPU family (see `encoder_onnx`). This module runs
the encoder of a given model file under QEMU's user-mode emulator (`qemu-x86_64 -cpu <model>`,
Debian package `qemu-user`), which makes the process see an older CPU's features: on a
`Nehalem` (SSE4.2, no AVX) ONNX Runtime takes its SSE kernels, on a `SandyBridge` (AVX, no
AVX2/FMA) its AVX ones. QEMU 7.2 cannot emulate AVX-512; the machine's own CPU is the third
family compared.

    python -m pipeline.local_judge.portability MODEL TEXTS.json OUT.npy [basic|all]

is the child run under the emulator: it embeds the texts of TEXTS.json with MODEL one text per
run (as the local judge does) and writes the float32 vectors, plus OUT.json with the CPU
features numpy saw (evidence that the emulated CPU lacks AVX2). The last argument is ONNX
Runtime's graph optimisation level: `basic`, the encoder's, or `all` (that of the graph before,
whose fused kernels are part of what differed). `tests/judging/test_encoder_isa.py`
and `perf/encoder_isa.py` use it.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from pipeline.local_judge.encoder_onnx import OnnxMiniLM

# QEMU CPU models, by the widest SIMD ONNX Runtime's kernels can use on them
EMULATED_CPUS = {"sse4.2": "Nehalem", "avx": "SandyBridge"}
# what numpy reports of the CPU it runs on (to show which family a run really was)
_FEATURES = ("SSE42", "AVX", "F16C", "FMA3", "AVX2", "AVX512F")


def qemu() -> str | None:
    """The `qemu-x86_64` user-mode emulator, or None (not installed, or not an x86-64 host)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return shutil.which("qemu-x86_64")


def cpu_features() -> dict[str, bool]:
    """Which SIMD extensions numpy detected on this (possibly emulated) CPU."""
    seen = importlib.import_module("numpy._core._multiarray_umath").__cpu_features__
    return {f: bool(seen.get(f, False)) for f in _FEATURES}


def emulated_vectors(
    texts: Sequence[str], model: Path, cpu: str, *, level: str = "basic", timeout: float = 3600.0
) -> tuple[npt.NDArray[np.float32], dict[str, object]]:
    """The vectors of `texts` by the encoder in `model`, computed under `qemu-x86_64 -cpu cpu`,
    and what the child reported (CPU features seen, seconds)."""
    emulator = qemu()
    if emulator is None:
        raise RuntimeError("qemu-x86_64 not found (Debian: apt-get install qemu-user)")
    with tempfile.TemporaryDirectory(prefix="lfbench-isa-") as tmp:
        src, out = Path(tmp) / "texts.json", Path(tmp) / "vectors.npy"
        src.write_text(json.dumps(list(texts)), encoding="utf-8")
        env = dict(os.environ)
        # the host's /proc/cpuinfo shows through the emulator: keep OpenBLAS off kernels the
        # emulated CPU lacks (the encoder itself makes no BLAS call)
        env["OPENBLAS_CORETYPE"] = "Nehalem"
        child = [sys.executable, "-m", __name__, str(model), str(src), str(out), level]
        t0 = time.monotonic()
        done = subprocess.run(
            [emulator, "-cpu", cpu, *child],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"encoder under qemu -cpu {cpu} failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        vectors: npt.NDArray[np.float32] = np.load(out)
        report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
        report["wall_s"] = round(time.monotonic() - t0, 1)
        return vectors, report


def encoder_at(model: Path, *, level: str = "basic") -> OnnxMiniLM:
    """The encoder of `model` at ONNX Runtime's `basic` optimisation level (the encoder's own) or
    `all` (with its fusions, as the graph before the CPU-portable one ran)."""
    import onnxruntime as ort

    from pipeline.local_judge.encoder_onnx import OnnxMiniLM

    encoder = OnnxMiniLM(model)
    if level == "all":
        opts = encoder.session.get_session_options()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        encoder.session = ort.InferenceSession(
            str(model), sess_options=opts, providers=["CPUExecutionProvider"]
        )
    elif level != "basic":
        raise ValueError(f"optimisation level {level!r}: basic or all")
    return encoder


def native_vectors(
    texts: Sequence[str], model: Path, *, level: str = "basic"
) -> npt.NDArray[np.float32]:
    """The same computation in this process, on this machine's CPU."""
    return encoder_at(model, level=level).encode(texts)


def main(argv: Sequence[str]) -> None:
    model, src, out = (Path(a) for a in argv[:3])
    texts = json.loads(src.read_text(encoding="utf-8"))
    t0 = time.monotonic()
    vectors = native_vectors(texts, model, level=argv[3] if len(argv) > 3 else "basic")
    np.save(out, vectors)
    report = {"features": cpu_features(), "encode_s": round(time.monotonic() - t0, 1)}
    out.with_suffix(".json").write_text(json.dumps(report), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
