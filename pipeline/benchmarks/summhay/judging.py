"""SummHay judging with an LLM: coverage of each reference insight, and the bullet that covers it.

Two modes:
- `per_insight`: one call per (insight, summary), as in the paper's protocol.
- `batched`: one call per summary listing all its insights; far fewer calls and prompt tokens.

This module builds the requests and parses the answers strictly (one JSON object, known labels,
an integer bullet number or "NA"). The stage layer's judge loop sends them, gives an unusable
answer one repair call (the `judge_repair` prompt) and records what stays unusable as `invalid`
with the raw answer, counted, never silently scored as 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pipeline.benchmarks.summhay.scoring import extract_bullets
from pipeline.core import benchmark as contract
from pipeline.core.benchmark import JudgePrompts, JudgeTask, Parsed, Parser, single
from pipeline.core.parse import ParseError, load_object, per_target
from pipeline.core.records import Generation, Verdict
from pipeline.data.haystacks import COVERAGE_LABELS, Subtopic


def bullets_json(bullets: Sequence[str]) -> str:
    return json.dumps(
        {"bullets": [{"bullet_id": i, "text": b} for i, b in enumerate(bullets, start=1)]},
        ensure_ascii=False,
    )


def _verdict_of(obj: dict[str, Any], target_id: str, n_bullets: int, raw: str) -> Verdict:
    label = obj.get("coverage")
    if label not in COVERAGE_LABELS:
        raise ParseError(
            f'"coverage" must be one of {", ".join(COVERAGE_LABELS)}, got {json.dumps(label)}'
        )
    link = obj.get("bullet_id")
    if label == "NO_COVERAGE":
        return Verdict(target_id=target_id, label=label, link="NA", raw=raw)
    if isinstance(link, bool) or not (
        isinstance(link, int) or (isinstance(link, str) and link.strip().isdigit())
    ):
        raise ParseError(f'a covered insight needs an integer "bullet_id", got {json.dumps(link)}')
    number = int(link)
    if not 1 <= number <= n_bullets:
        raise ParseError(f'"bullet_id" {number} is not a bullet number (1..{n_bullets})')
    return Verdict(target_id=target_id, label=label, link=number, raw=raw)


def parse_single(text: str | None, target_id: str, n_bullets: int) -> Verdict:
    """One insight's verdict from a per-insight answer, or ParseError."""
    return _verdict_of(load_object(text), target_id, n_bullets, (text or "").strip())


def parse_batch(
    text: str | None, insight_ids: Sequence[str], n_bullets: int
) -> tuple[dict[str, Verdict], dict[str, str]]:
    """Verdicts by insight id from a batched answer, and the problems of the unusable ones.

    A whole-answer problem (not JSON, no verdict list) is reported for every insight.
    """
    raw = (text or "").strip()
    return per_target(
        text, insight_ids, "insight_id", "insight", lambda it, i: _verdict_of(it, i, n_bullets, raw)
    )


# The answers' JSON schemas, for judges that ask for structured output with a schema: a covered
# insight names a bullet number (1 or more), an uncovered one "NA", so a schema-constrained answer
# has the shape the parser takes (a bullet past the summary's last is still refused there).
def _verdict_schema(extra: dict[str, Any]) -> dict[str, Any]:
    def shape(labels: list[str], link: dict[str, Any]) -> dict[str, Any]:
        props = {**extra, "coverage": {"type": "string", "enum": labels}, "bullet_id": link}
        return {
            "type": "object",
            "properties": props,
            "required": [*extra, "coverage", "bullet_id"],
        }

    covered = [x for x in COVERAGE_LABELS if x != "NO_COVERAGE"]
    return {
        "anyOf": [
            shape(covered, {"type": "integer", "minimum": 1}),
            shape(["NO_COVERAGE"], {"type": "string", "enum": ["NA"]}),
        ]
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "judge_insight": _verdict_schema({}),
    "judge_batch": {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "array",
                "items": _verdict_schema({"insight_id": {"type": "string"}}),
            }
        },
        "required": ["verdicts"],
    },
}


# ---------------------------------------------------------------- requests


def judge_task(gen: Generation, sub: Subtopic, prompts: JudgePrompts) -> JudgeTask:
    """The asks that judge one summary: one per insight (`per_insight`) or one for all."""
    bullets = extract_bullets(gen.text or "")
    n, listed = len(bullets), bullets_json(bullets)
    texts = {i.insight_id: i.text for i in sub.insights}

    def one(insight: str) -> str:
        return prompts.prompt.render(bullets=listed, insight=texts[insight])

    def every() -> str:
        insights = [{"insight_id": i, "text": t} for i, t in texts.items()]
        return prompts.prompt.render(
            bullets=listed, insights=json.dumps(insights, ensure_ascii=False)
        )

    def parse_one(insight: str) -> Parser:
        return single(lambda text: parse_single(text, insight, n))

    def parse_every(text: str | None, targets: Sequence[str]) -> Parsed:
        return parse_batch(text, targets, n)

    return contract.judge_task(gen, list(texts), prompts, one, parse_one, every, parse_every)
