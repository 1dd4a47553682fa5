"""CRUX's inputs: its released layout (a synthetic fixture in that layout), the offline default
derived from SummHay, the construction input file, and errors that name file, line and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.crux import construction, derived, layout, schema
from pipeline.core.errors import DataError
from pipeline.retrieval.tokens import count_tokens
from pipeline.stages.common import FileInputs

LAYOUT = Path(__file__).parent / "layout"


def read_layout(folder: Path, eta: int = 3) -> schema.Collection:
    return layout.read(FileInputs(folder.parent), folder.name, eta, "synthetic", count_tokens)


def test_layout_fixture_reads_into_a_collection() -> None:
    col = read_layout(LAYOUT)
    assert col.collection_id == "layout" and col.domain == "synthetic"
    q1, q2 = col.queries
    # sub-question 4 is answered by no passage (ratings 0, 0, 0, 0): dropped, the rest renumbered
    assert [s.qid for s in q1.subquestions] == ["q1", "q2", "q3"]
    assert [s.text for s in q1.dropped] == ["Which band closed the festival?"]
    # only the passages that answer something (rating >= 3) keep their ratings
    assert q1.ratings == {"p1": [5, 0, 3], "p2": [0, 4, 0], "p3": [3, 5, 0]}
    # Z*: p1 and p3 both answer two (tie: p1 first), then p2 and p3 add one each (p2 first)
    assert q1.zstar == ["p1", "p2"]
    # the run: score descending, ties (p2, p3 at 6.0) by rank
    assert q1.rankings == {"first-stage": ["p4", "p1", "p2", "p3", "p6"]}
    # q2: nothing answerable (ratings 2 and 1 < eta): no sub-questions left, kept and excluded later
    assert q2.subquestions == [] and len(q2.dropped) == 2 and q2.zstar == []
    # passages: the judged and the ranked ones; a title leads the text
    assert [p.pid for p in col.passages] == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert col.passages[0].text.startswith("Festival opens\n")
    assert all(p.tokens == count_tokens(p.text) for p in col.passages)
    # eta is a parameter: at 5 only the 5s answer
    # (sub-questions 1 and 2 kept; the ratings themselves are kept as given)
    assert read_layout(LAYOUT, eta=5).queries[0].ratings == {"p1": [5, 0], "p3": [3, 5]}


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "crux"
    shutil.copytree(LAYOUT, dest)
    return dest


def _rewrite(path: Path, line: int, edit: Any) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    edit(rows[line - 1])
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.mark.parametrize(
    ("file", "line", "edit", "item", "field"),
    [
        (
            "judgements/test.jsonl",
            2,
            lambda r: r.update(rating=[0, "four", 0, 0]),
            "q1/p2",
            "rating",
        ),
        ("judgements/test.jsonl", 3, lambda r: r.update(rating=[3, 5, 0]), "q1/p3", "rating"),
        ("judgements/test.jsonl", 1, lambda r: r.pop("docid"), "q1", "docid"),
        ("judgements/test.jsonl", 4, lambda r: r.update(docid="p99"), "q1/p99", "docid"),
        ("topic/test.jsonl", 2, lambda r: r.pop("request"), "q2", "request"),
        (
            "subtopics/test.jsonl",
            1,
            lambda r: r.update(subquestions=["ok", ""]),
            "q1",
            "subquestions",
        ),
        ("corpus/corpus.jsonl", 3, lambda r: r.update(contents="  "), "p3", "contents"),
        # lines about a query topic/ does not have, and repeated lines (issue 26, point 6)
        ("judgements/test.jsonl", 4, lambda r: r.update(id="q9"), "q9/p4", "id"),
        ("judgements/test.jsonl", 5, lambda r: r.update(id="q3", docid="p99"), "q3/p99", "id"),
        ("judgements/test.jsonl", 4, lambda r: r.update(docid="p3"), "q1/p3", None),
        ("subtopics/test.jsonl", 2, lambda r: r.update(id="q9"), "q9", "id"),
        ("corpus/corpus.jsonl", 6, lambda r: r.update(id="p5"), "p5", None),
    ],
)
def test_layout_errors_name_file_line_item_and_field(
    tmp_path: Path, file: str, line: int, edit: Any, item: str, field: str | None
) -> None:
    folder = _copy(tmp_path)
    _rewrite(folder / file, line, edit)
    with pytest.raises(DataError) as e:
        read_layout(folder)
    assert e.value.file == f"crux/{file}:{line}"
    assert (e.value.item, e.value.field) == (item, field)


def test_layout_errors_for_a_broken_run_and_a_missing_topic_folder(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    (folder / "runs" / "first-stage.run").write_text("q1 Q0 p1 1 high tag\n")
    with pytest.raises(DataError, match="rank and score must be numbers") as e:
        read_layout(folder)
    assert e.value.file == "crux/runs/first-stage.run:1"
    shutil.rmtree(folder / "topic")
    with pytest.raises(DataError, match="no topic/"):
        read_layout(folder)


def test_derived_from_a_haystack_exactly_as_specified(haystack: dict[str, Any]) -> None:
    from pipeline.data.haystacks import normalise, parse_raw_haystack

    hay = normalise("news1", parse_raw_haystack(haystack, "h.json"), "h.json")
    col = derived.collection(hay, eta=3)
    assert col.source == "derived:summhay" and col.domain == "news"
    assert [p.pid for p in col.passages] == ["news1:1", "news1:2", "news1:3"]
    s1, s2 = col.queries
    assert s1.query == "What about one?" and [s.qid for s in s1.subquestions] == ["i1", "i2"]
    # i1 is in documents 1 and 2, i2 in document 3: rating 5 where held, else 0 (absent)
    assert s1.ratings == {"news1:1": [5, 0], "news1:2": [5, 0], "news1:3": [0, 5]}
    # greedy cover: documents 1 and 2 tie on i1 (position 1 first), then document 3
    assert s1.zstar == ["news1:1", "news1:3"]
    # released scores descending (the stale id "zz" of another haystack ignored)
    assert s1.rankings["oracle"] == ["news1:1", "news1:2", "news1:3"]
    assert s2.ratings == {"news1:2": [5]} and s2.zstar == ["news1:2"]


def test_an_insight_no_document_holds_is_dropped(haystack: dict[str, Any]) -> None:
    from pipeline.data.haystacks import normalise, parse_raw_haystack

    for doc in haystack["documents"]:
        doc["insights_included"] = [i for i in doc["insights_included"] if i != "i3"]
    hay = normalise("news1", parse_raw_haystack(haystack, "h.json"), "h.json")
    s2 = derived.collection(hay, eta=3).queries[1]
    assert s2.subquestions == [] and [d.qid for d in s2.dropped] == ["i3"] and s2.zstar == []


def test_collection_validation_names_the_field() -> None:
    good = read_layout(LAYOUT).model_dump()
    bad = json.loads(json.dumps(good))
    bad["queries"][0]["ratings"]["p1"] = [5, 0]
    with pytest.raises(ValueError, match=r"ratings\.p1: 2 ratings for 3 sub-questions"):
        schema.Collection.model_validate(bad)
    bad = json.loads(json.dumps(good))
    bad["queries"][0]["zstar"] = ["p6"]
    with pytest.raises(ValueError, match="zstar: 'p6' answers nothing"):
        schema.Collection.model_validate(bad)


def test_construction_input_errors(tmp_path: Path) -> None:
    p = tmp_path / "mine.jsonl"
    rows = [
        {"id": "a", "reference": "A report.", "documents": ["Doc one.", "Doc two."]},
        {"id": "b", "reference": "Another.", "documents": []},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DataError) as e:
        construction.sources(FileInputs(tmp_path).jsonl("mine.jsonl"))
    assert (e.value.file, e.value.item, e.value.field) == ("mine.jsonl:2", "b", "documents")
    p.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(DataError, match="id used twice"):
        construction.sources(FileInputs(tmp_path).jsonl("mine.jsonl"))


@pytest.mark.parametrize("ident", [None, True, 1.5, "", "  ", ["a"]])
def test_an_id_that_is_not_a_string_or_whole_number_is_an_error(
    tmp_path: Path, ident: object
) -> None:
    """`"id": null` was read as the id "None" (issue 26, point 5's class, in CRUX's inputs)."""
    p = tmp_path / "mine.jsonl"
    p.write_text(json.dumps({"id": ident, "reference": "R.", "documents": ["D."]}) + "\n")
    with pytest.raises(DataError, match="must be a non-empty string or a whole number") as e:
        construction.sources(FileInputs(tmp_path).jsonl("mine.jsonl"))
    assert (e.value.file, e.value.field) == ("mine.jsonl:1", "id")
    folder = _copy(tmp_path)
    _rewrite(folder / "judgements/test.jsonl", 2, lambda r: r.update(id=ident))
    with pytest.raises(DataError, match="must be a non-empty string or a whole number") as e:
        read_layout(folder)
    assert (e.value.file, e.value.field) == ("crux/judgements/test.jsonl:2", "id")


def test_a_corpus_file_that_is_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    """Issue 26, point 7: bad bytes are an error naming the file and line, not a traceback."""
    folder = _copy(tmp_path)
    path = folder / "corpus" / "corpus.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"Local", b"Loc\xe9l")  # Latin-1, not UTF-8
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match="not valid UTF-8") as e:
        read_layout(folder)
    assert (e.value.file, e.value.line) == ("crux/corpus/corpus.jsonl", 4)


def test_run_lines_for_unknown_queries_or_passages_are_counted_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run file may rank passages the corpus folder does not hold: dropped, but counted and
    said once per run file (issue 26: unknown ids are never ignored without a word)."""
    with caplog.at_level("WARNING", logger="pipeline.benchmarks.crux.layout"):
        read_layout(LAYOUT)
    assert caplog.records == []
    folder = _copy(tmp_path)
    run = folder / "runs" / "first-stage.run"
    run.write_text(run.read_text() + "q1 Q0 p77 6 0.5 first-stage\nq9 Q0 p1 1 1.0 first-stage\n")
    with caplog.at_level("WARNING", logger="pipeline.benchmarks.crux.layout"):
        col = read_layout(folder)
    assert "p77" not in col.queries[0].rankings["first-stage"]
    [record] = caplog.records
    assert "run first-stage (crux/runs/first-stage.run): 1 ranked passages not in the corpus" in (
        record.getMessage()
    )
    assert "1 queries not in topic/ skipped (e.g. 'q9')" in record.getMessage()
