"""The numpy all-MiniLM-L6-v2 encoder (a few short texts only, to stay fast)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import LfbenchError
from pipeline.retrieval import dense

# The first values of the embedding sentence-transformers gives for "This is an example
# sentence" with all-MiniLM-L6-v2 (the model card's usage example).
REFERENCE = [0.0676569, 0.0634959, 0.0487131, 0.0793050, 0.0374480, 0.0026528, 0.0393750]


def test_reference_embedding() -> None:
    e = dense.embed(["This is an example sentence", "Each sentence is converted"])
    assert e.shape == (2, 384)
    assert e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(e[0, :7], REFERENCE, atol=1e-5)


def test_similar_beats_unrelated_and_is_deterministic() -> None:
    docs = [
        "A simple recipe for baking sourdough bread at home.",
        "The stock market fell sharply on Monday after the earnings report.",
        "Bread baking needs flour, water, yeast and salt.",
    ]
    query = "How do I bake bread?"
    s = dense.dense_scores(query, docs)
    assert min(s[0], s[2]) > s[1] + 0.3
    dense._CHUNK_CACHE.clear()
    assert dense.dense_scores(query, docs) == s
    # batching and order do not change a text's embedding (beyond float rounding)
    alone = dense.embed([docs[1]])[0]
    batch = dense.embed([docs[0], docs[1], "x"], batch_size=2)[1]
    np.testing.assert_allclose(alone, batch, atol=1e-5)


def test_long_documents_are_windowed() -> None:
    model = dense.get_model()
    ids = list(range(1000, 1600))  # 600 word pieces -> windows of 254 + 254 + 92
    windows = model.windows(ids, all_windows=True)
    assert [len(w) for w in windows] == [256, 256, 94]
    assert all(w[0] == model.cls_id and w[-1] == model.sep_id for w in windows)
    assert model.windows(ids, all_windows=False) == windows[:1]
    assert model.windows([], all_windows=True) == [[model.cls_id, model.sep_id]]
    # given each piece's word, a window never ends inside one: pieces 252-255 are one word
    words = [*range(252), 252, 252, 252, 252, *range(253, 597)]
    aligned = model.windows(ids, all_windows=True, words=words)
    assert [len(w) for w in aligned] == [254, 256, 96]
    assert [i for w in aligned for i in w[1:-1]] == ids


def test_missing_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dense.ENV_DIR, str(tmp_path))
    with pytest.raises(LfbenchError, match="model files"):
        dense.model_dir()


def test_first_window_mode_matches_embed() -> None:
    docs = ["Bread baking needs flour, water, yeast and salt.", "Stocks fell on Monday."]
    q = dense.embed(["baking bread"])[0]
    expected = dense.embed(docs) @ q
    got = dense.dense_scores("baking bread", docs, whole_document=False)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # a short document is a single window: both modes agree
    np.testing.assert_allclose(dense.dense_scores("baking bread", docs), got, atol=1e-5)
