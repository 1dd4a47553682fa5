"""CRUD-RAG's records: the authors' benchmark file, the released event-summarisation records,
and the normalised dataset (`datasets/crud_rag.jsonl`, one `Item` per line).

The authors' file is one JSON object, task family -> list of records, each with an `ID` and:

| task family | retrieval query | prompt fields | reference |
|---|---|---|---|
| `event_summary` (Delete) | `event` | `event` | `summary` |
| `continuing_writing` (Create) | `beginning` | `beginning` | `continuing` |
| `questanswer_1doc`, `_2docs`, `_3docs` (Read) | `questions` | `questions` | `answers` |
| `hallu_modified` (Update) | `newsBeginning` | + `hallucinatedContinuation` | `hallucinatedMod` |

(the retrieval query is the one the authors' code uses). The released event-summarisation
records (data/crud_rag/event_summary.first1328.json, a JSON list) also carry the source news
`text`: the oracle context, and the retrieval corpus of the offline default. Errors name the
file, the task, the record (index and ID) and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from pipeline.benchmarks.crud_rag.params import TASKS, Task
from pipeline.core.errors import DataError
from pipeline.core.records import Record

# task family -> (retrieval query field, prompt fields, reference field)
FIELDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "event_summary": ("event", ("event",), "summary"),
    "continuing_writing": ("beginning", ("beginning",), "continuing"),
    "questanswer_1doc": ("questions", ("questions",), "answers"),
    "questanswer_2docs": ("questions", ("questions",), "answers"),
    "questanswer_3docs": ("questions", ("questions",), "answers"),
    "hallu_modified": (
        "newsBeginning",
        ("newsBeginning", "hallucinatedContinuation"),
        "hallucinatedMod",
    ),
}
# The authors' RAGQuestEval cache files: <class>_quest_gt_save.json, one per task family.
CACHE_CLASS = {
    "event_summary": "Summary",
    "continuing_writing": "ContinueWriting",
    "questanswer_1doc": "QuestAnswer1Doc",
    "questanswer_2docs": "QuestAnswer2Docs",
    "questanswer_3docs": "QuestAnswer3Docs",
    "hallu_modified": "HalluModified",
}
UNANSWERABLE = "无法推断"  # RAGQuestEval's "cannot infer" answer


def cache_file(task: str) -> str:
    return f"{CACHE_CLASS[task]}_quest_gt_save.json"


class QuestSet(Record):
    """RAGQuestEval's questions of one record: the key information, a question per piece, and
    each question's answer from the reference (the authors' cache entry, kept as it is: their
    released files hold empty entries and entries with fewer answers than questions)."""

    key_info: list[str] = Field(default_factory=list)
    question: list[str] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)
    source: str = Field(description="released (the authors' cache) or the judges entry")

    def kept(self) -> list[int]:
        """The good questions: those the reference itself answers. A question with no
        reference answer (past the end of `answers`) or answered "无法推断" is a bad question."""
        n = min(len(self.question), len(self.answers))
        return [i for i in range(n) if self.answers[i].strip() != UNANSWERABLE]


class Item(Record):
    """One line of datasets/crud_rag.jsonl."""

    item_id: str = Field(min_length=1, description="<task>/<ID>")
    record_id: str = Field(min_length=1)
    task: Task
    query: str = Field(min_length=1, description="what retrieval looks for")
    fields: dict[str, str] = Field(description="the task prompt's fields")
    reference: str = Field(min_length=1)
    oracle: str | None = Field(default=None, description="the record's own news text")
    quest_eval: QuestSet | None = None
    source: str


def _text(raw: Mapping[str, Any], key: str, where: str, task: str, rid: str) -> str:
    value = raw.get(key)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = "\n".join(value)
    if not isinstance(value, str) or not value.strip():
        raise DataError("missing or empty text", file=where, item=f"{task} record {rid}", field=key)
    return value.strip()


def record_item(raw: Any, task: str, index: int, where: str, source: str, oracle: bool) -> Item:
    """One record of a task family, validated into an item."""
    label = f"{task}[{index}]"
    if not isinstance(raw, dict):
        raise DataError("a record must be a JSON object", file=where, item=label)
    rid = raw.get("ID")
    if not isinstance(rid, str | int) or not str(rid).strip():
        raise DataError("missing record ID", file=where, item=label, field="ID")
    rid = str(rid)
    query_field, prompt_fields, ref_field = FIELDS[task]
    fields = {f: _text(raw, f, where, task, f"{label} ({rid})") for f in prompt_fields}
    own = raw.get("text") if oracle else None
    return Item(
        item_id=f"{task}/{rid}",
        record_id=rid,
        task=task,
        query=_text(raw, query_field, where, task, f"{label} ({rid})"),
        fields=fields,
        reference=_text(raw, ref_field, where, task, f"{label} ({rid})"),
        oracle=own.strip() if isinstance(own, str) and own.strip() else None,
        source=source,
    )


def parse_released(raw: Any, where: str, limit: int | None) -> tuple[list[Item], list[str]]:
    """The released event-summarisation records (a JSON list): the first `limit` as items, and
    every record's news text (the corpus)."""
    if not isinstance(raw, list) or not raw:
        raise DataError("expected a non-empty JSON list of records", file=where)
    items, seen = [], set()
    for n, rec in enumerate(raw):
        if limit is not None and n >= limit:
            break
        item = record_item(rec, "event_summary", n, where, "released:event_summary", True)
        if item.item_id in seen:
            raise DataError("ID used twice", file=where, item=f"event_summary[{n}]", field="ID")
        seen.add(item.item_id)
        items.append(item)
    texts = [_text(rec, "text", where, "event_summary", f"[{n}]") for n, rec in enumerate(raw)]
    return items, texts


