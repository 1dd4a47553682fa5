"""`lfbench repro --cluster ADDR` and `lfbench worker`: the Dask cluster the stages run on.

A worker (`lfbench worker ADDR --clone DIR`, `serve`) is a Dask worker that owns one clone of
the project at the driver's commit, configured like every machine of the team (README, "Team
scale"); what it does with a stage is `pipeline/runner/worker.py`. The driver writes the entry
a worker sends back into its dvc.lock and pulls the outputs: its workspace ends as a serial
`dvc repro` leaves it, and no stage runs there.

Secrets never travel with a task: each worker reads its own (PGPASSWORD, S3 keys) from its
environment. Before anything, the scheduler's address is checked (`check_address`: never
printed with credentials) and reached within a bounded time (`probe_scheduler`), and every
worker is checked against the driver (`check_workers`): its commit, its DVC remote, and the
stores it would write MLflow runs and response-cache entries to, which must be the driver's
(`store`: a file or SQLite store is one machine's), and its clone's tracked files must be its
commit (`pipeline/runner/committed.py`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core.errors import LfbenchError
from pipeline.runner.clock import worker_resources
from pipeline.runner.committed import clone_changes, head_commit, known_outputs, modified
from pipeline.runner.worker import ENV_CLONE

logger = logging.getLogger(__name__)


def _redact(url: str | None) -> str | None:
    if not url:
        return url
    from pipeline.llm.cache import redact

    return redact(url)


def identity(root: Path) -> dict[str, Any]:
    """What the driver and every worker must agree on (credentials masked): the commit, the DVC
    remote, and where MLflow runs and response-cache entries go (`store`)."""
    from pipeline.core.lineage import git_info

    git = git_info(root)
    return {
        "commit": git.commit,
        "clone": str(root),
        "mlflow": store(os.environ.get("MLFLOW_TRACKING_URI"), root / "mlruns" / "mlflow.db", root),
        "cache": store(
            os.environ.get("LFBENCH_CACHE_URL"), root / ".lfbench" / "cache" / "llm.sqlite", root
        ),
        "remote": _dvc_remote(root),
    }


LOOPBACK = ("localhost", "ip6-localhost")


def _machine() -> str:
    """This machine's running kernel (its boot id: the same for every process and container on
    it, another after a reboot), or its host name where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        import socket

        return socket.gethostname()


def store(url: str | None, default: Path, root: Path) -> dict[str, Any]:
    """Where a store (MLflow's, the response cache) named by `url` (None: `default`, the
    clone's own) is, as two machines can compare: `shown` (the URL, password masked) and
    `where`. A file or SQLite database is one machine's: its folder's device and inode on this
    machine's kernel (the same folder, mounted in two containers, is one); a server by its URL,
    tied to this machine when its host is a loopback address."""
    import ipaddress
    from urllib.parse import urlsplit

    from pipeline.stages.mlflow_store import masked

    text = (url or "").strip() or f"sqlite:///{default}"
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    path: str | None = None
    if scheme == "sqlite":
        path = text[len("sqlite:///") :] if text.startswith("sqlite:///") else parts.path
    elif scheme == "file":
        path = parts.path
    elif len(scheme) <= 1:  # a plain path (MLflow's file store), or C:\ on Windows
        path = text
    if path is not None:
        where = Path(root, path) if not Path(path).is_absolute() else Path(path)
        try:
            st = where.parent.stat()
            place: list[Any] = ["file", _machine(), st.st_dev, st.st_ino, where.name]
        except OSError:
            place = ["file", _machine(), str(where)]
        return {"shown": masked(text), "where": place, "local": True}
    host = (parts.hostname or "").lower()
    try:
        loopback = host in LOOPBACK or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    key = masked(text)
    place = ["server", _machine(), key] if loopback else ["server", key]
    return {"shown": key, "where": place, "local": loopback}


_REMOTES: dict[tuple[str, tuple[int, ...]], str | None] = {}


def _dvc_remote(root: Path) -> str | None:
    """The default DVC remote's URL (credentials masked), DVC's config levels merged; kept
    per clone until one of its config files changes."""
    files = [root / ".dvc" / "config", root / ".dvc" / "config.local"]
    key = (str(root), tuple(f.stat().st_mtime_ns if f.exists() else 0 for f in files))
    if key not in _REMOTES:
        _REMOTES[key] = _ask_dvc_remote(root)
    return _REMOTES[key]


