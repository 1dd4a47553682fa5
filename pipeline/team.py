"""A team's shared services on one host: PostgreSQL (MLflow's backend store and the shared
response cache), used by `lfbench team up` and by the tests.

Nothing here is written from scratch: PostgreSQL is Debian's (`postgresql`), started with its own
`initdb` and `pg_ctl` in a folder of the caller's. PostgreSQL refuses to run as root, so when
called as root the server runs as the `postgres` user the Debian package creates.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

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

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

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
            subprocess.run(
                self._as_owner(
                    [
                        str(bindir / "initdb"),
                        "-D",
                        str(self.datadir),
                        "-U",
                        self.user,
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--no-instructions",
                    ]
                ),
                check=True,
                capture_output=True,
            )
        sockets = self.datadir / "sockets"
        sockets.mkdir(exist_ok=True)
        self._chown(sockets)
        opts = f"-p {self.port} -k {sockets} -c listen_addresses=127.0.0.1 -c max_connections=200"
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
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def create_database(self, name: str) -> str:
        """Create database `name` (if missing); returns its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(
            self._as_owner(
                [str(pg_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"]
            ),
            capture_output=True,
        )
