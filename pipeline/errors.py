"""Errors a user can act on.

Every error raised for bad input names where the problem is: the file, the item (a haystack,
subtopic or generation id) and the field. The CLI prints these without a traceback and exits 2.
"""

from __future__ import annotations


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
    ) -> None:
        self.file = file
        self.item = item
        self.field = field
        self.reason = message
        where = []
        if file:
            where.append(f"file {file}")
        if item:
            where.append(f"item {item}")
        if field:
            where.append(f"field {field}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class StageFailed(LfbenchError):
    """A stage finished its work but some items failed; finished items were kept."""
