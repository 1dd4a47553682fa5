"""The one judge loop: every request whose answer must be parsed goes through it.

First pass: send every ask's request (through the model layer: cache, journal, retries, rate
limits) and parse each answer. An answer that leaves some targets unreadable gets one repair
request: the original conversation, the model's answer, and the ask's repair prompt filled with
what was wrong; only those targets are read from the repair's answer. What is still unreadable
is recorded as invalid with the problem and the raw answer: counted by the caller, never scored.
A request that fails after the model layer's retries is an error of its ask (the others finish).

Judges (`JudgeTask.asks`) and multi-step construction (an `Asker` handed to the benchmark) share
this loop, so a judge of any benchmark repairs, counts and caches the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.benchmark import Answer, Ask
from pipeline.core.prompts import Prompt
from pipeline.core.types import ChatRequest, ChatResult, EndpointConfig, UsageReport
from pipeline.llm.client import run_chat_sync

log = logging.getLogger(__name__)

PROBLEM_CHARS = 1500  # of the problems shown to the model in a repair request
RAW_CHARS = 2000  # of the answer kept with an invalid value


def repair_request(
    first: ChatRequest, answer: str | None, problem: str, prompt: Prompt
) -> ChatRequest:
    """The first request's conversation, the model's answer, and the repair prompt."""
    messages = [
        *first.messages,
        {"role": "assistant", "content": answer or ""},
        {"role": "user", "content": prompt.render(problem=problem)},
    ]
    return ChatRequest(
        first.key + "#repair",
        messages,
        first.prompt_sha,
        first.sample,
        first.max_tokens,
        first.response_format,
    )


def _absorb(answer: Answer, result: ChatResult, targets: Sequence[str]) -> dict[str, str]:
    """Take one result into the answer; return the problems of the targets it left unread."""
    answer.input_tokens += result.input_tokens
    answer.output_tokens += result.output_tokens
    answer.calls += 1
    if result.status != "ok":
        answer.errors.append(result.error or "request failed")
        return {}
    good, bad = answer.ask.parse(result.text, list(targets))
    answer.values.update({t: v for t, v in good.items() if t in targets})
    unread = {t: bad.get(t, "no value for it in the answer") for t in targets if t not in good}
    return unread


def _invalidate(answer: Answer, problems: dict[str, str], text: str | None) -> None:
    for target, problem in problems.items():
        answer.invalid[target] = f"{problem} | answer: {(text or '')[:RAW_CHARS]}"


def ask_all(
    endpoint: EndpointConfig,
    asks: Sequence[Ask],
    *,
    repair: bool,
    cache_path: Path | None,
    journal_path: Path | None,
    label: str,
) -> tuple[list[Answer], UsageReport]:
    """Send the asks, parse, repair once where `repair` is on and the ask has a repair prompt;
    one `Answer` per ask, in order, and the usage of every request sent. Asks that share a
    request key are sent once: the first carries the calls and tokens, the others its values."""
    first: dict[str, Ask] = {}
    for a in asks:
        seen = first.setdefault(a.request.key, a)
        if seen is not a and (seen.request != a.request or seen.targets != a.targets):
            raise ValueError(f"two different requests under one key {a.request.key!r}")
    unique = list(first.values())
    answers = [Answer(a) for a in unique]
    results, report = run_chat_sync(
        endpoint,
        [a.request for a in unique],
        cache_path=cache_path,
        journal_path=journal_path,
        label=label,
    )
    pending: list[tuple[Answer, dict[str, str], ChatRequest]] = []
    for answer, result in zip(answers, results, strict=True):
        bad = _absorb(answer, result, answer.ask.targets)
        if not bad:
            continue
        if repair and answer.ask.repair is not None:
            problem = "; ".join(bad.values())[:PROBLEM_CHARS]
            req = repair_request(answer.ask.request, result.text, problem, answer.ask.repair)
            pending.append((answer, bad, req))
        else:
            _invalidate(answer, bad, result.text)
    if pending:
        log.info("%s: %d answers unusable, sending one repair request each", label, len(pending))
        results2, report2 = run_chat_sync(
            endpoint,
            [req for *_, req in pending],
            cache_path=cache_path,
            journal_path=journal_path,
            label=label + " (repair)",
        )
        report = report.merged(report2)
        for (answer, bad, _), result in zip(pending, results2, strict=True):
            still = _absorb(answer, result, list(bad))
            _invalidate(answer, still, result.text)
    by_key = {a.ask.request.key: a for a in answers}
    out = []
    for a in asks:
        done = by_key[a.request.key]
        if done.ask is a:
            out.append(done)
        else:  # a shared request: its values, not its cost
            out.append(Answer(a, dict(done.values), dict(done.invalid), list(done.errors)))
    return out, report
