"""`lfbench repro --cluster ADDR`: the stages on a Dask cluster's workers, each in its own clone.

A worker (`lfbench worker ADDR --clone DIR`) is a Dask worker that owns one clone of the
project at the driver's commit, configured like every machine of the team (README, "Team
scale": the team's DVC remote, MLflow server and response cache in its environment). For a stage
the driver sends (`TaskSpec.cluster`): the driver's params.yaml, dvc.yaml and dvc.lock (with
the entries of the stages finished so far; each replaced whole in the clone, where other stages
may be reading it) and the bytes of the uncached outputs the stage reads (metrics files kept in
git). In its clone the worker then does what `dvc repro --pull` would do for that one stage: it
pulls the outputs the stage depends on from the remote, restores the stage from the run cache
if the team already ran it (`restore`, in DVC's order), else runs its command (several stages
of one clone at once: the DVC steps under the repository's lock, the commands outside it, as
DVC does), then pushes its outputs and run-cache entry to the remote and returns its dvc.lock
entry and its uncached outputs. The driver writes the entry into its dvc.lock and pulls the
outputs: its workspace ends as a serial `dvc repro` leaves it, and no stage runs there.

Secrets never travel with a task: each worker reads its own (PGPASSWORD, S3 keys) from its
environment. Before anything, the scheduler's address is checked (`check_address`: never
printed with credentials) and reached within a bounded time (`probe_scheduler`), and every
worker is checked against the driver (`check_workers`): its commit, its DVC remote, and the
stores it would write MLflow runs and response-cache entries to, which must be the driver's
(`store`: a file or SQLite store is one machine's). A worker runs its clone's code only when
the clone's tracked files are its commit (`clone_changes`: `git status` once per commit, then a
stat of each tracked file per stage), less what a repro itself changes (`uncommitted`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import posixpath
import re
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import LfbenchError
from pipeline.core.io import write_if_changed
from pipeline.dvc_internals import memo_yaml, one_remote_session
from pipeline.runner.task import TaskResult, TaskSpec, log_path, run_commands

logger = logging.getLogger(__name__)
ENV_CLONE = "LFBENCH_WORKER_CLONE"
# the files of the driver's workspace a worker's clone takes as they are (the pipeline's
# definition, and the lock with the stages finished so far)
SHIPPED = ("params.yaml", "dvc.yaml", "dvc.lock")
_CLONE_LOCKS: dict[str, threading.Lock] = {}


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
    """The default DVC remote's URL (credentials masked), as `dvc config` gives it (DVC's
    config levels merged); kept per clone until one of its config files changes (asking DVC
    costs two CLI starts, seconds a stage on a busy worker)."""
    files = [root / ".dvc" / "config", root / ".dvc" / "config.local"]
    key = (str(root), tuple(f.stat().st_mtime_ns if f.exists() else 0 for f in files))
    if key not in _REMOTES:
        _REMOTES[key] = _ask_dvc_remote(root)
    return _REMOTES[key]


def _ask_dvc_remote(root: Path) -> str | None:
    proc = subprocess.run(
        ["dvc", "remote", "default"], cwd=root, capture_output=True, text=True, check=False
    )
    name = proc.stdout.strip()
    if proc.returncode != 0 or not name:
        return None
    url = subprocess.run(
        ["dvc", "config", f"remote.{name}.url"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return _redact(url) or None


def worker_identity() -> dict[str, Any]:
    """Run on each worker by the driver (`Client.run`)."""
    clone = os.environ.get(ENV_CLONE)
    if not clone:
        return {"error": "not an lfbench worker (no clone): start it with `lfbench worker`"}
    ident = identity(Path(clone))
    snap = _SNAPSHOTS.get(str(Path(clone)))
    dirty = clone_changes(
        Path(clone),
        _head(Path(clone)),
        lambda: snap.outputs if snap is not None else _outputs_of(Path(clone)),
    )
    if dirty:
        ident["error"] = modified(None, Path(clone), ident["commit"], dirty)
    return ident


def _outputs_of(clone: Path) -> set[str]:
    from dvc.repo import Repo

    with Repo(str(clone)) as repo:
        return dvc_outputs(repo)


def modified(worker: str | None, clone: Path, head: str, files: Sequence[str]) -> str:
    who = f"worker {worker} ({clone})" if worker else str(clone)
    return (
        f"{who}: tracked files differ from its commit {head[:12]}: {shown(files)}; a worker"
        " runs committed code only: commit them (and run the repro from that commit) or"
        " restore them in the clone (`git checkout -- FILE`)"
    )


def _worker_label(host: str) -> str:
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return host
    return f"{worker.name} on {host}" if worker.name != worker.address else worker.address


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


# ---------------------------------------------------------------- committed code


def dvc_outputs(repo: Any) -> set[str]:
    """The paths (relative, posix) of every output DVC knows in this repository: the stages'
    and the .dvc files' (data/)."""
    root = Path(repo.root_dir)
    outs = set()
    for out in repo.index.outs:
        path = Path(out.fs_path)
        if root in path.parents:
            outs.add(path.relative_to(root).as_posix())
    return outs


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(root), "--literal-pathspecs", *args], capture_output=True, check=False
    )


