"""Scripted answers for the test server (loaded by it as `tests.e2e.summhay_responder:NAME`).

A stand-in for a model that follows the project's SummHay prompts: for a summary request it writes
the number of bullets asked for, each citing documents that appear in the context; for a judge
request it answers in the JSON asked for, deterministically (a hash of the insight decides the
label and the bullet). `garbage_judge` answers judge requests (and their repairs) with text that
is not JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_LABELS = ("FULL_COVERAGE", "PARTIAL_COVERAGE", "NO_COVERAGE")


def _h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def _task_text(body: dict[str, Any]) -> str:
    """The original task: the first user message (a repair conversation appends to it)."""
    for m in body.get("messages", []):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return ""


def _last_json_line(text: str, prefix: str) -> Any:
    for line in reversed(text.splitlines()):
        if line.startswith(prefix):
            return json.loads(line)
    raise ValueError(f"no line starting with {prefix!r}")


def _summary(task: str) -> str:
    m = re.search(r"exactly (\d+) bullets", task)
    n = int(m.group(1)) if m else 3
    docs = sorted({int(x) for x in re.findall(r"^\S*\[(\d+)\]", task, flags=re.MULTILINE)})
    if not docs:
        docs = [1]
    lines = []
    for k in range(n):
        a, b = docs[(k * 2) % len(docs)], docs[(k * 2 + 1) % len(docs)]
        lines.append(f"- Point {k + 1} about the question, as the sources report [{a}][{b}].")
    return "\n".join(lines)


def _verdict(insight: str, n_bullets: int) -> dict[str, Any]:
    label = _LABELS[_h(insight) % 3]
    link: int | str = "NA" if label == "NO_COVERAGE" else 1 + _h(insight + "#") % n_bullets
    return {"coverage": label, "bullet_id": link}


def _judge(task: str) -> str:
    bullets = _last_json_line(task, '{"bullets"')["bullets"]
    if '[{"insight_id"' in task:
        insights = _last_json_line(task, '[{"insight_id"')
        return json.dumps(
            {
                "verdicts": [
                    {"insight_id": i["insight_id"], **_verdict(i["text"], len(bullets))}
                    for i in insights
                ]
            }
        )
    m = re.findall(r'^Insight: "(.*)"$', task, flags=re.MULTILINE)
    return json.dumps(_verdict(m[-1], len(bullets)))


def _is_judge(task: str) -> bool:
    return '"coverage"' in task


def respond(body: dict[str, Any]) -> str:
    task = _task_text(body)
    return _judge(task) if _is_judge(task) else _summary(task)


def garbage_judge(body: dict[str, Any]) -> str:
    task = _task_text(body)
    if _is_judge(task):
        return "Well, I would say the insight is mostly there, in bullet two or so."
    return _summary(task)


def first_answer_garbage_judge(body: dict[str, Any]) -> str:
    """Unusable first answers, good repairs: every verdict should be repaired, none invalid."""
    task = _task_text(body)
    if _is_judge(task) and len(body.get("messages", [])) == 1:
        return "Covered: yes."
    return respond(body)


def by_model(body: dict[str, Any]) -> str:
    """Like `respond`, but each model writes its own summaries (its name in every bullet), as
    different models do: no two models' outputs, and so no two judge requests, are the same."""
    task = _task_text(body)
    if _is_judge(task):
        return _judge(task)
    model = str(body.get("model", ""))
    return "\n".join(
        line.replace("- Point", f"- {model}: point", 1) for line in _summary(task).splitlines()
    )
