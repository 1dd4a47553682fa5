"""Scripted answers for the test server (`tests.e2e.crux_responder:respond`) to CRUX's prompts:

- passages: the document cut in two halves of its sentences (`{"passages": [...]}`);
- query: "Write a report on " and the reference's first sentence;
- questions: one question per sentence of the reference, about its keyword (the word after
  "about"), e.g. "What does the report say about lanterns?";
- rating: 5 when the passage holds the question's keyword, 3 when it holds its first four
  letters (e.g. "lant" of "lanterns" in "lantern"), else 0 (`rating` below, which the tests
  use to recompute everything by hand). A question whose keyword is "garble" gets an answer
  that does not parse on the first attempt; the repair is answered correctly.
"""

from __future__ import annotations

import json
import re
from typing import Any

ABOUT = re.compile(r"about (\w+)")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def keyword(question: str) -> str:
    found = ABOUT.search(question)
    return found.group(1).lower() if found else ""


def rating(question: str, passage: str) -> int:
    word, text = keyword(question), passage.lower()
    if word and re.search(rf"\b{word}\b", text):
        return 5
    if word and word[:4] in text:
        return 3
    return 0


def _between(text: str, start: str) -> str:
    return text.split(start, 1)[1].split('\n"""', 1)[0]


def respond(body: dict[str, Any]) -> str:
    messages = body.get("messages", [])
    task = str(messages[0].get("content", "")) if messages else ""
    first_attempt = len(messages) == 1
    if task.startswith("Rewrite the document below"):
        ss = sentences(_between(task, 'Document:\n"""\n'))
        half = max(1, len(ss) // 2)
        parts = [" ".join(ss[:half]), " ".join(ss[half:])]
        return json.dumps({"passages": [p for p in parts if p]})
    if task.startswith("Below is a report. Write the request"):
        first = sentences(_between(task, 'Report:\n"""\n'))[0]
        return json.dumps({"query": f"Write a report on {first}"})
    if task.startswith("Below is a report. Write"):
        report = sentences(_between(task, 'Report:\n"""\n'))
        qs = [f"What does the report say about {keyword(s) or 'it'}?" for s in report]
        return json.dumps({"questions": qs})
    if task.startswith("You judge how well a text answers a question"):
        question = task.split("Question: ", 1)[1].split("\n", 1)[0]
        passage = _between(task, 'Text:\n"""\n')
        if keyword(question) == "garble" and first_attempt:
            return "a five, I would say"
        return json.dumps({"rating": rating(question, passage)})
    return "I do not know this task."
