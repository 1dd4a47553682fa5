"""The local judge's encoder gives the same bits on every x86-64 CPU family.

ONNX Runtime picks some kernels by CPU at run time (see `encoder_onnx`'s docstring). Checked two
ways: the graph ONNX Runtime actually runs holds only operators whose kernels are exact or
compiled once (`PORTABLE_OPS`), and real SummHay texts embedded under QEMU emulating an SSE4.2
CPU (Nehalem: ONNX Runtime's SSE kernels) and an AVX one (Sandy Bridge: its AVX kernels, no FMA)
give the vectors this machine gives (AVX2/FMA here). The emulated run needs Debian's
`qemu-user` (`.ci/run` installs it) and takes a few minutes: without it the test is skipped.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pipeline.local_judge import encoder_onnx, portability
from tests.conftest import encoder_beside


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = encoder_beside(tmp_path_factory.mktemp("enc") / "cache.sqlite").parent / "onnx"
    return encoder_onnx.model_path(folder)


def test_the_graph_onnx_runtime_runs_holds_only_portable_operators(
    model: Path, tmp_path: Path
) -> None:
    """What the session runs after its own optimisation: no Softmax/Erf/LayerNormalization, no
    fused or float32 GEMM, float64 MatMul only, float32 reductions over the last axis only (a
    reduction over another axis is a GEMM in ONNX Runtime: exact only on float64 integers)."""
    import onnx
    import onnxruntime as ort

    enc = encoder_onnx.OnnxMiniLM(model)
    level = enc.session.get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC

    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(tmp_path / "optimised.onnx"))).graph

    ops = {(n.domain, n.op_type) for n in graph.node}
    assert ops <= {("", op) for op in encoder_onnx.PORTABLE_OPS}, ops
    assert ("", "MatMulInteger") in ops and ("", "Erf") not in ops

    types = {v.name: v.type.tensor_type.elem_type for v in graph.value_info}
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 12  # q.k and p.v of 6 layers; the weight products are integer
    for n in matmuls:
        assert all(types[i] == onnx.TensorProto.DOUBLE for i in n.input), n.name
    reductions = [n for n in graph.node if n.op_type.startswith("Reduce")]
    assert reductions
    for n in reductions:
        assert len(n.input) == 2, n.name
        if consts[n.input[1]].tolist() != [-1]:
            assert types[n.input[0]] == onnx.TensorProto.DOUBLE, n.name


def _phi32(x: np.ndarray) -> np.ndarray:
    """Phi as the graph evaluates it: float32, clipped, Horner, monic denominator."""
    f = np.float32
    xc = np.clip(x, -encoder_onnx.PHI_CLIP, encoder_onnx.PHI_CLIP).astype(f)
    t = xc * xc
    num = f(encoder_onnx.PHI_P[-1])
    for c in encoder_onnx.PHI_P[-2::-1]:
        num = num * t + f(c)
    den = t
    for j in range(len(encoder_onnx.PHI_Q) - 1, -1, -1):
        den = den + f(encoder_onnx.PHI_Q[j])
        if j:
            den = den * t
    out: np.ndarray = (xc * num) / den + f(0.5)
    return out


def test_the_gelu_and_exponential_polynomials_are_accurate() -> None:
    x = np.linspace(-12, 12, 480_001, dtype=np.float32)
    phi = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(_phi32(x) - phi).max() < 3e-7

    f = np.linspace(-0.5, 0.5, 100_001, dtype=np.float32)
    acc = np.float32(encoder_onnx.EXP2_C[-1])
    for c in encoder_onnx.EXP2_C[-2::-1]:
        acc = acc * f + np.float32(c)
    assert np.abs(acc / np.exp2(f.astype(np.float64)) - 1).max() < 3e-7


def _sample(mirror: Path, n: int) -> list[str]:
    """`n` distinct insights and bullets of news1's released summaries, spread over lengths,
    with the edge cases: no word piece at all, one, and more than the 254 kept."""
    from pipeline.benchmarks.summhay.training import published_cases
    from pipeline.local_judge.features import clean_text
    from pipeline.stages.common import FileInputs

    cases = published_cases(FileInputs(Path("/")), str(mirror / "summhay"), ["news1"])
    texts = sorted(
        {clean_text(t) for c in cases for t in (*c.units, *c.bullets)}, key=lambda t: (len(t), t)
    )
    return [*texts[:: len(texts) // n][:n], "", "AI", " ".join(texts[-40:])]


@pytest.mark.skipif(
    portability.qemu() is None,
    reason="qemu-x86_64 not found (Debian: apt-get install qemu-user; .ci/run installs it): "
    "the encoder's bits on SSE4.2 and AVX CPUs are not checked",
)
def test_vectors_are_the_same_bits_on_sse_avx_and_this_cpu(model: Path, mirror: Path) -> None:
    # four insights of spread lengths and the edge cases: the 254-token text alone computes
    # more values than the rest together (under QEMU's AVX it took 40 s of the 86 for all 15 texts)
    texts = _sample(mirror, 4)
    here = portability.native_vectors(texts, model)
    cpus = portability.EMULATED_CPUS
    with ThreadPoolExecutor(max_workers=len(cpus)) as pool:
        runs = dict(
            zip(
                cpus,
                pool.map(
                    lambda cpu: portability.emulated_vectors(texts, model, cpu), cpus.values()
                ),
                strict=True,
            )
        )
    for family, (vectors, report) in runs.items():
        seen = report["features"]
        assert isinstance(seen, dict)
        # the emulated CPU really lacks AVX2/FMA (else ONNX Runtime took this machine's kernels)
        assert not seen["AVX2"] and not seen["FMA3"] and seen["AVX"] == (family == "avx"), seen
        differ = [i for i in range(len(texts)) if not np.array_equal(vectors[i], here[i])]
        assert not differ, (
            f"{family}: {len(differ)} of {len(texts)} vectors differ from this CPU's "
            f"(max abs {np.abs(vectors - here).max():.3g})"
        )
