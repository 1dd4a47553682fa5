"""Scripted answers for the test server (`tests.e2e.long2rag_responder:respond`).

A stand-in for a model that follows the project's Long²RAG prompts, deterministically:
- decomposition: two sub-questions;
- extraction: the document's sentences that are not yet listed, 2 in the first round, 1 after;
- aggregation: consecutive points merged in pairs (1+2, 3+4, ...). For a question that contains
  "MERGE-TWICE" the first answer puts point 1 in two merged points (breaking the exactly-one
  rule); the repair answer is correct;
- filter: score 0.4 when a hash of the point is divisible by 4, else 0.9;
- generation: the first sentence of every document block in the context;
- judging (per claim or batched): a hash of the claim picks yes / no / neutral.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

VERDICTS = ("yes", "no", "neutral")


def h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def verdict(claim: str) -> str:
    return VERDICTS[h(claim) % 3]


def filter_score(point: str) -> float:
    return 0.4 if h(point) % 4 == 0 else 0.9


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _first_user(body: dict[str, Any]) -> str:
    for m in body.get("messages", []):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return ""


def _extract(task: str) -> str:
    doc = task.split("\n\nDocument ", 1)[1].split(":\n", 1)[1]
    doc = doc.split("\n\nKey points already found", 1)[0]
    if doc.startswith("Title: "):
        doc = doc.split("\n", 1)[1]
    found_block = task.split("(do not repeat them or rephrase them; add only what they miss):\n")[1]
    found = [
        ln[2:] for ln in found_block.split("\n\nReply", 1)[0].splitlines() if ln.startswith("- ")
    ]
    new = [s for s in sentences(doc) if s not in found]
    return json.dumps({"points": new[: 2 if not found else 1]})


def _aggregate(task: str, first_attempt: bool) -> str:
    points = json.loads(task.split("Extracted points (JSON):\n", 1)[1].split("\n\nReply", 1)[0])
    n = len(points)
    groups = [[i, i + 1] if i + 1 <= n else [i] for i in range(1, n + 1, 2)]
    if first_attempt and "MERGE-TWICE" in task and len(groups) > 1:
        groups[1] = [1, *groups[1]]
    by_num = {p["number"]: p["text"] for p in points}
    return json.dumps(
        {"key_points": [{"text": " ".join(by_num[i] for i in g), "sources": g} for g in groups]}
    )


def respond(body: dict[str, Any]) -> str:
    task = _first_user(body)
    first_attempt = len(body.get("messages", [])) == 1
    if "separate search queries" in task:
        return json.dumps({"sub_questions": ["first sub-question", "second sub-question"]})
    if "Key points already found in this document" in task:
        return _extract(task)
    if "Extracted points (JSON):" in task:
        return _aggregate(task, first_attempt)
    if "probability between 0 and 1 that it is a key point" in task:
        point = task.split('Statement: "', 1)[1].rsplit('"\n\nReply', 1)[0]
        return json.dumps({"score": filter_score(point)})
    if "Claims (JSON):" in task:
        claims = json.loads(task.split("Claims (JSON):\n", 1)[1].split("\n\nReply", 1)[0])
        return json.dumps(
            {
                "verdicts": [
                    {"claim_id": c["claim_id"], "verdict": verdict(c["text"])} for c in claims
                ]
            }
        )
    if '\n\nClaim: "' in task:
        claim = task.split('\n\nClaim: "', 1)[1].rsplit('"\n\nReply', 1)[0]
        return json.dumps({"verdict": verdict(claim)})
    if "Now write your answer to the question" in task:
        blocks = re.split(r"^Document \d+(?:: .*)?$", task, flags=re.MULTILINE)[1:]
        firsts = [sentences(b.split("\n\nNow write", 1)[0])[0] for b in blocks if b.strip()]
        return " ".join(firsts)
    return "I do not know this task."


def bad_merger(body: dict[str, Any]) -> str:
    """Like `respond`, but every aggregation answer (repairs too) uses point 1 twice."""
    task = _first_user(body)
    if "Extracted points (JSON):" in task:
        points = json.loads(task.split("Extracted points (JSON):\n", 1)[1].split("\n\nReply", 1)[0])
        n = len(points)
        return json.dumps(
            {
                "key_points": [
                    {"text": "all", "sources": list(range(1, n + 1))},
                    {"text": "again", "sources": [1]},
                ]
            }
        )
    return respond(body)
