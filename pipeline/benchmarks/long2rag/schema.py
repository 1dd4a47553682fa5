"""The Long²RAG dataset format (JSON lines, one question per line) and its loader.

One line:

    {"item_id": "q1", "question": "...", "domain": "Biology", "category": "Explanatory",
     "documents": [{"doc_id": "d1", "text": "...", "url": null, "title": null}, ...5 in all],
     "key_points": [{"text": "...", "doc_id": "d1"}, ...]}

- `item_id`, `question`, `domain`, `category`: non-empty strings; ids unique in the file. The
  paper's 10 domains and 8 categories are not enforced (a derived or your own set is fine).
- `documents`: exactly `n_documents` (params, default 5 as in the paper), unique `doc_id`s,
  non-empty text; `url` and `title` optional.
- `key_points`: each a non-empty `text` and the `doc_id` of the document it came from (one of the
  question's documents); optional `kp_id` (default `kp<n>`, 1-based), `support` (every document
  it was merged from) and `score` (the construction filter's score). May be empty in a file
  given to the construct stage, which then builds them; a question left without key points is
  excluded from KPR (and counted), never divided by.
- optional: `sub_questions` (from decomposition), `derived_from` (e.g. "summhay"), `meta`.

Every error names the file and line, the question id and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.core.errors import DataError
from pipeline.core.records import validate_lines


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class L2Document(_Strict):
    doc_id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    url: str | None = None
    title: str | None = None


class KeyPoint(_Strict):
    kp_id: str = Field(default="", description="unique in the question; default kp<n>")
    text: str = Field(min_length=1)
    doc_id: str = Field(min_length=1, description="the document it came from")
    support: list[str] = Field(default_factory=list, description="all documents it merges")
    score: float | None = Field(default=None, description="the construction filter's score")


class Question(_Strict):
    item_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    category: str = Field(min_length=1)
    documents: list[L2Document] = Field(min_length=1)
    key_points: list[KeyPoint] = Field(default_factory=list)
    sub_questions: list[str] = Field(default_factory=list)
    derived_from: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Question:
        ids = [d.doc_id for d in self.documents]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"documents: doc_id {dup[0]!r} appears twice")
        kp_ids = []
        points = []
        for n, kp in enumerate(self.key_points, start=1):
            if kp.doc_id not in ids:
                raise ValueError(
                    f"key_points[{n - 1}].doc_id: {kp.doc_id!r} is not one of this question's"
                    f" documents ({', '.join(ids)})"
                )
            for s in kp.support:
                if s not in ids:
                    raise ValueError(f"key_points[{n - 1}].support: unknown doc_id {s!r}")
            kp_id = kp.kp_id or f"kp{n}"
            kp_ids.append(kp_id)
            points.append(kp if kp.kp_id else kp.model_copy(update={"kp_id": kp_id}))
        dup = sorted({i for i in kp_ids if kp_ids.count(i) > 1})
        if dup:
            raise ValueError(f"key_points: kp_id {dup[0]!r} appears twice")
        object.__setattr__(self, "key_points", points)
        return self


def parse_questions(
    lines: Sequence[tuple[str, Any]], file: str, n_documents: int | None = 5
) -> list[Question]:
    """Validate the lines of a Long²RAG JSONL file (`(where, parsed line)`, where =
    `<file>:<line>`): each question, unique ids, the number of documents.

    `n_documents`: the number of documents each question must have (None: any number >= 1).
    """
    out = []
    for where, q in validate_lines(lines, Question, file):
        if n_documents is not None and len(q.documents) != n_documents:
            raise DataError(
                f"has {len(q.documents)} documents, expected {n_documents} (long2rag.n_documents)",
                file=where,
                item=q.item_id,
                field="documents",
            )
        out.append(q)
    return out
