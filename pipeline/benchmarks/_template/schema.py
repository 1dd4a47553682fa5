"""The dataset: one question per line, its documents and the facts a good answer states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.core.records import validate_lines


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Document(_Strict):
    doc_id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class Fact(_Strict):
    fact_id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class Item(_Strict):
    item_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    documents: list[Document] = Field(min_length=1)
    facts: list[Fact] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Item:
        ids = [f.fact_id for f in self.facts]
        if len(set(ids)) != len(ids):
            raise ValueError(f"facts: a fact_id appears twice in {ids}")
        return self


def parse_items(lines: Sequence[tuple[str, Any]], file: str) -> list[Item]:
    """Validate the lines of a JSONL file (`(where, parsed line)`); errors name file:line, item
    and field."""
    return [item for _, item in validate_lines(lines, Item, file)]


# A few built-in items (written for this template), so that a new benchmark runs end to end
# before it has data of its own.
EXAMPLES = [
    {
        "item_id": "ex1",
        "question": "How does the town of Mereby get its drinking water?",
        "documents": [
            {
                "doc_id": "d1",
                "text": "Mereby draws its water from Lake Orrin, four kilometres north of the"
                " town. A pumping station on the south shore lifts the water to a reservoir"
                " on Kell Hill.",
            },
            {
                "doc_id": "d2",
                "text": "The Kell Hill reservoir holds two days of supply. From there the water"
                " flows by gravity to every district of Mereby.",
            },
        ],
        "facts": [
            {"fact_id": "f1", "text": "Mereby's water comes from Lake Orrin."},
            {
                "fact_id": "f2",
                "text": "A pumping station lifts the water to a reservoir on Kell Hill.",
            },
            {"fact_id": "f3", "text": "Water reaches the districts by gravity."},
        ],
    },
    {
        "item_id": "ex2",
        "question": "Why was the Mereby ferry replaced?",
        "documents": [
            {
                "doc_id": "d1",
                "text": "The old Mereby ferry carried twelve cars. Its engine failed three times"
                " in one winter, and spare parts were no longer made.",
            },
            {
                "doc_id": "d2",
                "text": "The council bought an electric ferry in 2024. It carries thirty cars and"
                " charges at the quay during the night.",
            },
        ],
        "facts": [
            {"fact_id": "f1", "text": "The old ferry's engine failed repeatedly."},
            {"fact_id": "f2", "text": "Spare parts for the old ferry were no longer made."},
            {"fact_id": "f3", "text": "The new ferry is electric and carries thirty cars."},
        ],
    },
    {
        "item_id": "ex3",
        "question": "What does the Mereby library offer besides books?",
        "documents": [
            {
                "doc_id": "d1",
                "text": "Besides its books, the Mereby library lends tools and sewing machines."
                " On Saturdays it runs a repair café where volunteers fix small appliances.",
            },
        ],
        "facts": [
            {"fact_id": "f1", "text": "The library lends tools and sewing machines."},
            {"fact_id": "f2", "text": "The library runs a repair café on Saturdays."},
        ],
    },
]


def examples() -> list[Item]:
    return [Item.model_validate(e) for e in EXAMPLES]
