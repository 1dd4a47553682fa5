"""How long `make test`'s pytest-xdist run lasts with a given order of the test files.

    python perf/test_order.py [LOG]    LOG: perf/test_cpu.py's log (each test's wall time);
                                       default perf/test_walls.jsonl

perf/test_walls.jsonl is the log of one whole run (4 workers, 2 cores, 1,424 s of pytest) at
6c352b5; 7 quick tests of test_parallel.py and test_view.py failed in it (the run's PATH lacked
the venv, so `dvc` and `python` were not found), the others passed.

Simulates pytest-xdist's `--dist loadfile --no-loadscope-reorder` scheduler (xdist 3.8's
LoadScopeScheduling): 4 workers; each gets one file, then another whenever at most 2 of its tests
are pending (so the worker of a one-test file takes the next file at once); the queue is the
files in `tests/conftest.py`'s HEAVY_FIRST order, then the rest in collection order. Each test
takes its logged wall time, each varied by a factor of 0.85-1.18 over 400 draws: the 10th, 50th,
90th and 99th percentile of the run's end, for the order of HEAVY_FIRST and for the plain
longest-first order. A model, not a measurement: in a real run the tests share 2 cores, so one
that runs beside fewer others is faster; what it shows is which order leaves a core idle at the
end.
"""

from __future__ import annotations

import collections
import heapq
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKERS = 4


def walls(log: Path) -> dict[str, list[float]]:
    files: dict[str, list[float]] = collections.OrderedDict()
    for line in log.read_text().splitlines():
        r = json.loads(line)
        files.setdefault(r["test"].split("::")[0], []).append(float(r["wall"]))
    return files


def end_of_run(order: list[str], files: dict[str, list[float]]) -> float:
    queue = collections.deque(
        [f for f in order if f in files] + [f for f in files if f not in order]
    )
    pending: dict[int, collections.deque[float]] = {i: collections.deque() for i in range(WORKERS)}

    def assign(i: int) -> None:
        if queue:
            pending[i].extend(files[queue.popleft()])

    for i in range(WORKERS):
        assign(i)
    for i in range(WORKERS):
        if len(pending[i]) <= 2:
            assign(i)
    heap = [(0.0, i) for i in range(WORKERS)]
    end = 0.0
    while heap:
        now, i = heapq.heappop(heap)
        if not pending[i]:
            end = max(end, now)
            continue
        wall = pending[i].popleft()
        if len(pending[i]) <= 2:
            assign(i)
        heapq.heappush(heap, (now + wall, i))
    return end


def percentiles(order: list[str], files: dict[str, list[float]], n: int = 400) -> list[int]:
    out = []
    for k in range(n):
        rnd = random.Random(k)
        varied = {f: [w * rnd.uniform(0.85, 1.18) for w in v] for f, v in files.items()}
        out.append(end_of_run(order, varied))
    out.sort()
    return [round(out[int(n * q)]) for q in (0.1, 0.5, 0.9, 0.99)]


def main() -> None:
    from tests.conftest import HEAVY_FIRST

    files = walls(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("test_walls.jsonl")
    )
    longest = sorted(files, key=lambda f: -sum(files[f]))
    print("end of run, s (10th, 50th, 90th, 99th percentile)")
    print(f"  HEAVY_FIRST:     {percentiles(list(HEAVY_FIRST), files)}")
    print(f"  longest first:   {percentiles(longest, files)}")


if __name__ == "__main__":
    main()
