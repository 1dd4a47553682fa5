"""Parsing a model's answer: the JSON object every prompt of the project asks for.

Shared by the benchmarks' parsers (judge verdicts, construction steps). A parser raises
`ParseError` with a message meant for the model: the stage layer's judge loop shows it in the one
repair request, and records it with the raw answer when the repair fails too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

V = TypeVar("V")

_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class ParseError(ValueError):
    """A model answer that cannot be used; the message is shown to the model in the repair."""


def load_object(text: str | None) -> dict[str, Any]:
    """The JSON object an answer holds (a Markdown code fence around it is allowed)."""
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


def string_list(text: str | None, key: str) -> list[str]:
    """`{"<key>": ["...", ...]}`: the non-empty strings, stripped."""
    obj = load_object(text)
    items = obj.get(key)
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ParseError(f'"{key}" must be a list of strings')
    return [x.strip() for x in items if x.strip()]


def text_field(text: str | None, key: str) -> str:
    """`{"<key>": "<a non-empty text>"}`, stripped."""
    value = load_object(text).get(key)
    if not isinstance(value, str) or not value.strip():
        raise ParseError(f'"{key}" must be a non-empty string, got {json.dumps(value)}')
    return value.strip()


def unit_score(text: str | None, key: str = "score") -> float:
    """`{"<key>": <a number in [0, 1]>}`."""
    obj = load_object(text)
    score = obj.get(key)
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise ParseError(f'"{key}" must be a number between 0 and 1, got {json.dumps(score)}')
    return float(score)


def per_target(
    text: str | None,
    ids: Sequence[str],
    id_key: str,
    noun: str,
    read: Callable[[dict[str, Any], str], V],
) -> tuple[dict[str, V], dict[str, str]]:
    """A batched verdict answer, `{"verdicts": [{"<id_key>": <id>, ...}, ...]}`: exactly one
    entry per wanted id, each read by `read(entry, id)` (which raises ParseError). Returns the
    values by id and a problem for every id without one; a whole-answer problem (not JSON, no
    verdict list) is reported for every id."""
    try:
        obj = load_object(text)
        items = obj.get("verdicts")
        if not isinstance(items, list):
            raise ParseError('the object has no "verdicts" list')
    except ParseError as e:
        return {}, {i: str(e) for i in ids}
    wanted = set(ids)
    seen: dict[str, list[dict[str, Any]]] = {}
    for it in items:
        if isinstance(it, dict) and str(it.get(id_key)) in wanted:
            seen.setdefault(str(it.get(id_key)), []).append(it)
    good: dict[str, V] = {}
    bad: dict[str, str] = {}
    for i in ids:
        found = seen.get(i, [])
        if len(found) != 1:
            bad[i] = f"{noun} {i!r} has {len(found)} verdicts, expected exactly one"
            continue
        try:
            good[i] = read(found[0], i)
        except ParseError as e:
            bad[i] = f"{noun} {i!r}: {e}"
    return good, bad
