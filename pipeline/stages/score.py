"""`lfbench score`: a benchmark's reference metrics on a user's own outputs, without the pipeline.

Input: JSONL lines `{"id", "generation", "reference"}` (other fields are kept). Output: each line
back, with `"metrics": {...}` or, where the line cannot be scored (an empty output, a missing
field), `"error": "..."` and no metrics. The benchmark's `scorer` is the same code its pipeline
judge uses, so a number here equals the pipeline's for the same texts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark
from pipeline.core.errors import ConfigError, DataError

log = logging.getLogger(__name__)


def _line_error(row: Any, where: str) -> str | None:
    if not isinstance(row, dict):
        return f"{where}: a line must be a JSON object"
    for field in ("id", "generation", "reference"):
        if field not in row:
            return f"{where}: missing field {field!r}"
    for field in ("generation", "reference"):
        if not isinstance(row[field], str):
            return f"{where}: field {field!r} must be a string"
    return None


def score_file(bench: AnyBenchmark, src: Path, out: Path) -> tuple[int, int]:
    """Scores every line of `src` into `out`; returns (scored, errors).

    A line that is not JSON stops the run with an error naming the file and line (the output
    would not be the input's lines back); a line that cannot be scored gets its `error`."""
    if bench.scorer is None:
        raise ConfigError(f"benchmark {bench.name!r} has no reference scorer for `lfbench score`")
    try:
        lines = src.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror}", file=str(src)) from e
    rows: list[Any] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"line {n}: not JSON ({e.msg})", file=str(src)) from e
    scored = errors = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for n, row in enumerate(rows, start=1):
            where = f"{src}: item {row.get('id', '?') if isinstance(row, dict) else '?'} (line {n})"
            problem = _line_error(row, where)
            if problem is None:
                try:
                    metrics = bench.scorer.score_line(row["generation"], row["reference"])
                    row = {k: v for k, v in row.items() if k != "error"} | {"metrics": metrics}
                    scored += 1
                except ValueError as e:
                    problem = f"{where}: {e}"
            if problem is not None:
                errors += 1
                log.warning("%s", problem)
                base = row if isinstance(row, dict) else {"line": row}
                row = {k: v for k, v in base.items() if k != "metrics"} | {"error": problem}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(out)
    return scored, errors
