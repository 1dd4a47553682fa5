"""Windows of N tokens of a passage (pipeline/retrieval/windows.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import ConfigError
from pipeline.retrieval.windows import cut, token_spans, windows

TEXT = (
    "Solar panels got cheaper this year. Investors, wary of rates, still bought them. "
    "Zürich's utility said déjà vu: demand rose 12.5% in Q2."
)


def test_cl100k_windows_are_spans_of_the_text_that_cover_every_token() -> None:
    from pipeline.retrieval.tokens import encode

    spans = token_spans("cl100k_base")([TEXT])[0]
    assert len(spans) == len(encode(TEXT))
    ws = windows(TEXT, spans, 7)
    assert len(ws) == -(-len(spans) // 7)
    # each window is a piece of the text, in order, and together they hold all of it
    assert "".join(ws) == TEXT
    assert all(len(encode(w)) <= 8 for w in ws)  # a boundary may re-merge one token


def test_minilm_windows_are_the_word_pieces_the_dense_retriever_embeds() -> None:
    from pipeline.retrieval.dense import get_model

    model = get_model()
    text = " ".join([TEXT] * 12)
    ws = cut([text], 20, "minilm")[0]
    ids = model.word_pieces([text])[0]
    assert len(ws) == -(-len(ids) // 20)
    # the windows, tokenised again, are the dense retriever's windows (but for a word cut in
    # two at a boundary, whose second half is read as a word of its own)
    again = [i for w in ws for i in model.word_pieces([w])[0]]
    same = sum(a == b for a, b in zip(again, ids, strict=False))
    assert same >= 0.95 * len(ids)


def test_no_window_size_keeps_the_text_whole_and_an_empty_text_is_one_window() -> None:
    assert cut(["a b c", ""], None, "cl100k_base") == [["a b c"], [""]]
    assert cut([""], 5, "cl100k_base") == [[""]]


def test_a_tokenizer_file_that_is_not_there_or_not_a_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        token_spans("nope/tokenizer.json", str(tmp_path))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"not a tokenizer\.json"):
        token_spans("tokenizer.json", str(tmp_path))
