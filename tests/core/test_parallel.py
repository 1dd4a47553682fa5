"""fork_map: the same list as a plain map, in order, whatever the number of cores; a child's
error is raised as the parent would raise it."""

from __future__ import annotations

import os

import pytest

from pipeline.core import parallel


class Odd(Exception):
    def __init__(self, *, item: int) -> None:  # keyword-only: does not unpickle
        super().__init__(f"item {item} is odd")


def test_same_list_in_order_and_in_children(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.ENV_WORKERS, "2")
    if parallel.workers() < 2:
        pytest.skip("one core: nothing runs in a child")
    parent = os.getpid()
    got = parallel.fork_map(lambda x: (x * x, os.getpid()), range(37))
    assert [v for v, _ in got] == [x * x for x in range(37)]
    assert {pid for _, pid in got} - {parent}, "no item ran in a child"


def test_one_worker_runs_in_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.ENV_WORKERS, "1")
    assert parallel.workers() == 1
    assert {pid for pid in parallel.fork_map(lambda _: os.getpid(), range(5))} == {os.getpid()}


def test_a_childs_error_is_the_parents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.ENV_WORKERS, "2")

    def even(x: int) -> int:
        if x == 23:
            raise Odd(item=x)
        return x

    with pytest.raises(Odd, match="item 23 is odd"):
        parallel.fork_map(even, range(40))
    assert parallel.fork_map(even, range(23)) == list(range(23))