def _ask_dvc_remote(root: Path) -> str | None:
    from pipeline import dvc_internals as dvc

    try:
        url = dvc.default_remote_url(root)
    except Exception:  # noqa: BLE001 - as `dvc remote default` failing: no remote to compare
        return None
    return _redact(url) if url else None


def worker_identity() -> dict[str, Any]:
    """Run on each worker by the driver (`Client.run`)."""
    clone = os.environ.get(ENV_CLONE)
    if not clone:
        return {"error": "not an lfbench worker (no clone): start it with `lfbench worker`"}
    ident = identity(Path(clone))
    known = known_outputs(Path(clone))
    dirty = clone_changes(
        Path(clone),
        head_commit(Path(clone)),
        lambda: known if known is not None else _outputs_of(Path(clone)),
    )
    if dirty:
        ident["error"] = modified(None, Path(clone), ident["commit"], dirty)
    return ident


def _outputs_of(clone: Path) -> set[str]:
    from pipeline import dvc_internals as dvc

    with dvc.open_repo(clone) as repo:
        return dvc.output_paths(repo)


STORES = {
    "mlflow": (
        "MLflow runs",
        "set MLFLOW_TRACKING_URI to the team's tracking server (http://HOST:PORT) or database"
        " (postgresql://USER@HOST:PORT/DB), the same on the driver and on every worker",
    ),
    "cache": (
        "response-cache entries",
        "set LFBENCH_CACHE_URL to the team's response cache (postgresql://USER@HOST:PORT/DB),"
        " the same on the driver and on every worker, or pass --no-shared-cache to let each"
        " worker keep its own (a request two workers need is then paid by each)",
    ),
}


def check_workers(client: Any, mine: Mapping[str, Any], shared_cache: bool = True) -> list[str]:
    """The workers of the cluster, checked against the driver: the same commit and DVC remote,
    and the stores the driver reads (its MLflow runs, its response cache: a file or SQLite
    store is one machine's, and by default each clone's own). Raises naming each worker that
    differs; `shared_cache=False` (--no-shared-cache) lets each worker keep its own cache."""
    seen = client.run(worker_identity)
    if not seen:
        raise LfbenchError("the cluster has no workers: start some with `lfbench worker ADDR`")
    bad = []
    unshared: set[str] = set()
    for addr, ident in sorted(seen.items()):
        if "error" in ident:
            bad.append(f"{addr}: {ident['error']}")
            continue
        who = f"{addr} ({ident.get('clone')})"
        for key in ("commit", "remote"):
            if ident.get(key) != mine.get(key):
                bad.append(f"{who}: {key} {ident.get(key)!r}, the driver's {mine.get(key)!r}")
        for key, (what, _) in STORES.items():
            if key == "cache" and not shared_cache:
                continue
            theirs, ours = ident.get(key) or {}, mine.get(key) or {}
            if theirs.get("where") != ours.get("where"):
                unshared.add(key)
                bad.append(
                    f"{who}: would write its {what} to {theirs.get('shown')}, which the driver"
                    f" does not share (it reads {ours.get('shown')})"
                )
    if bad:
        fixes = "".join(f"\n{STORES[k][1]}" for k in STORES if k in unshared)
        raise LfbenchError(
            "workers that cannot run this repro (each must be a clone at the driver's commit,"
            " with the team's environment):\n  " + "\n  ".join(bad) + fixes
            + ("\n(a file or SQLite store is one machine's, and by default each clone's own)"
               if unshared else "")
        )  # fmt: skip
    return sorted(seen)


# ---------------------------------------------------------------- the scheduler's address

SCHEMES = ("tcp", "tls", "inproc")  # Dask's comms lfbench takes (inproc: within one process)
DRIVER_CONNECT_S = 10.0  # `lfbench repro --cluster`: a scheduler answers within this
WORKER_CONNECT_S = 120.0  # `lfbench worker`: waits this long for its scheduler to be up
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/]*@")
_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def mask_address(text: str) -> str:
    """An address as it may be printed: whatever stands before an `@` (a user name, a password,
    a token) is `***`."""
    return _USERINFO.sub(lambda m: f"{m.group(1) or ''}***@", text.strip())


