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
from pipeline.core.benchmark import Ask, JudgeTask, Parsed
from pipeline.core.parse import ParseError, load_object
from pipeline.core.prompts import Prompt, combined_sha
from pipeline.core.records import Generation, Verdict
from pipeline.data.haystacks import COVERAGE_LABELS, Subtopic
from pipeline.llm.types import ChatRequest


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
    try:
        obj = load_object(text)
        items = obj.get("verdicts")
        if not isinstance(items, list):
            raise ParseError('the object has no "verdicts" list')
    except ParseError as e:
        return {}, {iid: str(e) for iid in insight_ids}
    wanted = set(insight_ids)
    seen: dict[str, list[dict[str, Any]]] = {}
    for it in items:
        if isinstance(it, dict) and str(it.get("insight_id")) in wanted:
            seen.setdefault(str(it.get("insight_id")), []).append(it)
    good: dict[str, Verdict] = {}
    bad: dict[str, str] = {}
    for iid in insight_ids:
        found = seen.get(iid, [])
        if len(found) != 1:
            bad[iid] = f"insight {iid!r} has {len(found)} verdicts, expected exactly one"
            continue
        try:
            good[iid] = _verdict_of(found[0], iid, n_bullets, raw)
        except ParseError as e:
            bad[iid] = f"insight {iid!r}: {e}"
    return good, bad


# ---------------------------------------------------------------- requests


def _single(target: str, n_bullets: int) -> Any:
    def parse(text: str | None, targets: Sequence[str]) -> Parsed:
        try:
            return {target: parse_single(text, target, n_bullets)}, {}
        except ParseError as e:
            return {}, {target: str(e)}

    return parse


def _batch(n_bullets: int) -> Any:
    def parse(text: str | None, targets: Sequence[str]) -> Parsed:
        return parse_batch(text, targets, n_bullets)

    return parse


def judge_task(
    gen: Generation,
    sub: Subtopic,
    mode: str,
    prompt: Prompt,
    repair: Prompt,
    response_format: dict[str, Any] | None,
) -> JudgeTask:
    """The asks that judge one summary: one per insight (`per_insight`) or one for all."""
    sha = combined_sha(prompt, repair)
    bullets = extract_bullets(gen.text or "")
    n = len(bullets)
    bj = bullets_json(bullets)
    gid = gen.generation_id
    ids = tuple(i.insight_id for i in sub.insights)
    if mode == "batched":
        insights = json.dumps(
            [{"insight_id": i.insight_id, "text": i.text} for i in sub.insights],
            ensure_ascii=False,
        )
        content = prompt.render(bullets=bj, insights=insights)
        request = ChatRequest(gid, _messages(content), sha, 0, None, response_format)
        asks: tuple[Ask, ...] = (Ask(request, _batch(n), ids, repair),)
    else:
        asks = tuple(
            Ask(
                ChatRequest(
                    f"{gid}#{ins.insight_id}",
                    _messages(prompt.render(bullets=bj, insight=ins.text)),
                    sha,
                    0,
                    None,
                    response_format,
                ),
                _single(ins.insight_id, n),
                (ins.insight_id,),
                repair,
            )
            for ins in sub.insights
        )
    return JudgeTask(gen, ids, asks, sha)


def _messages(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]
