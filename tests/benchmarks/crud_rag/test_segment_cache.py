"""CRUD-RAG's corpus segmentation is kept in a cache that every stage of a project shares: a
text segmented once is read back, not cut by jieba again, with the very same words
(pipeline/benchmarks/crud_rag/text.py)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from pipeline.benchmarks.crud_rag import text as T

TEXTS = [
    "国务院常务会议部署进一步扩大内需。",
    "北京市今天发布暴雨蓝色预警，预计夜间有强降雨。",
    "Apple 公司发布了新款 iPhone，售价 5999 元！",
    "  ",
]


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    T._WORDS.clear()


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM words").fetchone()[0])


def test_segmented_once_then_read_back_with_the_same_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "segments.sqlite"
    T.segment_all(TEXTS, cache)
    first = {t: T.words(t) for t in TEXTS}
    assert first[TEXTS[0]][:2] == ["国务院", "常务会议"]  # jieba's words, not characters
    assert "，" not in first[TEXTS[1]] and "iphone" in first[TEXTS[2]]  # no punctuation, lower
    assert first[TEXTS[3]] == []
    assert _rows(cache) == len(TEXTS)

    # another process (the memo cleared), jieba unavailable: every text comes from the cache
    T._WORDS.clear()

    def no_jieba(text: str) -> tuple[str, ...]:
        raise AssertionError(f"segmented again: {text}")

    monkeypatch.setattr(T, "_segment", no_jieba)
    T.segment_all(TEXTS, cache)
    assert {t: T.words(t) for t in TEXTS} == first


def test_another_segmenter_does_not_read_these_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "segments.sqlite"
    T.segment_all(TEXTS[:2], cache)
    T._WORDS.clear()
    # another jieba or another version of text.py: its own keys, segmented again
    monkeypatch.setattr(T, "segmenter_id", lambda: "jieba=0.0/other-rules")
    cut: list[str] = []
    real = T._segment
    monkeypatch.setattr(T, "_segment", lambda t: cut.append(t) or real(t))
    T.segment_all(TEXTS[:2], cache)
    assert sorted(cut) == sorted(TEXTS[:2])
    assert _rows(cache) == 4


def test_the_env_names_the_shared_file_and_an_unusable_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared" / "segs.sqlite"
    monkeypatch.setenv(T.ENV_SEGMENT_CACHE, str(shared))
    assert T.segment_cache_path() == shared
    T.segment_all(TEXTS[:1])
    assert _rows(shared) == 1

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    T._WORDS.clear()
    with caplog.at_level(logging.WARNING):
        T.segment_all(TEXTS[:1], blocker / "segs.sqlite")
    assert T.words(TEXTS[0])[:1] == ["国务院"]
    assert "segment cache" in caplog.text and "not used" in caplog.text
