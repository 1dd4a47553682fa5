"""Compare a benchmark's metrics file with an earlier commit's, value by value.

    python scripts/compare_metrics.py summhay [--rev HEAD~3] [--file metrics/summhay.json]

Rows are matched by their identifying fields; a field renamed by the result model (issue 24) is
compared under its new name (RENAMES); every differing value, every field only one side has
and every row only one side has is printed. Exit 1 when a value differs or a row is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

# old name -> new name, per benchmark (the result model's standard counters)
RENAMES: dict[str, dict[str, str]] = {
    "summhay": {
        "n_summaries": "n_scored",
        "invalid_judgements": "n_invalid_verdicts",
        "n_invalid": "n_invalid_insights",
    },
    "long2rag": {
        "n_questions": "n_scored",
        "invalid_verdicts": "n_invalid_verdicts",
        "failed_generations": "n_failed_generations",
        "truncated_generations": "n_truncated",
        "n_excluded_questions": "n_excluded",
        "n_unjudged_questions": "n_invalid",
    },
    "crux": {"n_queries": "n_scored", "n_failed": "n_failed_generations"},
    # n_failed was failed generations and judgements (0 in every committed row); n_no_questions
    # (RAGQuestEval: no good question) is now an exclusion, reason "no questions" in `excluded`
    "crud_rag": {"n_failed": "n_failed_generations", "n_no_questions": "n_excluded"},
}
IDENT = ("benchmark", "domain", "collection", "mode", "task", "system", "setting", "judge",
         "model", "retriever", "cutoff", "knob")  # fmt: skip


def _key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{k}={row[k]}" for k in IDENT if k in row)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _renamed(value: Any, renames: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {renames.get(k, k): _renamed(v, renames) for k, v in value.items()}
    return value


def compare(bench: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    renames = RENAMES.get(bench, {})
    problems: list[str] = []
    added: set[str] = set()
    for section in sorted(set(old) | set(new)):
        if section not in new:
            problems.append(f"section {section!r} missing")
            continue
        if section not in old:
            added.add(f"section {section}")
            continue
        a, b = old[section], new[section]
        if not (isinstance(a, list) and isinstance(b, list)):
            if not _same(a, b):
                problems.append(f"section {section!r} differs")
            continue
        # the result model renamed the counters of result rows only
        olds = {_key(r): _renamed(r, renames) if section == "rows" else r for r in a}
        news = {_key(r): r for r in b}
        for k in sorted(set(olds) - set(news)):
            problems.append(f"{section}: row {k} missing")
        for k in sorted(set(news) - set(olds)):
            added.add(f"{section}: row {k}")
        for k in sorted(set(olds) & set(news)):
            ra, rb = olds[k], news[k]
            for f in ra:
                if f not in rb:
                    problems.append(f"{section}: row {k}: field {f!r} dropped")
                elif not _same(ra[f], rb[f]):
                    problems.append(f"{section}: row {k}: {f}: {ra[f]!r} -> {rb[f]!r}")
            added |= {f"{section}: field {f}" for f in rb if f not in ra}
    for a in sorted(added)[:40]:
        print(f"added: {a}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("benchmark")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--file", default=None)
    args = ap.parse_args()
    path = args.file or f"metrics/{args.benchmark}.json"
    old = json.loads(
        subprocess.run(
            ["git", "show", f"{args.rev}:metrics/{args.benchmark}.json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    new = json.loads(Path(path).read_text(encoding="utf-8"))
    problems = compare(args.benchmark, old, new)
    for p in problems[:60]:
        print(p)
    print(f"{args.benchmark}: {len(problems)} differing values or missing rows/fields")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