def tracked_changes(root: Path, paths: Sequence[str] | None = None) -> list[str]:
    """Tracked files (all, or of `paths`) whose working copy or index differs from the
    commit: `git status` without untracked files."""
    if paths is not None and not paths:
        return []
    args = ["status", "--porcelain", "-z", "--untracked-files=no"]
    proc = _git(root, *args, *(["--", *paths] if paths is not None else []))
    if proc.returncode != 0:
        raise LfbenchError(f"{root}: git status failed: {proc.stderr.decode(errors='replace')}")
    fields = proc.stdout.decode("utf-8", "surrogateescape").split("\0")
    changed: list[str] = []
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        changed.append(entry[3:])
        if entry[0] in "RC":  # a rename or copy: the next field is where it came from
            changed.append(fields[i])
            i += 1
    return changed


def _inside(path: str, outputs: Collection[str]) -> bool:
    """`path` is one of `outputs` or inside an output folder."""
    parts = path.split("/")
    return any("/".join(parts[:n]) in outputs for n in range(1, len(parts) + 1))


def _lock_outputs(root: Path) -> set[str]:
    """The outputs the committed and the current dvc.lock name (a stage pruned since: its
    .gitignore line was DVC's too)."""
    from pipeline.core.lineage import load_yaml_text

    texts = [_git(root, "show", "HEAD:dvc.lock").stdout.decode("utf-8", "replace")]
    with contextlib.suppress(OSError):
        texts.append((root / "dvc.lock").read_text(encoding="utf-8"))
    outs: set[str] = set()
    for text in texts:
        with contextlib.suppress(Exception):  # not YAML: nothing of it counts as DVC's
            for entry in ((load_yaml_text(text) or {}).get("stages") or {}).values():
                for out in entry.get("outs") or []:
                    if isinstance(out, Mapping) and out.get("path"):
                        outs.add(str(out["path"]))
    return outs


def _dvc_lines_only(root: Path, rel: str, outputs: Collection[str]) -> bool:
    """Whether the changes of the tracked .gitignore `rel` since the commit are only lines DVC
    writes for its outputs (`/NAME` for an output NAME of its folder, as scmrepo writes it),
    added for an output, or removed with one (`lfbench prune`): such a change is DVC's
    bookkeeping, not code. Any other line added or removed is a change of the user's."""
    from collections import Counter

    from pathspec.patterns.gitwildmatch import GitWildMatchPattern

    folder = posixpath.dirname(rel)
    before = _git(root, "show", f"HEAD:{rel}").stdout.decode("utf-8", "replace").splitlines()
    try:
        now = (root / rel).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:  # DVC deletes a .gitignore whose last line it removed
        now = []
    except (OSError, UnicodeDecodeError):
        return False
    a, b = Counter(x.strip() for x in now), Counter(x.strip() for x in before)
    lines = {x for x in (a - b) + (b - a) if x}
    if not lines:
        return True

    def ours(outs: Collection[str]) -> set[str]:
        return {
            GitWildMatchPattern.escape("/" + posixpath.basename(out))
            for out in outs
            if posixpath.dirname(out) == folder
        }

    return lines <= ours(outputs) or lines <= ours(set(outputs) | _lock_outputs(root))


