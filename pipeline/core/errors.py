"""Errors a user can act on.

Every error raised for bad input names where the problem is: the file, the item (a haystack,
subtopic or generation id) and the field. The CLI prints these without a traceback and exits 2.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class LfbenchError(Exception):
    """An error with a message meant for the user (no traceback needed)."""


class ConfigError(LfbenchError):
    """params.yaml (or a prompt file it names) is invalid."""


class DataError(LfbenchError):
    """An input file is missing, corrupted or does not match its schema."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        item: str | None = None,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        self.file = file
        self.item = item
        self.field = field
        self.line = line
        self.reason = message
        where = []
        if file:
            where.append(f"file {file}")
        if line is not None:
            where.append(f"line {line}")
        if item:
            where.append(f"item {item}")
        if field:
            where.append(f"field {field}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class StageFailed(LfbenchError):
    """A stage finished its work but some items failed; finished items were kept."""


class Interrupted(LfbenchError):
    """Ctrl-C (SIGINT) or SIGTERM stopped a stage's model calls; what finished was kept (the CLI
    exits 130)."""


INTERRUPT_GRACE_ENV = "LFBENCH_INTERRUPT_GRACE_S"
DEFAULT_INTERRUPT_GRACE_S = 60.0


def interrupt_grace_s(environ: Mapping[str, str] | None = None) -> float:
    """How long a first Ctrl-C lets the requests in flight finish (seconds; 0: abandon them at
    once): `LFBENCH_INTERRUPT_GRACE_S`, else 60."""
    env = os.environ if environ is None else environ
    raw = env.get(INTERRUPT_GRACE_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERRUPT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"{INTERRUPT_GRACE_ENV}={raw!r}: not a number of seconds >= 0 (how long a first"
            " Ctrl-C lets the requests in flight finish)"
        )
    return value


def format_loc(loc: tuple[int | str, ...]) -> str:
    """('insights', 2, 'insight_id') -> 'insights[2].insight_id'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def first_error(e: ValidationError) -> tuple[str, str]:
    """(field path, message) of the first error of a pydantic ValidationError. A check across
    fields names its own field (`"key_points[0].doc_id: ..."`), which is used as the path."""
    err = e.errors()[0]
    field, msg = format_loc(tuple(err["loc"])), str(err["msg"])
    if field == "<root>" and msg.startswith("Value error, ") and ": " in msg:
        field, msg = msg.removeprefix("Value error, ").split(": ", 1)
    return field, msg
