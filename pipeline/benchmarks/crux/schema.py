"""CRUX's records, and CRUX's released data layout.

The normalised dataset (`datasets/crux.jsonl`) holds one `Collection` per line: a pool of
passages and the queries over it. A query carries its sub-questions (only the answerable ones;
the others are kept apart in `dropped`), the graded ratings (0-5) of the passages that answer
something (every other passage rates 0 for every sub-question), the oracle context Z* (a greedy
cover of the sub-questions, in greedy order), and the rankings released with the data.

CRUX's own layout (`crux.source: <folder>`), as its authors release it:

    topic/*.jsonl        {"id": <query id>, "request": <the report request>}
    subtopics/*.jsonl    {"id": <query id>, "subquestions": [<text>, ...]}
    judgements/*.jsonl   {"id": <query id>, "docid": <passage id>, "rating": [<0-5>, ...]}
                         (one rating per sub-question, in order)
    corpus/*.jsonl       {"id" or "_id": <passage id>, "contents" or "text": ..., "title": ...}
    runs/<name>.run      optional: TREC runs (`qid Q0 docid rank score tag`), one per retriever
    reports/*.jsonl      optional: {"id": <query id>, "report": <the reference answer>}

Every error names the file, the line and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, model_validator

from pipeline.core.errors import DataError, first_error
from pipeline.core.records import Record


class Passage(Record):
    pid: str = Field(min_length=1)
    text: str = Field(min_length=1)
    tokens: int = Field(ge=0, description="cl100k_base tokens of the text")
    position: int | None = Field(default=None, description="SummHay: the haystack position")


class SubQuestion(Record):
    qid: str = Field(min_length=1)
    text: str = Field(min_length=1)


class Query(Record):
    item_id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    subquestions: list[SubQuestion] = Field(description="the answerable ones, in order")
    dropped: list[SubQuestion] = Field(
        default_factory=list, description="generated, but no passage answers them (excluded)"
    )
    ratings: dict[str, list[int]] = Field(
        description="passage id -> its rating of each sub-question; absent passages rate 0"
    )
    zstar: list[str] = Field(description="the oracle context: a greedy cover, in greedy order")
    rankings: dict[str, list[str]] = Field(
        default_factory=dict, description="released rankings: retriever -> passage ids"
    )
    reference: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Query:
        n = len(self.subquestions)
        for pid, row in self.ratings.items():
            if len(row) != n:
                raise ValueError(f"ratings.{pid}: {len(row)} ratings for {n} sub-questions")
            if any(not 0 <= r <= 5 for r in row):
                raise ValueError(f"ratings.{pid}: ratings are 0 to 5, got {row}")
        for pid in self.zstar:
            if pid not in self.ratings:
                raise ValueError(f"zstar: {pid!r} answers nothing (it has no ratings)")
        return self

    def rating(self, pid: str, q: int) -> int:
        row = self.ratings.get(pid)
        return row[q] if row is not None else 0


class Collection(Record):
    """One line of datasets/crux.jsonl: a pool of passages and the queries over it."""

    collection_id: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    source: str = Field(description="derived:summhay, or the folder of CRUX's layout")
    passages: list[Passage]
    queries: list[Query]

    @model_validator(mode="after")
    def _known_passages(self) -> Collection:
        pids = {p.pid for p in self.passages}
        if len(pids) != len(self.passages):
            raise ValueError("passages: a pid appears twice")
        for q in self.queries:
            for where, ids in (("ratings", list(q.ratings)), ("zstar", q.zstar)):
                unknown = [i for i in ids if i not in pids]
                if unknown:
                    raise ValueError(f"queries.{q.item_id}.{where}: unknown passage {unknown[0]!r}")
        return self


@dataclass(frozen=True)
class QueryView:
    """A query with the passages of its collection (what generation and judging look at)."""

    query: Query
    passages: Mapping[str, Passage]
    position: int = 0  # the query's place in its collection (0-based)


# ---------------------------------------------------------------- CRUX's released layout


def _field(raw: Any, key: str, kind: type | tuple[type, ...], where: str, item: str | None) -> Any:
    if not isinstance(raw, dict) or key not in raw:
        raise DataError("missing field", file=where, item=item, field=key)
    value = raw[key]
    if not isinstance(value, kind):
        raise DataError(
            f"expected {getattr(kind, '__name__', kind)}", file=where, item=item, field=key
        )
    return value


def ident(raw: Any, where: str, keys: Sequence[str] = ("id",)) -> str:
    """A line's id: a non-empty string or a whole number (null, true, 1.5 or "" is an error)."""
    for k in keys:
        value = raw.get(k) if isinstance(raw, dict) else None
        if isinstance(value, bool) or not isinstance(value, str | int):
            continue
        if str(value).strip():
            return str(value)
    present = isinstance(raw, dict) and any(k in raw for k in keys)
    raise DataError(
        "must be a non-empty string or a whole number" if present else "missing field",
        file=where,
        field=keys[0],
    )


