"""Every metrics file of the working tree against a commit's, value for value.

    python scripts/same_metrics.py [--rev main | --tree DIR] [FILE ...]   (default: metrics/*.json)

Each file is parsed on both sides and compared as JSON: every key, every value (floats exactly)
and the order of every list (the rows' order is part of a metrics file). Prints one line per
file (`same`, or the first differences with their JSON path) and exits 1 when any differs or is
missing on one side. A refactor that must not change results runs `dvc repro`, then this.
`--tree DIR` compares with another checkout's files instead (e.g. the code before the change,
run on the same inputs: a stage whose output depends on the machine, such as the local judge's
training, then differs from the committed files on both sides alike).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def differences(a: Any, b: Any, path: str = "$") -> list[str]:
    """Where two parsed JSON documents differ (a: the commit's, b: the working tree's)."""
    if type(a) is not type(b):
        return [f"{path}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"]
    if isinstance(a, dict):
        out = [f"{path}.{k}: only in the commit" for k in a if k not in b]
        out += [f"{path}.{k}: only in the working tree" for k in b if k not in a]
        for k in a:
            if k in b:
                out += differences(a[k], b[k], f"{path}.{k}")
        if not out and list(a) != list(b):
            out.append(f"{path}: the same keys in another order")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} entries -> {len(b)}"]
        return [
            d
            for n, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{n}]")
        ]
    return [] if a == b else [f"{path}: {json.dumps(a)} -> {json.dumps(b)}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="main")
    parser.add_argument("--tree", type=Path, default=None, help="another checkout's files")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    files = args.files or sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "metrics").glob("*.json")
    )
    bad = 0
    for rel in files:
        path = ROOT / rel
        if args.tree is not None:
            theirs = args.tree / rel
            text = theirs.read_text(encoding="utf-8") if theirs.exists() else None
            where = str(args.tree)
        else:
            old = subprocess.run(
                ["git", "show", f"{args.rev}:{rel}"], cwd=ROOT, capture_output=True, text=True
            )
            text = old.stdout if old.returncode == 0 else None
            where = args.rev
        if text is None or not path.exists():
            print(f"{rel}: missing {'in ' + where if text is None else 'here'}")
            bad += 1
            continue
        diff = differences(json.loads(text), json.loads(path.read_text(encoding="utf-8")))
        print(f"{rel}: " + ("same" if not diff else f"{len(diff)} differences"))
        for line in diff[:20]:
            print(f"  {line}")
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
