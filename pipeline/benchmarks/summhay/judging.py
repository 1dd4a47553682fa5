"""SummHay judging with an LLM: coverage of each reference insight, and the bullet that covers it.

Two modes:
- `per_insight`: one call per (insight, summary), as in the paper's protocol.
- `batched`: one call per summary listing all its insights; far fewer calls and prompt tokens.

Answers are parsed strictly (one JSON object, known labels, an integer bullet number or "NA").
An unusable answer gets one repair call that shows the model its answer and what was wrong;
if that fails too, the verdict is recorded as `invalid` with the raw answer, and counted —
never silently scored as 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.benchmarks.summhay.schema import COVERAGE_LABELS, Subtopic
from pipeline.benchmarks.summhay.scoring import extract_bullets
from pipeline.llm.client import ChatRequest, ChatResult
from pipeline.prompts import Prompt
from pipeline.records import Generation, Verdict

_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class ParseError(ValueError):
    """A judge answer that cannot be used; the message is shown to the model in the repair."""


def bullets_json(bullets: Sequence[str]) -> str:
    return json.dumps(
        {"bullets": [{"bullet_id": i, "text": b} for i, b in enumerate(bullets, start=1)]},
        ensure_ascii=False,
    )


def _load_object(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        raise ParseError("the answer was empty")
    body = text.strip()
    fenced = _FENCE_RE.match(body)
    if fenced:  # a JSON object inside a Markdown code fence is still that object
        body = fenced.group(1)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ParseError(f"it is not valid JSON ({e.msg} at char {e.pos})") from e
    if not isinstance(obj, dict):
        raise ParseError("it is JSON but not an object")
    return obj


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
    return _verdict_of(_load_object(text), target_id, n_bullets, (text or "").strip())


def parse_batch(
    text: str | None, insight_ids: Sequence[str], n_bullets: int
) -> tuple[dict[str, Verdict], dict[str, str]]:
    """Verdicts by insight id from a batched answer, and the problems of the unusable ones.

    A whole-answer problem (not JSON, no verdict list) is reported for every insight.
    """
    raw = (text or "").strip()
    try:
        obj = _load_object(text)
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


@dataclass
class Task:
    """The judging of one generation: its requests, and its verdicts as they come in."""

    generation: Generation
    bullets: list[str]
    insight_ids: list[str]
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0


def make_task(gen: Generation, sub: Subtopic) -> Task:
    return Task(gen, extract_bullets(gen.text or ""), [i.insight_id for i in sub.insights])


def _messages(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def first_requests(
    task: Task,
    sub: Subtopic,
    mode: str,
    prompt: Prompt,
    prompt_sha: str,
    response_format: dict[str, Any] | None,
) -> list[tuple[str | None, ChatRequest]]:
    """(insight id or None for a batch, request) pairs for the first pass."""
    gid = task.generation.generation_id
    bj = bullets_json(task.bullets)
    if mode == "batched":
        insights = json.dumps(
            [{"insight_id": i.insight_id, "text": i.text} for i in sub.insights],
            ensure_ascii=False,
        )
        content = prompt.render(bullets=bj, insights=insights)
        return [(None, ChatRequest(gid, _messages(content), prompt_sha, 0, None, response_format))]
    out: list[tuple[str | None, ChatRequest]] = []
    for ins in sub.insights:
        content = prompt.render(bullets=bj, insight=ins.text)
        out.append(
            (
                ins.insight_id,
                ChatRequest(
                    f"{gid}#{ins.insight_id}",
                    _messages(content),
                    prompt_sha,
                    0,
                    None,
                    response_format,
                ),
            )
        )
    return out


def repair_request(
    first: ChatRequest, answer: str | None, problem: str, repair_prompt: Prompt
) -> ChatRequest:
    messages = [
        *first.messages,
        {"role": "assistant", "content": answer or ""},
        {"role": "user", "content": repair_prompt.render(problem=problem)},
    ]
    return ChatRequest(
        first.key + "#repair",
        messages,
        first.prompt_sha,
        first.sample,
        first.max_tokens,
        first.response_format,
    )


def absorb(
    task: Task,
    target: str | None,
    result: ChatResult,
    final: bool,
    only: Sequence[str] | None = None,
) -> dict[str, str] | None:
    """Take one answer into the task. Returns the problems to repair (by insight id), if any.

    `target` is the insight of a per-insight answer (None for a batch, whose verdicts are read
    for `only` these insights, default all). On the final pass, unusable verdicts are recorded
    as invalid with the raw answer.
    """
    task.input_tokens += result.input_tokens
    task.output_tokens += result.output_tokens
    task.calls += 1
    if result.status != "ok":
        task.errors.append(result.error or "request failed")
        return None
    ids = (list(only) if only is not None else task.insight_ids) if target is None else [target]
    n = len(task.bullets)
    if target is None:
        good, bad = parse_batch(result.text, ids, n)
    else:
        try:
            good, bad = {target: parse_single(result.text, target, n)}, {}
        except ParseError as e:
            good, bad = {}, {target: str(e)}
    task.verdicts.update(good)
    for iid in good:
        task.problems.pop(iid, None)
    if not bad:
        return None
    if final:
        for iid, problem in bad.items():
            task.verdicts[iid] = Verdict(
                target_id=iid,
                label="INVALID",
                link=None,
                status="invalid",
                raw=f"{problem} | answer: {(result.text or '')[:2000]}",
            )
        return None
    task.problems.update(bad)
    return bad