def parse_benchmark(
    raw: Any, where: str, tasks: list[str], limit: int | None
) -> tuple[list[Item], list[str]]:
    """The authors' benchmark file: the first `limit` records of each asked task family, and
    the news texts its event-summarisation records carry (if any)."""
    if not isinstance(raw, dict):
        raise DataError("expected a JSON object: task family -> list of records", file=where)
    unknown = [k for k in raw if k not in TASKS]
    if unknown:
        raise DataError(
            f"unknown task family {unknown[0]!r}; known: {', '.join(TASKS)}", file=where
        )
    items: list[Item] = []
    texts: list[str] = []
    for task in tasks:
        records = raw.get(task)
        if not isinstance(records, list) or not records:
            raise DataError("no records for this task family", file=where, item=task)
        seen: set[str] = set()
        for n, rec in enumerate(records):
            if isinstance(rec, dict) and isinstance(rec.get("text"), str) and rec["text"].strip():
                texts.append(rec["text"].strip())
            if limit is not None and n >= limit:
                continue
            item = record_item(rec, task, n, where, f"file:{where}", task == "event_summary")
            if item.item_id in seen:
                raise DataError("ID used twice", file=where, item=f"{task}[{n}]", field="ID")
            seen.add(item.item_id)
            items.append(item)
    return items, texts


def parse_cache(raw: Any, where: str) -> dict[str, QuestSet]:
    """An authors' RAGQuestEval cache file: record ID -> {key_info, question, answers}.

    Entries are taken as the authors wrote them: an empty entry (`{}`) is a record with no
    question, and a question without a reference answer is a bad question (QuestSet.kept);
    a field of the wrong type is an error naming the file, the record and the field."""
    if not isinstance(raw, dict):
        raise DataError("expected a JSON object: record ID -> questions", file=where)
    out = {}
    for rid, entry in raw.items():
        if not isinstance(entry, dict):
            raise DataError("an entry must be a JSON object", file=where, item=rid)
        lists: dict[str, list[str]] = {}
        for key in ("key_info", "question", "answers"):
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise DataError("expected a list of strings", file=where, item=rid, field=key)
            lists[key] = value
        extra = sorted(set(entry) - set(lists))
        if extra:
            raise DataError(f"unknown field {extra[0]!r}", file=where, item=rid, field=extra[0])
        out[str(rid)] = QuestSet(**lists, source="released")
    return out


def cache_layout(sets: Mapping[str, QuestSet]) -> dict[str, dict[str, list[str]]]:
    """Questions in the authors' cache layout (record ID -> key_info, question, answers); an
    empty set is written as the authors' empty entry."""
    return {
        rid: (
            {"key_info": s.key_info, "question": s.question, "answers": s.answers}
            if (s.key_info or s.question or s.answers)
            else {}
        )
        for rid, s in sets.items()
    }