def uncommitted(
    root: Path, outputs: Collection[str], paths: Sequence[str] | None = None
) -> list[str]:
    """The tracked files (all, or of `paths`) that differ from the commit, less what a repro
    itself changes: the files the driver sends its workers (`SHIPPED`), DVC's outputs (a
    metrics file kept in git) and DVC's own lines in .gitignore files. What is left is code or
    configuration a worker would not have."""
    if paths is not None:
        paths = [p for p in paths if p not in SHIPPED and not _inside(p, outputs)]
    left = []
    for rel in tracked_changes(root, paths):
        if rel in SHIPPED or _inside(rel, outputs):
            continue
        if posixpath.basename(rel) == ".gitignore" and _dvc_lines_only(root, rel, outputs):
            continue
        left.append(rel)
    return sorted(set(left))


def shown(files: Sequence[str], n: int = 10) -> str:
    more = f" (and {len(files) - n} more)" if len(files) > n else ""
    return ", ".join(files[:n]) + more


Sig = tuple[int, int, int, int] | None


def _sig(path: Path) -> Sig:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _Snapshot:
    """A clone's tracked files as they were when found equal to the commit `head`."""

    head: str
    sigs: dict[str, Sig]
    outputs: set[str] = field(default_factory=set)


_SNAPSHOTS: dict[str, _Snapshot] = {}


def clone_changes(clone: Path, head: str, outputs: Callable[[], Collection[str]]) -> list[str]:
    """The clone's tracked files that differ from the commit `head` (`uncommitted`), cheaply:
    `git status` over the whole tree once per commit (when the worker starts, and after the
    clone moves to another commit), then only the files whose size, times or inode changed
    since are looked at (a stat of each tracked file: a few milliseconds)."""
    key = str(clone)
    snap = _SNAPSHOTS.get(key)
    if snap is None or snap.head != head:
        listed = _git(clone, "ls-files", "-z").stdout.decode("utf-8", "surrogateescape")
        sigs = {p: _sig(clone / p) for p in listed.split("\0") if p}  # before git looks
        outs = set(outputs())
        dirty = uncommitted(clone, outs)
        if not dirty:
            _SNAPSHOTS[key] = _Snapshot(head, sigs, outs)
        return dirty
    changed = {p: now for p, was in snap.sigs.items() if (now := _sig(clone / p)) != was}
    if not changed:
        return []
    snap.outputs = set(outputs())
    dirty = uncommitted(clone, snap.outputs, sorted(changed))
    for p, now in changed.items():
        if p not in dirty:
            snap.sigs[p] = now
    return dirty


# ---------------------------------------------------------------- on the worker


@contextlib.contextmanager
def _locked(clone: Path, repo: Any) -> Iterator[Any]:
    """This clone's DVC repository, locked: one task at a time does DVC steps in it (a task
    keeps its own `Repo` between its two locked parts: the index is built once per task)."""
    from dvc.repo import lock_repo

    with _thread_lock(clone), lock_repo(repo), repo.scm_context(quiet=True):
        yield repo


def _thread_lock(clone: Path) -> threading.Lock:
    return _CLONE_LOCKS.setdefault(str(clone), threading.Lock())


