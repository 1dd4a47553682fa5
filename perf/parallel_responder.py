"""The test servers' answers in perf/parallel_models.py: a model that follows the project's
SummHay prompts (cited bullets) and Long²RAG prompts (the first sentence of each document),
deterministically (the e2e tests' responders)."""

from __future__ import annotations

from typing import Any

from tests.e2e import long2rag_responder, summhay_responder


def respond(body: dict[str, Any]) -> str:
    task = long2rag_responder._first_user(body)
    if "Now write your answer to the question" in task:
        return long2rag_responder.respond(body)
    return summhay_responder.respond(body)
