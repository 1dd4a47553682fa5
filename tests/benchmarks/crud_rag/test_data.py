"""CRUD-RAG's inputs: the authors' benchmark file (a synthetic fixture of every task family),
the released event-summarisation records, the authors' RAGQuestEval caches, and errors that
name the file, the task, the record and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.benchmarks.crud_rag.benchmark import RELEASED_FILE, CrudRag
from pipeline.benchmarks.crud_rag.schema import (
    CACHE_CLASS,
    cache_file,
    cache_layout,
    parse_benchmark,
    parse_cache,
    parse_released,
)
from pipeline.core.errors import ConfigError, DataError
from tests.benchmarks.crud_rag.helpers import ALL_TASKS, HERE, ctx

BENCH = CrudRag()
SPLIT = HERE / "fixture" / "crud_split.json"
RELEASED_CACHES = [
    "HalluModified_quest_gt_save.json",
    "QuestAnswer1Doc_quest_gt_save.json",
    "QuestAnswer2Docs_quest_gt_save.json",
    "QuestAnswer3Docs_quest_gt_save.json",
]


def test_every_task_family_of_the_fixture_becomes_items_with_its_fields() -> None:
    built = BENCH.construct(ctx(), None)
    by_id = {i.item_id: i for i in built.records}
    assert sorted({i.task for i in built.records}) == sorted(ALL_TASKS)
    assert len(built.records) == 7
    hm = by_id["hallu_modified/hm-1"]
    assert hm.query == "山城县第五届苹果节今天开幕。"
    assert set(hm.fields) == {"newsBeginning", "hallucinatedContinuation"}
    assert hm.reference == "今年苹果产量比去年增长一成。"
    qa = by_id["questanswer_1doc/qa1-1"]
    assert (qa.query, qa.reference) == ("海滨市首条地铁线路全长多少公里？", "二十公里")
    # the oracle context: only event-summarisation records carry their news text
    assert by_id["event_summary/es-1"].oracle is not None and qa.oracle is None
    # the cached record has its questions, used as they are; the others have none (no llm)
    assert qa.quest_eval is not None and qa.quest_eval.source == "released"
    assert qa.quest_eval.kept() == [0]  # the second question is one the reference cannot answer
    assert sum(1 for i in built.records if i.quest_eval is not None) == 1
    # the side files: each task's cache in the authors' layout, the cached entry unchanged
    assert set(built.files) == {cache_file(t) for t in ALL_TASKS}
    written = built.files["QuestAnswer1Doc_quest_gt_save.json"]
    assert written == json.loads(
        (HERE / "fixture" / "QuestAnswer1Doc_quest_gt_save.json").read_text()
    )


def test_the_construct_line_names_no_model_when_none_writes_questions() -> None:
    """With no `quest_eval.llm` (the default) the line said "0 written by None"."""
    line = BENCH.construct(ctx(), None).summary
    assert "None" not in line, line
    assert "1 from the authors' caches, none written by a model (quest_eval.llm not set)" in line


def test_records_limits_each_task_family() -> None:
    built = BENCH.construct(ctx(records=1), None)
    assert sum(1 for i in built.records if i.task == "event_summary") == 1
    # the corpus still has every news item of the corpus folder
    assert len(BENCH.corpus(ctx(records=1))) == 3


@pytest.mark.parametrize(
    ("task", "field", "value"),
    [
        ("hallu_modified", "hallucinatedMod", ""),
        ("questanswer_2docs", "questions", None),
        ("continuing_writing", "beginning", 7),
        ("event_summary", "ID", None),
    ],
)
def test_a_bad_field_is_named_with_file_task_and_record(
    task: str, field: str, value: object
) -> None:
    raw = json.loads(SPLIT.read_text(encoding="utf-8"))
    if value is None:
        del raw[task][0][field]
    else:
        raw[task][0][field] = value
    with pytest.raises(DataError) as e:
        parse_benchmark(raw, "inputs/crud_rag/mine.json", ALL_TASKS, None)
    msg = str(e.value)
    assert "inputs/crud_rag/mine.json" in msg and task in msg and field in msg
    if field != "ID":
        assert raw[task][0]["ID"] in msg


def test_unknown_family_missing_family_and_repeated_id() -> None:
    raw = json.loads(SPLIT.read_text(encoding="utf-8"))
    with pytest.raises(DataError, match="unknown task family 'summary'"):
        parse_benchmark({**raw, "summary": []}, "f.json", ALL_TASKS, None)
    with pytest.raises(DataError, match="no records for this task family"):
        parse_benchmark({"event_summary": raw["event_summary"]}, "f.json", ALL_TASKS, None)
    twice = {**raw, "event_summary": raw["event_summary"] + raw["event_summary"][:1]}
    with pytest.raises(DataError, match="ID used twice"):
        parse_benchmark(twice, "f.json", ["event_summary"], None)


def test_released_tasks_other_than_event_summary_are_refused() -> None:
    with pytest.raises(ConfigError, match="event summarisation only"):
        ctx(source="released", tasks=["questanswer_1doc"])


def test_released_records_parse_and_carry_the_corpus(mirror: Path) -> None:
    raw = json.loads((mirror / "crud_rag" / RELEASED_FILE).read_text(encoding="utf-8"))
    items, texts = parse_released(raw, RELEASED_FILE, None)
    assert len(items) == len(texts) == 1328
    assert len({i.item_id for i in items}) == 1328
    assert all(i.oracle and i.reference and i.query for i in items)
    first, _ = parse_released(raw, RELEASED_FILE, 5)
    assert [i.record_id for i in first] == [r["ID"] for r in raw[:5]]


def test_a_malformed_released_record_names_its_index_id_and_field(mirror: Path) -> None:
    raw = json.loads((mirror / "crud_rag" / RELEASED_FILE).read_text(encoding="utf-8"))[:3]
    raw[2] = {**raw[2], "summary": "  "}
    with pytest.raises(DataError) as e:
        parse_released(raw, "data/crud_rag/x.json", None)
    assert "data/crud_rag/x.json" in str(e.value) and "event_summary[2]" in str(e.value)
    assert raw[2]["ID"] in str(e.value) and "summary" in str(e.value)


@pytest.mark.parametrize("name", RELEASED_CACHES)
def test_every_entry_of_the_released_caches_parses_and_writes_back_unchanged(
    mirror: Path, name: str
) -> None:
    raw = json.loads((mirror / "crud_rag" / name).read_text(encoding="utf-8"))
    parsed = parse_cache(raw, name)
    assert len(parsed) == len(raw) > 0
    assert cache_layout(parsed) == raw  # the authors' layout, entry for entry
    # every entry either has good questions or is counted as a record without any
    assert all(all(i < len(s.answers) for i in s.kept()) for s in parsed.values())
    assert name in {cache_file(t) for t in CACHE_CLASS}


def test_cache_entries_as_the_authors_wrote_them_and_a_bad_type_named() -> None:
    good = {"r1": {"key_info": ["a"], "question": ["q1", "q2"], "answers": ["a1", "无法推断"]}}
    assert parse_cache(good, "c.json")["r1"].kept() == [0]
    # the released files hold empty entries and fewer answers than questions: a question with
    # no reference answer is a bad question, an empty entry a record with none
    short = parse_cache({"r1": {"question": ["q1", "q2"], "answers": ["a1"]}, "r2": {}}, "c.json")
    assert short["r1"].kept() == [0] and short["r2"].kept() == []
    assert cache_layout(short)["r2"] == {}
    with pytest.raises(DataError) as e:
        parse_cache({"r3": {"question": "q1", "answers": []}}, "c.json")
    assert "c.json" in str(e.value) and "r3" in str(e.value) and "question" in str(e.value)
    with pytest.raises(DataError, match="unknown field 'answer'"):
        parse_cache({"r4": {"question": ["q"], "answer": ["a"]}}, "c.json")
