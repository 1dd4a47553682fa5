"""How lfbench reaches an MLflow store: a quick, bounded failure with one clear line, and never
a credential in a log line, an error or a command line.

- Before the first call, a store behind a network address is checked: a tracking server
  (`http(s)://`) must answer an HTTP request to its `/health` within `ANSWER_TIMEOUT_S` (any
  answer will do: a proxy asking for credentials is still there), a database store
  (`postgresql://`, `mysql://`, ...) must accept a TCP connection within `CONNECT_TIMEOUT_S`.
  MLflow itself would retry a refused connection for about four minutes (7 retries with a
  doubling backoff) and wait up to 120 s for each answer.
- MLflow's own HTTP retries and timeout are bounded (`HTTP_DEFAULTS`: a server that goes away
  mid-sync fails the command within about a minute and a half); a variable the user set wins.
- A failure of the store (MLflow's, requests', SQLAlchemy's errors) becomes one `LfbenchError`
  line naming the store with its password masked; a password in the message is masked too.
- A new SQLite store starts as a copy of an empty one that MLflow's own `mlflow db upgrade`
  made once for this MLflow, Alembic and SQLAlchemy (`seed_sqlite_store`): MLflow's 60-odd
  schema migrations cost each new store about a CPU-second (every test project, every
  fresh clone's first results stage). The copy holds the schema only: MLflow makes the Default
  experiment when it opens the store, as it does in a store it migrated itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from pipeline.core.errors import LfbenchError
from pipeline.llm.cache import SECRET_QUERY, redact


def tracking_uri(root: Path) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    store = root / "mlruns"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


log = logging.getLogger(__name__)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` store URI; None for any other store."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def _schema_template() -> Path | None:
    """An empty SQLite store with MLflow's current schema and no experiment, made once per
    (MLflow, Alembic, SQLAlchemy) versions by `mlflow db upgrade` under the user's cache
    folder; None when it cannot be made (the store is then migrated as MLflow does it)."""
    versions = "-".join(
        metadata.version(d).replace("/", "_") for d in ("mlflow-skinny", "alembic", "sqlalchemy")
    )
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lfbench"
    path = cache / f"mlflow-schema-{versions}.db"
    if path.is_file():
        return path
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        part.unlink(missing_ok=True)
        subprocess.run(
            [sys.executable, "-m", "mlflow", "db", "upgrade", f"sqlite:///{part}"],
            check=True,
            capture_output=True,
            timeout=300,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
        )
        part.replace(path)
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("no MLflow schema template (%s): the store is migrated by MLflow", e)
        part.unlink(missing_ok=True)
        return None
    return path


def seed_sqlite_store(uri: str) -> bool:
    """A `sqlite:///` store whose file does not exist yet starts as a copy of the schema
    template (module docstring); True if it did. Safe against a process creating the same
    store at the same moment: the copy is linked into place only if no file is there."""
    db = sqlite_file(uri)
    if db is None or db.exists() or not db.parent.is_dir():
        return False
    template = _schema_template()
    if template is None:
        return False
    part = db.with_name(f"{db.name}.{os.getpid()}.seed")
    try:
        shutil.copyfile(template, part)
        os.link(part, db)  # fails if the store appeared meanwhile: then it is that one
    except FileExistsError:
        return False
    except OSError as e:
        log.debug("store %s not seeded from the schema template: %s", db, e)
        return False
    finally:
        part.unlink(missing_ok=True)
    return True


# MLflow's HTTP client (mlflow.environment_variables): at most 2 retries after 0 s and 2 s
# (plus up to 1 s of jitter each), at most 30 s per request.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 10.0
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}


def bounded_http() -> None:
    """MLflow's HTTP retries and timeout, bounded unless the environment sets them."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)


def masked(uri: str) -> str:
    """The store URI as logs and errors show it: its password, any query value whose name says
    secret (`password=`, `token=`, ...) and its fragment replaced by `***`."""
    return redact(uri)