def _head(clone: Path) -> str:
    """The clone's commit (`git rev-parse`; the task needs only this of `identity`, whose
    `git status` walks the whole tree: a second a stage on a busy worker)."""
    proc = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _stale(repo: Any, targets: list[str]) -> list[Any]:
    """Of these stages and .dvc files, those whose outputs in this clone are not the ones the
    lock says (missing or different): only they are pulled (a `dvc pull` of all of them asks
    the remote and walks every file again, seconds a stage)."""
    by_name = {s.addressing: s for s in repo.index.stages}
    stale = []
    for target in targets:
        owner = by_name.get(target)
        if owner is None:
            raise LfbenchError(f"{target}: not a stage of this clone's dvc.yaml")
        if any(not o.hash_info or o.workspace_status() for o in owner.outs):
            stale.append(owner)
    return stale


def pull_outputs(repo: Any, stages: list[Any]) -> list[str]:
    """These stages' outputs as their lock entries say, from the DVC remote: their objects by
    hash in one transfer, then each stage checked out (as DVC's run-cache restore does; `dvc
    pull <stages>` builds two indexes per call, seconds each on a busy machine). Returns the
    stages that could not be checked out (their objects are on no remote)."""
    objs: set[Any] = set()
    for stage in stages:
        for used in stage.get_used_objs().values():
            objs |= used
    try:
        got = repo.cloud.pull(objs)
        missing = len(got.failed)
    except Exception as e:  # noqa: BLE001 - a remote error: each stage's checkout says
        logger.error("pulling from the DVC remote: %s", e)
        missing = 0
    failed: list[str] = []
    for stage in stages:
        try:
            stage.checkout()
        except Exception as e:  # noqa: BLE001 - its objects are not in the cache
            logger.error("stage %s: checking out its outputs: %s", stage.addressing, e)
            failed.append(stage.addressing)
    if missing and not failed:
        logger.warning("%d objects not pulled, though every stage checked out", missing)
    return failed


def _owners(repo: Any, stage: Any) -> list[str]:
    """The DVC targets (stages, .dvc files) whose outputs `stage` depends on."""
    owners: list[str] = []
    for dep in stage.deps:
        for out in repo.index.outs:
            if out.stage is stage:
                continue
            # the dependency is that output, a folder holding it, or a file inside it
            if (
                out.fs_path == dep.fs_path
                or out.fs.isin(out.fs_path, dep.fs_path)
                or out.fs.isin(dep.fs_path, out.fs_path)
            ):
                target = out.stage.addressing
                if target not in owners:
                    owners.append(target)
    return owners


