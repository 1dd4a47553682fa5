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


def cell(x: Any) -> str:
    """A table cell's text, whatever the value holds: `|` escaped as `\\|` (so it cannot split
    the cell), line breaks as spaces (a pipe table row is one line)."""
    return " ".join(str(x).replace("|", "\\|").splitlines())


def table(head: Sequence[Any], body: Sequence[Sequence[Any]]) -> list[str]:
    """A pipe table (and the blank line after it), each cell escaped by `cell`."""
    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in body]
    return [*out, ""]


def need(row: Mapping[str, Any], keys: Sequence[str], where: str, n: int) -> None:
    """Every key is in the row (row `n` of the metrics file `where`), or a DataError naming it."""
    for k in keys:
        if k not in row:
            raise DataError("row without this field", file=where, item=f"row {n}", field=k)


def _cell(row: Mapping[str, Any], metric: Any, main: bool) -> str:
    """A metric's cell: its value, and for the main metric its interval when the row has one."""
    nd = 3 if metric.digits is None else min(metric.digits, 3)
    cell = fmt(row.get(metric.name), nd)
    lo, hi = row.get(f"{metric.name}_ci_low"), row.get(f"{metric.name}_ci_high")
    if main and lo is not None and hi is not None:
        cell += f" [{fmt(lo, nd)}, {fmt(hi, nd)}]"
    return cell


def _metric_head(m: Any) -> str:
    """A metric's column head: its label and direction (none for, e.g., a length)."""
    if m.higher_is_better is None:
        return f"{m.label} ({m.unit})" if m.unit else m.label
    return f"{m.label} ({'↑' if m.higher_is_better else '↓'})"


def results_table(metrics: Sequence[Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The generic results table of a benchmark's rows (flat, as in its metrics file): who, each
    declared metric (`pipeline.core.results.Metric`) with its direction, and the counters."""
    from pipeline.core.results import COUNTERS

    keys = [k for k in ("system", "setting", "judge") if any(k in r for r in rows)]
    extra = [
        k
        for r in rows[:1]
        for k in r
        if k not in ("benchmark", "model", *keys)
        and not isinstance(r[k], (int, float, dict, list))
        and r[k] is not None
        and not any(k == m.name for m in metrics)
    ]
    shown = [m for m in metrics if any(r.get(m.name) is not None for r in rows)] or list(metrics)
    counters = [c for c in ("n_items", "n_scored") if any(c in r for r in rows)]
    left = [c for c in COUNTERS if c not in counters and any(r.get(c) for r in rows)]
    flagged = any(r.get("flags") for r in rows)
    head = [
        *keys,
        *extra,
        *(_metric_head(m) for m in shown),
        *(c.removeprefix("n_").replace("_", " ") for c in (*counters, *left)),
        *(["flags"] if flagged else []),
    ]
    body = [
        [
            *(r.get(k) for k in keys),
            *(r.get(k) for k in extra),
            *(_cell(r, m, n == 0) for n, m in enumerate(shown)),
            *(r.get(c, 0) for c in (*counters, *left)),
            *([flag_cell(r)] if flagged else []),
        ]
        for r in rows
    ]
    return table(head, body)


def flag_cell(row: Mapping[str, Any]) -> str:
    """A row's flags in a table cell: their names, with the copy rate (`copied 0.93`)."""
    names = []
    for flag in row.get("flags") or ():
        name = str(flag).split(":", 1)[0]
        rate = row.get("copy_rate")
        names.append(f"{name} {rate:.2f}" if name == "copied" and rate is not None else name)
    return ", ".join(names)


def flagged_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = ()) -> list[str]:
    """A report section of the rows that carry flags (none: no section)."""
    found = [r for r in rows if r.get("flags")]
    if not found:
        return []
    who = [k for k in ("system", "setting", "judge", *keys) if any(k in r for r in found)]
    lines = [
        "### Flagged rows",
        "",
        "Read these rows' numbers with care (`flags` in the metrics file, the MLflow tag"
        " `lfbench.flags`):",
        "",
    ]
    for r in found:
        lines += [f"- {' / '.join(str(r.get(k)) for k in who)}: " + "; ".join(r["flags"])]
    return [*lines, ""]