def check_address(text: str) -> str:
    """A Dask scheduler's address, checked before anything connects: `tcp://HOST:PORT` (a bare
    `HOST:PORT` is tcp, as Dask reads it), `tls://HOST:PORT`, or an `inproc://` address. Raises
    a one-line error naming the address (credentials masked) and what to write instead."""
    raw = text.strip()
    shown = mask_address(raw)
    hint = "the scheduler's address is tcp://HOST:PORT, as `dask scheduler` prints it"
    if not raw or any(c.isspace() for c in raw):
        raise LfbenchError(f"{shown!r}: not a Dask scheduler address; {hint}")
    scheme, sep, rest = raw.partition("://")
    if not sep:
        scheme, rest = "tcp", raw
    scheme = scheme.lower()
    if scheme in ("http", "https", "ws", "wss"):
        raise LfbenchError(
            f"{shown}: a web URL (the dashboard's?) is not where Dask's clients and workers"
            f" connect; {hint} (port 8786 by default)"
        )
    if scheme not in SCHEMES:
        raise LfbenchError(f"{shown}: scheme {scheme!r}: use tcp:// or tls://; {hint}")
    if scheme == "inproc":
        return raw
    if "@" in rest:
        raise LfbenchError(
            f"{shown}: an address with a user name or password; Dask's addresses carry none"
            " (a scheduler that needs credentials: tls:// with Dask's TLS certificates)"
        )
    rest = rest.rstrip("/")
    if "/" in rest or "?" in rest or "#" in rest:
        raise LfbenchError(f"{shown}: an address has no path or query; {hint}")
    if rest.startswith("["):  # an IPv6 address
        host, _, port = rest[1:].partition("]")
        port = port[1:] if port.startswith(":") else ""
        try:
            ok_host = bool(ipaddress.IPv6Address(host))
        except ValueError:
            ok_host = False
        shown_host = f"[{host}]"
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
        ok_host = bool(_HOST.match(host))
        shown_host = host
    if not host and not port:
        raise LfbenchError(f"{shown}: no host and port; {hint}")
    if not port or not port.isdigit() or not 0 < int(port) < 65536:
        raise LfbenchError(
            f"{shown}: {'no port' if not port else f'port {port!r} is not a port number'};"
            f" {hint} (port 8786 by default)"
        )
    if not ok_host:
        raise LfbenchError(f"{shown}: host {host!r} is not a host name or address; {hint}")
    return f"{scheme}://{shown_host}:{int(port)}"


class Unreachable(LfbenchError):
    """No scheduler answered at an address (`reason`: what happened); `lasting`: waiting will
    not help (an unknown host, another kind of server there)."""

    def __init__(self, address: str, reason: str, hint: str = "", lasting: bool = False):
        super().__init__(f"{address}: {reason}" + (f"; {hint}" if hint else ""))
        self.reason = reason
        self.lasting = lasting


def probe_scheduler(address: str, timeout: float) -> None:
    """A Dask scheduler answers at `address` (checked by `check_address`) within `timeout`
    seconds: a TCP connection, then Dask's handshake, bounded as a whole (Dask's own connect
    waits on a server that accepts and never answers, an HTTP server, with no end, and reads
    an HTTP answer as the length of a frame: "Unable to allocate 3.01 EiB"). Raises an
    LfbenchError naming the address and what answered there."""
    import asyncio
    import socket

    from distributed.comm.core import connect

    scheme, _, rest = address.partition("://")
    start = "start the scheduler (`dask scheduler --port 8786`) or fix the address"
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except socket.gaierror as e:
            raise Unreachable(address, f"unknown host {host!r} ({e.strerror})", lasting=True) from e
        except ConnectionRefusedError as e:
            raise Unreachable(address, "nothing listens there (connection refused)", start) from e
        except TimeoutError as e:
            raise Unreachable(address, f"no answer within {timeout:g} s", start) from e
        except OSError as e:
            raise Unreachable(address, f"cannot connect ({e.strerror or e})", start) from e

    from distributed.security import Security

    # tls://: the certificates of Dask's own configuration (distributed.comm.tls.*), as the
    # client and the worker use them
    args = Security().get_connection_args("client")
    if scheme == "tls" and args.get("ssl_context") is None:
        raise Unreachable(
            address,
            "a tls:// scheduler needs Dask's TLS settings (distributed.comm.tls.ca-file and the"
            " client's certificate, e.g. DASK_DISTRIBUTED__COMM__TLS__CA_FILE)",
            lasting=True,
        )

    async def handshake() -> None:
        comm = await asyncio.wait_for(connect(address, timeout=timeout, **args), timeout)
        await comm.close()

    port_hint = "the scheduler's port is 8786 by default (8787 is its dashboard's)"
    try:
        asyncio.run(handshake())
    except TimeoutError as e:
        what = "it accepted a connection, but " if scheme == "tcp" else ""
        raise Unreachable(
            address, f"{what}no Dask scheduler answered within {timeout:g} s", port_hint
        ) from e
    except OSError as e:
        raise Unreachable(address, f"no Dask scheduler answered ({e})", start) from e
    except Exception as e:  # MemoryError, a bad frame: not Dask's protocol
        raise Unreachable(
            address,
            f"what answers there is not a Dask scheduler ({type(e).__name__})",
            port_hint,
            lasting=True,
        ) from e


