"""`lfbench score`: a benchmark's reference metrics on a user's own outputs, without the pipeline.

Input: JSONL lines `{"id", "generation", "reference"}` (other fields are kept). Output: each line
back, with `"metrics": {...}` or, where the line cannot be scored (an empty output, a missing
field), `"error": "..."` and no metrics; as a linter does, the command then exits 3 when any line
has an error (the output written all the same). The benchmark's `scorer` is the same code its
pipeline judge uses, so a number here equals the pipeline's for the same texts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.extensions import Scorer
from pipeline.core.io import atomic_write_text, check_output, iter_lines

log = logging.getLogger(__name__)


def _line_error(row: Any, where: str) -> str | None:
    if not isinstance(row, dict):
        return f"{where}: a line must be a JSON object"
    for field in ("id", "generation", "reference"):
        if field not in row:
            return f"{where}: missing field {field!r}"
    if not isinstance(row["id"], str) or not row["id"].strip():
        return f"{where}: field 'id' must be a non-empty string"
    for field in ("generation", "reference"):
        if not isinstance(row[field], str):
            return f"{where}: field {field!r} must be a string"
    return None


def score_file(bench: AnyBenchmark, src: Path, out: Path) -> tuple[int, int, str | None]:
    """Scores every line of `src` into `out`; returns (scored, errors, the first error).

    `out` is checked before any work (a folder or a place that cannot be written is refused,
    nothing is left behind). A line that is not JSON or not UTF-8 stops the run with an error
    naming the file and line, as the file counts lines (the output would not be the input's
    lines back); a line that cannot be scored gets its `error`: a missing field, a field of the
    wrong type, an id that is not a non-empty string, or an id that another line has too (every
    line with that id: which one is meant is not known)."""
    scorer = Scorer.of(bench)
    if scorer is None:
        raise ConfigError(f"benchmark {bench.name!r} has no reference scorer for `lfbench score`")
    check_output(out)
    rows: list[tuple[int, Any]] = []
    for n, line in iter_lines(src):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError(f"line {n}: not JSON ({e.msg})", file=str(src)) from e
    lines_of: dict[str, list[int]] = {}
    for n, row in rows:
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            lines_of.setdefault(row["id"], []).append(n)
    scored = errors = 0
    first: str | None = None
    written: list[str] = []
    for n, row in rows:
        ident = row.get("id", "?") if isinstance(row, dict) else "?"
        where = f"{src}: item {ident} (line {n})"
        problem = _line_error(row, where)
        if problem is None and len(lines_of[row["id"]]) > 1:
            others = ", ".join(str(m) for m in lines_of[row["id"]])
            problem = f"{where}: id {row['id']!r} is on lines {others} (an id must be unique)"
        if problem is None:
            try:
                metrics = scorer.score_line(row["generation"], row["reference"])
                row = {k: v for k, v in row.items() if k != "error"} | {"metrics": metrics}
                scored += 1
            except ValueError as e:
                problem = f"{where}: {e}"
        if problem is not None:
            errors += 1
            first = first or problem
            log.warning("%s", problem)
            base = row if isinstance(row, dict) else {"line": row}
            row = {k: v for k, v in base.items() if k != "metrics"} | {"error": problem}
        written.append(json.dumps(row, ensure_ascii=False) + "\n")
    try:
        atomic_write_text(out, "".join(written))
    except OSError as e:  # after the check: the disk filled, or the folder went away
        raise DataError(f"cannot write: {e.strerror or e}", file=str(out)) from e
    return scored, errors, first
