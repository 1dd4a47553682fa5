"""Windows of N tokens of a passage (pipeline/retrieval/windows.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import ConfigError
from pipeline.retrieval.boundaries import window_starts
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
    # words of several pieces (photovoltaics: photo ##vo ##lta ##ics) among words of one
    text = " ".join([TEXT, "Photovoltaics and hyperparameterization, unsubstantiated."] * 12)
    ws = cut([text], 20, "minilm")[0]
    (ids, words), *_ = model.words([text])
    starts = window_starts(len(ids), 20, words)
    # as the dense retriever cuts (its windows are 254 pieces: the same rule)
    dense_windows = [ids[a:b] for a, b in zip(starts, [*starts[1:], len(ids)], strict=True)]
    # the windows, tokenised again, are exactly those pieces: no word is cut at a boundary (a
    # cut word's second half would be read as a word of its own)
    assert model.word_pieces(ws) == dense_windows
    assert all(len(w) <= 20 for w in dense_windows) and len(ws) >= -(-len(ids) // 20)
    # some boundary moved back to a word's start
    assert any(len(w) < 20 for w in dense_windows[:-1])


def test_window_starts_never_fall_inside_a_word() -> None:
    assert window_starts(0, 4) == [0] and window_starts(4, 4) == [0]
    assert window_starts(10, 4) == [0, 4, 8]  # no words given: every `size` tokens
    # words: aa b ccc dd e  -> tokens 0,0,1,2,2,2,3,3,4
    words = [0, 0, 1, 2, 2, 2, 3, 3, 4]
    assert window_starts(9, 4, words) == [0, 3, 6]  # not at 4 (inside ccc) nor 7 (inside dd)
    assert window_starts(9, 2, [0, 0, 0, 0, 0, 1, 1, 2, 2]) == [0, 2, 4, 5, 7]  # a long word cut
    assert window_starts(3, 2, [None, 0, 0]) == [0, 1]  # a special token is a word of its own


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
