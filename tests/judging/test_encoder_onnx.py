"""The local judge's ONNX encoder: deterministic build, agreement with the numpy MiniLM, the same
bits whatever the grouping of texts, and a cache that never mixes encoders."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from pipeline.local_judge import embeddings, encoder_onnx
from pipeline.local_judge.embeddings import Embedder, EmbeddingCache, encode_texts, text_key
from pipeline.retrieval import dense
from tests.conftest import encoder_beside

# texts like SummHay's insights and bullets, with the edge cases (empty, one word, over 256 pieces)
REAL = [
    "The European Central Bank raised interest rates by a quarter point to curb inflation.",
    "Several countries reported record heat waves, straining power grids.",
    "Investors worry that higher borrowing costs could slow the housing market.",
    "- The startup raised $40 million in a Series B round led by venture firms [1][3].",
    "Experts disagree on whether the policy will reduce emissions in the short term.",
    "",
    "AI",
    "Q3 revenue: +12% year over year; margins narrowed to 8.4%.",
    "word " * 300,
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the int8 model as the checkout's shared cache holds it
    (`encoder_beside`); the first test builds it again and compares the bytes."""
    return encoder_beside(tmp_path_factory.mktemp("enc") / "cache.sqlite").parent / "onnx"


def test_two_builds_write_the_same_bytes(model_dir: Path, tmp_path: Path) -> None:
    a = encoder_onnx.model_path(model_dir)
    b = encoder_onnx.build(dense.model_dir(), tmp_path / "again.onnx")
    assert a.name.startswith("minilm-int8-") and a.stat().st_size > 10_000_000
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


def test_onnx_vectors_agree_with_the_numpy_encoder(model_dir: Path) -> None:
    """float32 graph: the same model (cosine ~1); int8: cosine 0.99 on average, 0.985 at worst."""
    ref = dense.embed(REAL, batch_size=1)
    fp32 = encoder_onnx.OnnxMiniLM(encoder_onnx.model_path(model_dir, int8=False)).encode(REAL)
    assert ((fp32 * ref).sum(1) > 0.99999).all()
    int8 = encoder_onnx.get_encoder(model_dir).encode(REAL)
    cos = (int8 * ref).sum(1)
    nonempty = np.array([bool(t.strip()) for t in REAL])
    assert (cos[nonempty] >= 0.985).all() and cos[nonempty].mean() >= 0.99, cos
    assert cos.min() >= 0.97, cos  # the empty text ([CLS][SEP] only) is the hardest
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)


def test_int8_agrees_with_numpy_on_real_summhay_texts(model_dir: Path, mirror: Path) -> None:
    """400 distinct insights and bullets of news1's released summaries, spread over lengths."""
    from pipeline.benchmarks.summhay.training import published_cases
    from pipeline.local_judge.features import clean_text
    from pipeline.stages.common import FileInputs

    cases = published_cases(FileInputs(Path("/")), str(mirror / "summhay"), ["news1"])
    texts = sorted({clean_text(t) for c in cases for t in (*c.units, *c.bullets)}, key=len)
    sample = texts[:: len(texts) // 400][:400]
    cos = (encode_texts(sample, model_dir) * dense.embed(sample, batch_size=8)).sum(1)
    assert len(sample) == 400
    assert cos.mean() >= 0.99 and np.quantile(cos, 0.05) >= 0.985 and cos.min() >= 0.97, (
        cos.mean(),
        np.quantile(cos, 0.05),
        cos.min(),
    )


def test_vectors_do_not_depend_on_the_other_texts_or_their_order(model_dir: Path) -> None:
    one_by_one = np.stack([encode_texts([t], model_dir)[0] for t in REAL])
    together = encode_texts(REAL, model_dir)
    reversed_ = encode_texts(REAL[::-1], model_dir)[::-1]
    doubled = encode_texts(REAL + REAL, model_dir)
    assert np.array_equal(one_by_one, together)
    assert np.array_equal(together, reversed_)
    assert np.array_equal(doubled[: len(REAL)], together)
    assert np.array_equal(doubled[len(REAL) :], together)


def test_a_batch_would_change_the_int8_vectors(model_dir: Path) -> None:
    """Why the encoder runs one text at a time: activations share one int8 scale per run, so
    two texts of the same length embedded in one run differ from each alone."""
    enc = encoder_onnx.get_encoder(model_dir)
    a, b = enc.windows(["the cat sat on the mat", "a dog ran in the park"])
    assert len(a) == len(b)
    batch = enc.run(np.asarray([a, b], dtype=np.int64))
    alone = np.stack([enc.run(np.asarray([w], dtype=np.int64))[0] for w in (a, b)])
    assert not np.array_equal(batch, alone)


def test_workers_chunks_and_cache_give_the_same_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = [f"{t} ({i})" for i, t in enumerate(REAL * 10)]
    got = []
    for n_workers, chunk in (("1", 256), ("2", 7), ("2", 64)):
        monkeypatch.setenv(embeddings.ENV_WORKERS, n_workers)
        emb = Embedder(encoder_beside(tmp_path / f"{n_workers}-{chunk}.sqlite"), chunk=chunk)
        got.append(emb.embed(texts))
        assert emb.computed == len(texts)
    reread = Embedder(tmp_path / "2-7.sqlite")
    got.append(reread.embed(texts))
    assert reread.computed == 0
    for g in got[1:]:
        assert np.array_equal(g, got[0])


def test_the_cache_key_names_the_encoder_and_its_runtime(tmp_path: Path) -> None:
    """Vectors of the numpy encoder (the key before issue 27) are not read back."""
    old_id = "all-MiniLM-L6-v2/numpy-as-erf/first-window/per-text/1-blas-thread/f16"
    old_key = hashlib.sha256(f"{old_id}/avx2-pinned\0hello".encode()).hexdigest()
    assert text_key("hello") != old_key
    assert old_id != embeddings.ENCODER_ID and "onnx-int8" in embeddings.ENCODER_ID
    assert encoder_onnx.runtime_versions() in embeddings._key_prefix()
    cache = EmbeddingCache(tmp_path / "e.sqlite")
    cache.put_many([(old_key, np.ones(384, dtype=np.float32))])
    emb = Embedder(tmp_path / "e.sqlite")
    emb.model_dir = tmp_path / "onnx"
    emb.embed(["hello"])
    assert emb.cache_hits == 0 and emb.computed == 1
    assert any((tmp_path / "onnx").iterdir())  # the model was built beside the vectors
