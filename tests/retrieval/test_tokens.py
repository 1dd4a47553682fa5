"""cl100k_base counting and truncation, offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.retrieval import tokens


def test_known_counts() -> None:
    assert tokens.encoding_name() == "cl100k_base"
    assert tokens.count_tokens("hello world") == 2
    assert tokens.count_tokens("tiktoken is great!") == 6
    assert tokens.encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert tokens.count_tokens("") == 0
    # special-token strings inside documents are ordinary text
    assert tokens.count_tokens("<|endoftext|>") > 1
    assert tokens.count_tokens_batch(["hello world", "tiktoken is great!"]) == [2, 6]


def test_pattern_matches_installed_tiktoken() -> None:
    import inspect

    from tiktoken_ext import openai_public  # type: ignore[import-untyped]

    assert tokens.CL100K_PAT_STR in inspect.getsource(openai_public.cl100k_base)
    assert tokens.CL100K_SHA256 in inspect.getsource(openai_public.cl100k_base)


TEXT = "Le café coûte 3€ — 日本語のテキスト. The quick brown fox jumps over the lazy dog.\n\n" * 4


def test_truncation_is_exact() -> None:
    total = tokens.count_tokens(TEXT)
    ids = tokens.encode(TEXT)
    for n in range(total + 2):
        cut = tokens.truncate_tokens(TEXT, n)
        assert TEXT.startswith(cut)
        k = tokens.count_tokens(cut)
        assert k <= n
        if n >= total:
            assert cut == TEXT
    # on a plain ASCII text every cut is exact: the prefix is the first n tokens
    ascii_text = "The quick brown fox jumps over the lazy dog. " * 20
    ids = tokens.encode(ascii_text)
    for n in (1, 7, 50, 123):
        cut = tokens.truncate_tokens(ascii_text, n)
        assert tokens.encode(cut) == ids[:n]
    with pytest.raises(ValueError):
        tokens.truncate_tokens(TEXT, -1)


def test_missing_or_wrong_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokens.ENV_FILE, str(tmp_path / "nope.tiktoken"))
    with pytest.raises(LfbenchError, match="cannot read"):
        tokens._load_ranks(tokens.bpe_file())
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setenv(tokens.ENV_FILE, str(bad))
    with pytest.raises(LfbenchError, match="sha256"):
        tokens._load_ranks(tokens.bpe_file())


def test_bundled_file_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tokens.ENV_FILE, raising=False)
    path = tokens.bpe_file()
    assert path.name == "cl100k_base.tiktoken"
    assert path.is_file()
