"""Scripted answers for the test server (`tests.e2e.template_responder:respond`) to the prompts
of the `_template` benchmark (and any benchmark made from it):

- generation (a question and numbered documents): the first sentence of every document;
- judging (an answer and a fact): `yes` when every content word of the fact (4+ letters) is in
  the answer, `partial` when at least half are, else `no` (`verdict` below, which the test uses
  to recompute the recall by hand).
"""

from __future__ import annotations

import json
import re
from typing import Any

WORD = re.compile(r"[a-z]{4,}")


def verdict(answer: str, fact: str) -> str:
    words = set(WORD.findall(fact.lower()))
    have = set(WORD.findall(answer.lower()))
    share = len(words & have) / len(words) if words else 1.0
    return "yes" if share == 1.0 else "partial" if share >= 0.5 else "no"


def _last_user(body: dict[str, Any]) -> str:
    return next(
        str(m.get("content", "")) for m in reversed(body["messages"]) if m.get("role") == "user"
    )


def respond(body: dict[str, Any]) -> str:
    text = _last_user(body)
    if "\nFact: " in text:
        answer = text.split('"""\n', 1)[1].split('\n"""', 1)[0]
        fact = text.split("\nFact: ", 1)[1].split("\n", 1)[0]
        return json.dumps({"verdict": verdict(answer, fact)})
    docs = re.findall(r"Document \d+:\n(.+?)(?:\n\n|\n\nAnswer:|$)", text, flags=re.S)
    return " ".join(d.split(". ")[0].rstrip(".") + "." for d in docs)
