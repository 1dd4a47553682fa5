"""What DVC's YAML handling costs per stage, with and without ruamel.yaml's C parser.

    python perf/dvc_yaml.py [--repeat 5]

`dvc repro` reads dvc.lock (and dvc.yaml, params.yaml) several times around each stage it runs
and rewrites dvc.lock after it. ruamel.yaml 0.19 no longer installs its C parser by default, so
DVC's "safe" reads ran in pure Python; the project now installs `ruamel.yaml.clib`. This times
one safe read of each file with the C parser and with the pure-Python one (`pure=True`), and the
round-trip read and the dump DVC does to update dvc.lock (pure Python either way). Median of
--repeat.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]


def _median(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    try:
        import _ruamel_yaml  # noqa: F401

        has_c = True
    except ImportError:
        has_c = False
    print(f"ruamel.yaml C parser installed: {has_c}")
    print(
        f"{'file':12} {'size':>8} {'safe, C':>9} {'safe, pure':>11} {'round-trip':>11} {'dump':>7}"
    )
    for name in ("dvc.lock", "dvc.yaml", "params.yaml"):
        text = (ROOT / name).read_text(encoding="utf-8")
        fast = _median(lambda t=text: YAML(typ="safe").load(t), args.repeat)
        pure = _median(lambda t=text: YAML(typ="safe", pure=True).load(t), args.repeat)
        rt = _median(lambda t=text: YAML().load(t), args.repeat)
        data = YAML().load(text)
        dump = _median(lambda d=data: YAML().dump(d, io.StringIO()), args.repeat)
        print(f"{name:12} {len(text):8d} {fast:8.3f}s {pure:10.3f}s {rt:10.3f}s {dump:6.3f}s")


if __name__ == "__main__":
    main()
