"""The records that cross stage boundaries, one type per stage output.

dataset (per benchmark) -> Generation (generate) -> Judgement (judge) -> metrics rows (aggregate).
Each is frozen, typed and serialised as one JSON object per line; every reader validates it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.errors import DataError, first_error

M = TypeVar("M", bound=BaseModel)


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Usage(Record):
    """What one generation or judgement cost (zero for replayed published outputs)."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    cost_usd: float = 0.0


class Generation(Record):
    """One output of a system for one benchmark item."""

    benchmark: str
    item_id: str
    model: str = Field(description="the params.yaml model entry that produced it")
    system: str = Field(description="the system name reported in results")
    setting: str = Field(description="context setting: full, oracle, a retriever name, ...")
    sample: int = 0
    status: Literal["ok", "error"]
    text: str | None = None
    error: str | None = None
    usage: Usage = Usage()
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def generation_id(self) -> str:
        return generation_id(self.item_id, self.system, self.setting, self.sample)

    @classmethod
    def offline(
        cls,
        benchmark: str,
        item_id: str,
        model: str,
        system: str,
        setting: str,
        text: str,
        meta: dict[str, Any],
        *,
        empty: str = "empty answer",
    ) -> Generation:
        """An output made without a model call: an error (`empty`) when it has no text."""
        ok = bool(text.strip())
        return cls(
            benchmark=benchmark,
            item_id=item_id,
            model=model,
            system=system,
            setting=setting,
            status="ok" if ok else "error",
            text=text if ok else None,
            error=None if ok else empty,
            meta=meta,
        )


def generation_id(item_id: str, system: str, setting: str, sample: int = 0) -> str:
    return f"{item_id}|{setting}|{system}|{sample}"


class Verdict(Record):
    """A judge's decision on one reference unit (a SummHay insight, a Long2RAG key point, ...).

    `link` keeps the judge's raw pointer (e.g. a bullet number, or the string "NA") exactly as
    given, so that scoring modes can decide how to interpret it.
    """

    target_id: str
    label: str
    link: int | str | None = None
    status: Literal["ok", "invalid"] = "ok"
    raw: str | None = None


class Judgement(Record):
    """All verdicts of one judge on one generation."""

    benchmark: str
    generation_id: str
    item_id: str
    model: str
    system: str
    setting: str
    sample: int = 0
    judge: str
    judge_prompt_sha: str
    status: Literal["ok", "invalid", "error"]
    verdicts: list[Verdict] = Field(default_factory=list)
    error: str | None = None
    usage: Usage = Usage()

    @classmethod
    def of(
        cls,
        benchmark: str,
        gen: Generation,
        judge: str,
        sha: str,
        status: str,
        verdicts: list[Verdict],
        *,
        error: str | None = None,
        usage: Usage | None = None,
    ) -> Judgement:
        """One judge's judgement of `gen` (its identity fields copied from the generation;
        `status` is validated: ok, invalid or error)."""
        return cls(
            benchmark=benchmark,
            generation_id=gen.generation_id,
            item_id=gen.item_id,
            model=gen.model,
            system=gen.system,
            setting=gen.setting,
            sample=gen.sample,
            judge=judge,
            judge_prompt_sha=sha,
            status=cast(Literal["ok", "invalid", "error"], status),
            verdicts=verdicts,
            error=error,
            usage=usage or Usage(),
        )


@dataclass(frozen=True)
class LabelledCase:
    """A candidate (bullets) with its reference units, each labelled by a reference judge
    (NO/PARTIAL/FULL_COVERAGE and the bullet it linked), and a group (e.g. the haystack) for
    leave-one-group-out evaluation: what the local judge is trained and measured on."""

    group: str
    case_id: str
    units: tuple[str, ...]
    bullets: tuple[str, ...]
    labels: tuple[str, ...]  # one label per unit
    links: tuple[int | None, ...]  # 1-based bullet the reference judge linked, per unit


def validate_lines(
    lines: Sequence[tuple[str, Any]], model: type[M], file: str, key: str = "item_id"
) -> list[tuple[str, M]]:
    """The records of a JSONL file (`(where, parsed line)` pairs, where = `<file>:<line>`),
    each validated as `model`, ids (`key`) unique. Errors name the file and line, the item and
    the field; an empty file is an error too."""
    out: list[tuple[str, M]] = []
    seen: dict[str, str] = {}
    for where, raw in lines:
        item = str(raw.get(key)) if isinstance(raw, dict) and key in raw else None
        try:
            record = model.model_validate(raw)
        except ValidationError as e:
            field, msg = first_error(e)
            raise DataError(msg, file=where, item=item, field=field) from e
        ident = str(getattr(record, key))
        if ident in seen:
            line = seen[ident].rsplit(":", 1)[-1]
            raise DataError(f"{key} already used on line {line}", file=where, item=ident, field=key)
        seen[ident] = where
        out.append((where, record))
    if not out:
        raise DataError("no records in the file", file=file)
    return out
