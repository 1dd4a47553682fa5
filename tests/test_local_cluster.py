"""The Dask servers `lfbench repro` starts (issue 42, point 6b and 6c): its own cluster listens
on 127.0.0.1 only and never asks for port 8787 (a second run, or anything on 8787, made Dask warn
"Port 8787 is already in use" into the live view); a `lfbench worker`'s comms listen where the
scheduler reaches it, its HTTP server only on loopback."""

from __future__ import annotations

import contextlib
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.test_cluster import _scheduler, _worker, team  # noqa: F401 - the fixture


def _listening(pid: int | None = None) -> set[tuple[str, int]]:
    conns = psutil.Process(pid).net_connections(kind="inet")
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


@contextlib.contextmanager
def _port_8787_taken() -> Iterator[None]:
    """Port 8787 in use, as by another `lfbench repro` (or already by someone else)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 8787))
        s.listen()
    except OSError:
        pass  # taken already
    try:
        yield
    finally:
        s.close()


def test_the_driver_s_cluster_listens_on_loopback_only_and_not_on_8787() -> None:
    from distributed import Client, LocalCluster

    from pipeline.runner.driver import local_cluster_options

    with _port_8787_taken(), warnings.catch_warnings(record=True) as caught:
        before = _listening()  # with this test's own socket on 8787, if it got the port
        warnings.simplefilter("always")
        with LocalCluster(**local_cluster_options(3)) as lc, Client(lc):
            new = _listening() - before
            assert lc.scheduler_address.startswith("tcp://127.0.0.1:")
    assert new, "nothing listens"
    assert {ip for ip, _ in new} == {"127.0.0.1"}, new
    assert all(port != 8787 for _, port in new), new
    assert not [w for w in caught if "already in use" in str(w.message)], caught


@pytest.mark.slow
def test_a_worker_s_http_server_listens_on_loopback_only(
    team: dict[str, Path],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    from distributed import Client

    with _scheduler(tmp_path) as address, _worker(address, team["w1"], {}) as proc:
        with Client(address, timeout="30s") as c:
            (comm,) = c.scheduler_info()["workers"]
        comm_port = int(comm.rsplit(":", 1)[1])
        others = {(ip, port) for ip, port in _listening(proc.pid) if port != comm_port}
        assert others, "no HTTP server found"
        assert {ip for ip, _ in others} == {"127.0.0.1"}, others
