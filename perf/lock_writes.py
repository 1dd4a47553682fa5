"""CPU time of `lfbench repro`'s dvc.lock rewrites on the default DAG: DVC's whole-file dump
after each finished stage, against `dvc_internals.LockText` (each entry dumped once).

    python perf/lock_writes.py [--lock dvc.lock] [--repeat 3]

Replays the committed dvc.lock's entries as a fresh clone's `lfbench repro` writes them (one
entry more per rewrite, each a new object as DVC hands it over), checks that both give the same
text each time, and prints the CPU seconds of all the rewrites, best of `--repeat`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from pipeline import dvc_internals as dvc


def replay(entries: dict[str, Any], dump: Any) -> tuple[float, list[str]]:
    doc: dict[str, Any] = {"schema": "2.0", "stages": {}}
    texts = []
    t0 = time.process_time()
    for key, entry in entries.items():
        doc["stages"][key] = json.loads(json.dumps(entry))
        texts.append(dump(doc))
    return time.process_time() - t0, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=Path("dvc.lock"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from dvc.utils.serialize import dumps_yaml

    entries = json.loads(json.dumps(dvc.read_lock_doc(args.lock)["stages"]))
    whole, lock_text = [], []
    for _ in range(args.repeat):
        t, a = replay(entries, dumps_yaml)
        whole.append(t)
        memo = dvc.LockText()
        t, b = replay(entries, memo.dumps)
        lock_text.append(t)
        assert a == b, "LockText differs from DVC's dump"
    size = len(a[-1].encode())
    print(f"{len(entries)} entries, {size:,} bytes at the end, {len(entries)} rewrites")
    print(f"DVC's whole-file dump: {min(whole):.2f} CPU-s")
    print(f"LockText:              {min(lock_text):.2f} CPU-s (the same text each time)")


if __name__ == "__main__":
    main()
