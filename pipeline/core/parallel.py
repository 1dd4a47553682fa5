"""Map a function over items on every core, by fork.

The stages run one at a time under `dvc repro`, and most of them on one core: the item scores,
bootstrap intervals and plots of the aggregate and agreement stages are independent pieces of
work that can use the others. Children are forked (Linux): they inherit the parent's memory, so
the function (a closure is fine) and its inputs need no pickling; only the results travel back.
The result is `[fn(x) for x in items]`, in order, each computed exactly as the parent would, so
the numbers do not depend on the number of cores. An exception in a child is raised again by
the parent, which re-runs that one item itself: the error is the one a single process gives.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from itertools import pairwise
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

ENV_WORKERS = "LFBENCH_WORKERS"  # at most this many processes (1: everything in the parent)

_WORK: list[Any] = []
_FN: list[Callable[[Any], Any]] = []


def workers() -> int:
    """The cores this process may use, capped by $LFBENCH_WORKERS."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    cap = os.environ.get(ENV_WORKERS, "").strip()
    return max(1, min(n, int(cap))) if cap.isdigit() and int(cap) > 0 else max(1, n)


class _Failed:
    """A child's report that item `index` raised (the parent re-runs it to raise it)."""

    def __init__(self, index: int) -> None:
        self.index = index


def _chunk(bounds: tuple[int, int]) -> list[Any] | _Failed:
    fn, out = _FN[0], []
    for i in range(*bounds):
        try:
            out.append(fn(_WORK[i]))
        except Exception:  # noqa: BLE001 - the parent re-runs it and raises the real error
            return _Failed(i)
    return out


def fork_map(fn: Callable[[T], R], items: Iterable[T], *, min_items: int = 2) -> list[R]:
    """[fn(x) for x in items], shared out among forked processes (one per core) in contiguous
    chunks. Fewer than `min_items` items, one core, no fork, or a call from inside a child:
    in this process."""
    todo = list(items)
    n = min(workers(), len(todo))
    if n <= 1 or len(todo) < min_items or _WORK or "fork" not in mp.get_all_start_methods():
        return [fn(x) for x in todo]
    pieces = min(len(todo), n * 4)  # a few chunks per core: a slow chunk does not hold the rest
    cuts = [len(todo) * k // pieces for k in range(pieces + 1)]
    _WORK[:] = todo
    _FN[:] = [fn]
    try:
        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
            done = list(pool.map(_chunk, pairwise(cuts)))
    finally:
        _WORK.clear()
        _FN.clear()
    out: list[R] = []
    for part in done:
        if isinstance(part, _Failed):
            fn(todo[part.index])  # raises here, as one process would
            raise RuntimeError(f"item {part.index} failed in a child but not in the parent")
        out.extend(part)
    return out