def connect_client(address: str, timeout: float = DRIVER_CONNECT_S) -> Any:
    """A Dask client of the scheduler at `address`, checked first (`check_address`,
    `probe_scheduler`): a clear error within `timeout` seconds, never a traceback."""
    from distributed import Client

    address = check_address(address)
    probe_scheduler(address, timeout)
    try:
        return Client(address, timeout=f"{timeout}s")
    except Exception as e:  # it answered the probe a moment ago
        raise LfbenchError(f"{address}: connecting to the scheduler failed ({e})") from e


def wait_for_scheduler(address: str, timeout: float) -> None:
    """`lfbench worker`: say what it waits for, then wait up to `timeout` seconds for a
    scheduler to answer at `address` (a scheduler may start after its workers); an address
    where something else answers is an error at once."""
    logger.info("waiting for the Dask scheduler at %s (up to %g s)", address, timeout)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            probe_scheduler(address, max(1.0, min(left, 10.0)))
            return
        except Unreachable as e:
            if e.lasting:
                raise
            if time.monotonic() + 1.0 >= deadline:
                raise LfbenchError(
                    f"no Dask scheduler answered at {address} within {timeout:g} s ({e.reason}):"
                    " start it (`dask scheduler --port 8786`), fix the address, or wait longer"
                    " (--connect-timeout)"
                ) from e
            time.sleep(1.0)


# ---------------------------------------------------------------- the worker process


def serve(
    scheduler: str,
    clone: Path,
    jobs: int,
    name: str | None,
    connect_timeout: float = WORKER_CONNECT_S,
) -> None:
    """`lfbench worker`: a Dask worker for `lfbench repro --cluster`, owning `clone`. Checked
    before it joins: the address, the clone (a project, its tracked files as committed), then
    a scheduler answering within `connect_timeout` seconds."""
    import asyncio

    from distributed import Worker

    address = check_address(scheduler)
    clone = clone.resolve()
    if not (clone / "dvc.yaml").exists():
        raise LfbenchError(f"{clone}: not a clone of the project (no dvc.yaml)")
    head = head_commit(clone)
    dirty = clone_changes(clone, head, lambda: _outputs_of(clone))
    if dirty:
        raise LfbenchError(modified(name, clone, head, dirty))
    os.environ[ENV_CLONE] = str(clone)
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 1
    wait_for_scheduler(address, connect_timeout)

    threads, resources = worker_resources(jobs, ncpu)

    async def main() -> None:
        async with Worker(
            address,
            nthreads=threads,
            resources=resources,
            name=name,
            dashboard=False,
            # its comms listen where the scheduler and the other workers reach it; the HTTP
            # server Dask starts anyway (its metrics) only on loopback
            dashboard_address="127.0.0.1:0",
        ) as worker:
            logger.info(
                "worker %s joined the scheduler at %s: clone %s at %s, %d stage(s) at once",
                worker.name, address, clone, head[:12], jobs,
            )  # fmt: skip
            await worker.finished()

    asyncio.run(main())