def secrets_of(uri: str) -> list[str]:
    """The secret strings of a store URI, as written and decoded (to mask them in any text)."""
    parts = urlsplit(uri)
    found = []
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if SECRET_QUERY.search(k) and v:
            found += [v, quote(v, safe="")]
    if parts.fragment:
        found += [parts.fragment, unquote(parts.fragment)]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, uri: str) -> str:
    """`text` with the store URI's secrets masked wherever they appear."""
    out = text.replace(uri, masked(uri))
    for secret in secrets_of(uri):
        out = out.replace(secret, "***")
    return out


def address(uri: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a store behind a network address; None for a file, a SQLite
    database or a database reached through a local socket."""
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme in ("", "file", "sqlite") or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError as e:
        raise LfbenchError(f"MLflow store {masked(uri)}: {e}") from None
    default = DEFAULT_PORTS.get(scheme)
    if port is None and default is None:
        return None
    return scheme, parts.hostname, port or int(default or 0)


def _reason(e: BaseException) -> str:
    """The root cause of a network error in a few words (`[Errno 111] Connection refused`)."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] [^\"')(]+", text)
    if m:
        return m.group(0).strip().rstrip(",.")
    if "timed out" in text.lower() or isinstance(e, TimeoutError | socket.timeout):
        return "timed out"
    return text.splitlines()[0][:200] if text else type(e).__name__


def check_reachable(uri: str) -> None:
    """Fail fast, in one line, when the store's server is not there (module docstring)."""
    where = address(uri)
    if where is None:
        return
    scheme, host, port = where
    if scheme in ("http", "https"):
        import requests

        parts = urlsplit(uri)
        netloc = host if ":" not in host else f"[{host}]"
        base = urlunsplit((scheme, f"{netloc}:{port}", parts.path.rstrip("/"), "", ""))
        try:
            requests.get(
                f"{base}/health",
                timeout=(CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S),
                allow_redirects=False,
            ).close()
        except requests.RequestException as e:
            why = _reason(e)
            if isinstance(e, requests.ConnectTimeout):
                why = f"no connection within {CONNECT_TIMEOUT_S:g} s"
            elif isinstance(e, requests.ReadTimeout):
                why = f"connected, but no answer within {ANSWER_TIMEOUT_S:g} s"
            raise LfbenchError(
                f"MLflow tracking server {masked(uri)}: no answer from {host}:{port}"
                f" ({scrub(why, uri)}); check MLFLOW_TRACKING_URI and that the server is"
                " up (or unset MLFLOW_TRACKING_URI for the project's own store, mlruns/)"
            ) from None
        return
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise LfbenchError(
            f"MLflow store {masked(uri)}: cannot connect to {host}:{port} ({_reason(e)});"
            " check MLFLOW_TRACKING_URI and that the database server is up"
        ) from None


def preflight(root: Path) -> None:
    """Before a command's work whose end is an MLflow sync: the store answers, or one line says
    why not (so a stage or `lfbench track` does not fail after minutes of work)."""
    bounded_http()
    check_reachable(tracking_uri(root))


def _store_failure(e: BaseException) -> bool:
    """An error of the store or of the way to it (not of lfbench's own code)."""
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException | ConnectionError | TimeoutError):
        return True
    root = type(e).__module__.split(".")[0]
    return root in ("requests", "urllib3", "sqlalchemy", "psycopg2", "pymysql")


@contextlib.contextmanager
def store_errors(uri: str, doing: str) -> Iterator[None]:
    """Turn a failure of the store into one line naming it (masked) and what was being done."""
    try:
        yield
    except LfbenchError:
        raise
    except Exception as e:
        if not _store_failure(e):
            raise
        text = " ".join(str(e).split()) or type(e).__name__
        if "API request to" in text and ("Max retries" in text or "timeout" in text):
            text = _reason(e)
        if len(text) > 400:
            text = text[:400] + "..."
        raise LfbenchError(
            f"MLflow store {masked(uri)}: {doing} failed: {scrub(text, uri)}"
        ) from None
