"""Scripted answers for the test server to the keyword-recall benchmark of
tests/e2e/test_new_benchmark.py: an answer repeats the question's documents; a verdict is `yes`
when the keyword is in the answer (case ignored)."""

from __future__ import annotations

import json
from typing import Any


def respond(body: dict[str, Any]) -> str:
    text = str(body["messages"][-1]["content"])
    if "\nKeyword: " in text:
        answer = text.split('"""\n', 1)[1].split('\n"""', 1)[0]
        keyword = text.split("\nKeyword: ", 1)[1].split("\n", 1)[0]
        return json.dumps({"contains": "yes" if keyword.lower() in answer.lower() else "no"})
    return text.split("Question:", 1)[-1].strip()