def run_in_clone(spec: TaskSpec, host: str, started: float) -> TaskResult:
    """The cluster task: one stage, in this worker's clone, as `dvc repro --pull` would run it,
    then pushed."""
    from dvc.repo import Repo
    from dvc.stage.serialize import to_single_stage_lockfile

    clone = Path(os.environ.get(ENV_CLONE, ""))
    if not clone.is_dir():
        return TaskResult(spec.stage, 2, host, "", 0.0, error="not an lfbench worker (no clone)")
    payload = spec.cluster
    log = log_path(clone, spec.stage)
    log.unlink(missing_ok=True)
    phases: dict[str, float] = {}
    mark = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - mark[0], 2)
        mark[0] = now

    head = _head(clone)
    if head != payload["commit"]:
        return TaskResult(
            spec.stage,
            2,
            host,
            str(log),
            0.0,
            error=f"{clone} is at {head}, the driver at {payload['commit']}",
        )
    memo_yaml()
    with _thread_lock(clone):
        repo = Repo(str(clone))
    one_remote_session(repo)
    with repo:  # one per task: its index is built once
        with _locked(clone, repo):
            lap("wait")
            # other stages of this clone may be running and reading these (params.yaml,
            # an aggregate's dvc.lock lineage): each file replaced whole, and only if it changed
            for name in SHIPPED:
                if name in payload["files"]:
                    write_if_changed(clone / name, payload["files"][name])
            for rel, data in payload["uncached"].items():
                write_if_changed(clone / rel, data)
            repo._reset()
            stage = next(s for s in repo.index.stages if s.addressing == spec.stage)
            lap("load")
            # the stage runs this clone's code: refused if its tracked files are not the commit
            dirty = clone_changes(clone, head, lambda: dvc_outputs(repo))
            lap("check")
            if dirty:
                return TaskResult(
                    spec.stage, 2, host, str(log), time.monotonic() - started,
                    error=modified(_worker_label(host), clone, head, dirty), phases=phases,
                )  # fmt: skip
            owners = _owners(repo, stage)
            if (clone / "data.dvc").exists():
                # stages read data/ but depend on data.sources.yaml (its pins, checked by the
                # stage): the clone's data/ is the one data.dvc records, from the remote if it
                # is not here
                owners.append("data.dvc")
            lap("load")
            failed = pull_outputs(repo, _stale(repo, owners))
            if failed:
                raise LfbenchError(
                    f"stage {spec.stage}: the outputs of {', '.join(failed)} it depends on are"
                    " neither in this clone nor on the DVC remote"
                )
            lap("pull")
            how = "ran"
            force = bool(payload.get("force"))  # `lfbench repro -f`: run it, as `dvc repro -f`
            if not force and not stage.changed():
                how = "unchanged"
            else:
                stage.remove_outs(ignore_remove=False, force=False)
                if not force and restore(repo, stage, lap):
                    how = "restored"
                else:
                    stage.save_deps()  # as DVC before it runs a stage's command
            lap("restore")
        rc, stopped = 0, False
        if how == "ran":
            env = {**os.environ, **spec.env, "DVC_ROOT": str(clone), "DVC_STAGE": spec.stage}
            rc, stopped = run_commands(spec, clone, log, env)
            lap("run")
            if rc != 0:
                return TaskResult(
                    spec.stage,
                    rc,
                    host,
                    str(log),
                    time.monotonic() - started,
                    stopped,
                    phases=phases,
                )
        with _locked(clone, repo):
            lap("wait")
            if how != "unchanged":
                no_cache_outs = any(
                    not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot)
                )
                stage.save(allow_missing=False, run_cache=not no_cache_outs)
                stage.commit(allow_missing=False)
            lap("save")
            # the stage's cached outputs, by their hashes (DVC's `push <stage>` would first need
            # the entry in this clone's dvc.lock and the whole index rebuilt)
            for objs in stage.get_used_objs(push=True).values():
                pushed = repo.cloud.push(objs)
                if pushed.failed:
                    raise LfbenchError(
                        f"stage {spec.stage}: {len(pushed.failed)} outputs not pushed to the remote"
                    )
            lap("push")
            try:
                push_run_cache(repo, stage)
            except Exception as e:  # noqa: BLE001 - the outputs are pushed: a warning, not a failure
                logger.warning("stage %s: pushing its run-cache entry: %s", spec.stage, e)
            entry = to_single_stage_lockfile(stage)
            files = {
                str(Path(out.fs_path).relative_to(clone)): Path(out.fs_path).read_bytes()
                for out in stage.outs
                if not out.use_cache and Path(out.fs_path).is_file()
            }
            lap("run_cache")
        return TaskResult(
            spec.stage,
            0,
            host,
            str(log),
            time.monotonic() - started,
            stopped,
            lock_entry=_plain(entry),
            files=files,
            how=how,
            phases=phases,
        )


