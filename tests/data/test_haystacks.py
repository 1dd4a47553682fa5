"""Haystack validation names the file, the subtopic (or document) and the field of a defect."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import DataError
from pipeline.data.haystacks import (
    load_raw_haystack,
    normalise,
    parse_summary_key,
)

Writer = Callable[[dict[str, Any], str], Path]


def test_valid_haystack_normalises(haystack: dict[str, Any], write_haystack: Writer) -> None:
    path = write_haystack(haystack, "topic_news1.json")
    hay = normalise("news1", load_raw_haystack(path), source_file=path.name)
    assert hay.domain == "news" and hay.participants == ["a", "b"]
    assert [d.position for d in hay.documents] == [1, 2, 3]
    s1 = hay.subtopics[0]
    assert s1.item_id == "news1/s1"
    # i1 is planted in documents 1 and 2, i2 in document 3
    assert {i.insight_id: i.gold_docs for i in s1.insights} == {"i1": [1, 2], "i2": [3]}
    # The stale score for "zz" (a document of another haystack) is dropped; order = positions.
    assert s1.retriever_scores["oracle"] == [2.0, 1.0, 0.0]


def _error(data: dict[str, Any], write: Writer) -> DataError:
    path = write(data, "topic_news1.json")
    with pytest.raises(DataError) as info:
        load_raw_haystack(path)
    assert info.value.file == str(path)
    return info.value


def test_missing_insight_id_names_subtopic_and_field(
    haystack: dict[str, Any], write_haystack: Writer
) -> None:
    del haystack["subtopics"][1]["insights"][0]["insight_id"]
    err = _error(haystack, write_haystack)
    assert err.item == "subtopic 's2' (subtopics[1])"
    assert err.field == "insights[0].insight_id"
    assert "Field required" in str(err)


def test_bad_coverage_label(haystack: dict[str, Any], write_haystack: Writer) -> None:
    evals = haystack["subtopics"][0]["eval_summaries"]["summary_subtopic_oracle_sysA"]
    evals[1]["coverage"] = "MOSTLY"
    err = _error(haystack, write_haystack)
    assert err.item == "subtopic 's1' (subtopics[0])"
    assert err.field == "eval_summaries.summary_subtopic_oracle_sysA[1].coverage"


def test_retriever_missing_a_document(haystack: dict[str, Any], write_haystack: Writer) -> None:
    del haystack["subtopics"][0]["retriever"]["random"]["d2"]
    err = _error(haystack, write_haystack)
    assert (err.item, err.field) == ("subtopic 's1' (subtopics[0])", "retriever.random")
    assert "'d2'" in str(err)


def test_document_with_unknown_insight(haystack: dict[str, Any], write_haystack: Writer) -> None:
    haystack["documents"][2]["insights_included"].append("ghost")
    err = _error(haystack, write_haystack)
    assert err.item == "document 'd3' (documents[2])"
    assert err.field == "insights_included[1]"


def test_judgement_for_foreign_insight(haystack: dict[str, Any], write_haystack: Writer) -> None:
    evals = haystack["subtopics"][1]["eval_summaries"]["summary_subtopic_oracle_sysA"]
    evals[0]["insight_id"] = "i1"  # an insight of s1, not s2
    err = _error(haystack, write_haystack)
    assert err.item == "subtopic 's2' (subtopics[1])"
    assert err.field == "eval_summaries.summary_subtopic_oracle_sysA[0].insight_id"


def test_duplicate_subtopic_id(haystack: dict[str, Any], write_haystack: Writer) -> None:
    haystack["subtopics"][1]["subtopic_id"] = "s1"
    err = _error(haystack, write_haystack)
    assert err.field == "subtopic_id" and "duplicate" in str(err)


def test_wrong_type_names_the_field(haystack: dict[str, Any], write_haystack: Writer) -> None:
    haystack["documents"][0]["document_text"] = 42
    err = _error(haystack, write_haystack)
    assert (err.item, err.field) == ("document 'd1' (documents[0])", "document_text")


def test_not_json(write_haystack: Writer, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"topic_id": ', encoding="utf-8")
    with pytest.raises(DataError, match="not valid JSON") as info:
        load_raw_haystack(path)
    assert info.value.file == str(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_raw_haystack(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("summary_subtopic_gpt-4o", ("gpt-4o", "full")),
        ("summary_subtopic_oracle_claude3-opus", ("claude3-opus", "oracle")),
        ("summary_subtopic_dwzhu/e5-base-4k_gpt3.5", ("gpt3.5", "longembed")),
        ("summary_subtopic_fl-ctxt-rev-sort_gemini-1.5-pro", ("gemini-1.5-pro", "full-rev-sort")),
    ],
)
def test_parse_summary_key(key: str, expected: tuple[str, str]) -> None:
    assert parse_summary_key(key) == expected


def test_parse_summary_key_rejects_unknown_retriever() -> None:
    with pytest.raises(ValueError, match="unknown retriever"):
        parse_summary_key("summary_subtopic_magic_gpt-4o")