def topics(lines: Sequence[tuple[str, Any]]) -> dict[str, tuple[str, str]]:
    """query id -> (request, where)."""
    out: dict[str, tuple[str, str]] = {}
    for where, raw in lines:
        qid = ident(raw, where)
        text = _field(raw, "request", str, where, qid)
        if qid in out:
            raise DataError(f"query listed twice (first at {out[qid][1]})", file=where, item=qid)
        out[qid] = (text, where)
    return out


def subquestions(lines: Sequence[tuple[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for where, raw in lines:
        qid = ident(raw, where)
        if qid in first:
            raise DataError(f"query listed twice (first at {first[qid]})", file=where, item=qid)
        first[qid] = where
        qs = _field(raw, "subquestions", list, where, qid)
        if not all(isinstance(q, str) and q.strip() for q in qs):
            raise DataError(
                "expected a list of non-empty strings", file=where, item=qid, field="subquestions"
            )
        out[qid] = [q.strip() for q in qs]
    return out


def judgements(lines: Sequence[tuple[str, Any]]) -> dict[str, dict[str, tuple[list[int], str]]]:
    """query id -> passage id -> (ratings, where)."""
    out: dict[str, dict[str, tuple[list[int], str]]] = {}
    for where, raw in lines:
        qid = ident(raw, where)
        pid = str(_field(raw, "docid", (str, int), where, qid))
        rating = _field(raw, "rating", (list, int), where, qid)
        ratings = rating if isinstance(rating, list) else [rating]
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= 5 for r in ratings):
            raise DataError(
                "ratings are whole numbers 0 to 5", file=where, item=f"{qid}/{pid}", field="rating"
            )
        if pid in out.get(qid, {}):
            raise DataError(
                f"this query and passage are judged twice (first at {out[qid][pid][1]})",
                file=where,
                item=f"{qid}/{pid}",
            )
        out.setdefault(qid, {})[pid] = (list(ratings), where)
    return out


def corpus(lines: Sequence[tuple[str, Any]]) -> dict[str, tuple[str, str]]:
    """passage id -> (text, where); a title, when given, leads the text."""
    out: dict[str, tuple[str, str]] = {}
    for where, raw in lines:
        pid = ident(raw, where, ("id", "_id", "docid"))
        text = raw.get("contents", raw.get("text")) if isinstance(raw, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise DataError("missing or empty text", file=where, item=pid, field="contents")
        if pid in out:
            raise DataError(f"passage listed twice (first at {out[pid][1]})", file=where, item=pid)
        title = raw.get("title") or ""
        out[pid] = ((f"{title.strip()}\n" if str(title).strip() else "") + text.strip(), where)
    return out


def trec_run(text: str, file: str) -> dict[str, list[str]]:
    """A TREC run: query id -> passage ids by rank (score descending, then rank)."""
    scored: dict[str, list[tuple[float, int, str]]] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise DataError("expected `qid Q0 docid rank score tag`", file=f"{file}:{n}")
        qid, _, pid, rank, score, _ = parts
        try:
            scored.setdefault(qid, []).append((-float(score), int(rank), pid))
        except ValueError as e:
            raise DataError(f"rank and score must be numbers ({e})", file=f"{file}:{n}") from e
    return {q: [pid for *_, pid in sorted(rows)] for q, rows in scored.items()}


def validate_query(raw: dict[str, Any], where: str) -> Query:
    try:
        return Query.model_validate(raw)
    except ValidationError as e:
        field, msg = first_error(e)
        raise DataError(msg, file=where, item=str(raw.get("item_id")), field=field) from e
