"""Small markdown helpers for reports: tables, numbers, and rows checked for their fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.errors import DataError


def fmt(x: Any, nd: int = 1) -> str:
    """A cell: `-` for a missing value, floats to `nd` decimals."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def table(head: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    """A pipe table (and the blank line after it)."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return [*out, ""]


def need(row: Mapping[str, Any], keys: Sequence[str], where: str, n: int) -> None:
    """Every key is in the row (row `n` of the metrics file `where`), or a DataError naming it."""
    for k in keys:
        if k not in row:
            raise DataError("row without this field", file=where, item=f"row {n}", field=k)