def restore(repo: Any, stage: Any, lap: Callable[[str], None] = lambda _: None) -> bool:
    """The stage from the run cache, as `dvc repro` restores it (dvc/stage/run.py), with this
    clone's and the team remote's entries: True when restored.

    DVC's order matters: `restore` is asked with the stage's dependencies as dvc.lock records
    them. When they are unchanged (only the outputs are missing) DVC takes the lock entry's
    own outputs; otherwise it saves the dependencies and looks their hash up in the run cache.
    Saving them first would make DVC take the lock entry's outputs, made from other inputs,
    as the result of the new ones. The remote's entries are keyed by the dependencies as they
    are now, known only once DVC has saved them: when the local run cache has none, this
    stage's entries are pulled and the stage, loaded afresh (its dependencies as recorded),
    asked once more."""
    from dvc.stage.cache import RunCacheNotFoundError

    try:
        repo.stage_cache.restore(stage, pull=True)
        return True
    except RunCacheNotFoundError:
        pass
    lap("restore")
    try:
        pulled = pull_run_cache(repo, stage)  # keyed by the deps DVC saved just now
    except Exception as e:  # noqa: BLE001 - then the stage runs: say why
        logger.warning("stage %s: reading the remote's run cache: %s", stage.addressing, e)
        pulled = 0
    lap("run_cache")
    if not pulled:
        return False
    fresh = repo.stage.load_one(stage.dvcfile.path, stage.name)
    try:
        repo.stage_cache.restore(fresh, pull=True)
    except RunCacheNotFoundError:
        return False
    return True


def _plain(obj: Any) -> Any:
    """DVC's lock entry as plain dicts and lists (it crosses to the driver)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _run_cache_dirs(repo: Any, stage: Any) -> tuple[Any, str, Path] | None:
    """The remote's ODB, and the remote and local folders of `stage`'s run-cache entries (its
    dependencies hashed), or None when DVC cannot key the stage (no run cache for it)."""
    from dvc.stage.cache import _can_hash, _get_stage_hash

    if not _can_hash(stage):
        return None
    key = _get_stage_hash(stage)
    odb = repo.cloud.get_remote_odb(None, "run cache", hash_name="md5-dos2unix")
    remote = odb.fs.join(odb.path, "runs", key[:2], key)
    return odb, remote, Path(repo.stage_cache._get_cache_dir(key))


def pull_run_cache(repo: Any, stage: Any) -> int:
    """The remote's run-cache entries of this one stage (`dvc pull --run-cache` copies every
    entry of every stage, each time). Returns the number copied."""
    from dvc.fs import LocalFileSystem, generic

    where = _run_cache_dirs(repo, stage)
    if where is None:
        return 0
    odb, remote, local = where
    if not odb.fs.exists(remote):
        return 0
    n = 0
    for src in odb.fs.find(remote):
        dst = local / odb.fs.name(src)
        if not dst.exists():
            local.mkdir(parents=True, exist_ok=True)
            generic.copy(odb.fs, src, LocalFileSystem(), str(dst))
            n += 1
    return n


def push_run_cache(repo: Any, stage: Any) -> int:
    """This one stage's run-cache entries not on the remote yet."""
    from dvc.fs import LocalFileSystem, generic

    where = _run_cache_dirs(repo, stage)
    if where is None or not where[2].is_dir():
        return 0
    odb, remote, local = where
    have = {odb.fs.name(p) for p in odb.fs.find(remote)} if odb.fs.exists(remote) else set()
    n = 0
    for path in sorted(local.iterdir()):
        if path.name not in have:
            generic.copy(LocalFileSystem(), str(path), odb.fs, odb.fs.join(remote, path.name))
            n += 1
    return n


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
    head = _head(clone)
    dirty = clone_changes(clone, head, lambda: _outputs_of(clone))
    if dirty:
        raise LfbenchError(modified(name, clone, head, dirty))
    os.environ[ENV_CLONE] = str(clone)
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 1
    wait_for_scheduler(address, connect_timeout)

    async def main() -> None:
        async with Worker(
            address,
            nthreads=jobs,
            resources={"cores": ncpu},
            name=name,
            dashboard=False,
        ) as worker:
            logger.info(
                "worker %s joined the scheduler at %s: clone %s at %s, %d stage(s) at once",
                worker.name, address, clone, head[:12], jobs,
            )  # fmt: skip
            await worker.finished()

    asyncio.run(main())
