"""Where a stage runs: the runtime choice, and a stage run in the pinned image.

- `decide` says where the stages of one `dvc repro` run (params `runtime: auto|docker|local`):
  auto takes the recipe's image when an engine answers and the image is present, pulled
  (`image_store`: a registry, then the DVC remote) or built (`image`); otherwise local, with one
  warning. The decision is remembered for the rest of that `dvc repro` (`.lfbench/runtime/`).
- `run_stage_in_container` runs a command in the image with the workspace mounted at the same
  path, the caller's uid:gid, host networking and an allow-listed environment (`container_env`),
  streams its output and returns its exit status; the container is always removed.
- `write_stage_record` (called by every `lfbench stage ...`) notes where the stage ran in
  .lfbench/stages/.

The image itself (its recipe and build) is `pipeline/env/image.py`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from pipeline.core import procs
from pipeline.core.errors import INTERRUPT_GRACE_ENV, LfbenchError, interrupt_grace_s
from pipeline.core.io import write_json
from pipeline.core.lineage import (
    ENV_GIT_COMMIT,
    ENV_GIT_DIRTY,
    ENV_IMAGE_DIGEST,
    ENV_IMAGE_RECIPE,
    ENV_RUNTIME,
)

log = logging.getLogger(__name__)

Runtime = Literal["docker", "local"]

ENV_DATA_MIRROR = "LFBENCH_DATA_MIRROR"
ENV_VERBOSE = "LFBENCH_VERBOSE"  # 1: debug logging in the stage, as `lfbench --verbose`
# What the runner itself sets for a stage; only these LFBENCH_* variables go in.
RUNNER_VARS = (
    ENV_GIT_COMMIT,
    ENV_GIT_DIRTY,
    ENV_RUNTIME,
    ENV_IMAGE_DIGEST,
    ENV_IMAGE_RECIPE,
    ENV_DATA_MIRROR,
    "PYTHONPATH",
    "PYTHONPYCACHEPREFIX",
    "PYTHONDONTWRITEBYTECODE",
)
# What `lfbench repro --jobs` tells a stage (no secrets): where to write its progress, the cores
# it may use, its run's key, that the workspace's response cache has other users right now, and
# its Dask scheduler's address (host networking: a 127.0.0.1 scheduler is reachable).
REPRO_VARS = (
    "LFBENCH_PROGRESS_FILE",
    "LFBENCH_WORKERS",
    "LFBENCH_EMBED_WORKERS",
    "LFBENCH_REPRO_KEY",
    "LFBENCH_CACHE_CLAIMS",
    "LFBENCH_SCHEDULER",  # the Dask scheduler holding each endpoint's shared slots
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PING_TIMEOUT_S = 5
# Every call after the ping (create, attach, wait, stop, remove): a busy engine on 2 cores can take
# well over the ping's 5 s to remove a container, and a call cut short by the client's timeout
# may leave the container behind.
CALL_TIMEOUT_S = 300
REMOVE_ATTEMPTS = 5
PYCACHE_DIR = Path(".lfbench/pycache")


# ---------------------------------------------------------------- engine and runtime choice


def docker_client(timeout: int = PING_TIMEOUT_S) -> Any | None:
    """A client for the engine of DOCKER_HOST (or the default socket), or None if none answers."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        client.ping()
        client.api.timeout = max(timeout, CALL_TIMEOUT_S)
        return client
    except Exception as e:  # noqa: BLE001 - any failure means "no engine here"
        log.debug("no Docker engine answers: %s", e)
        return None


Decision = dict[str, Any]  # runtime, why, image_id (docker), recipe, how (present/pulled/built)


def decide(
    requested: str,
    recipe: Mapping[str, Any],
    *,
    client: Any | None,
    obtain: Callable[[], tuple[str, str]],
) -> Decision:
    """Where stages run. `obtain` returns (image id, how it was had) or raises.

    local: always local. docker: the engine and the image are required (a clear error
    otherwise). auto: docker when the engine answers and the image can be had; else local.
    """
    base = {"recipe": recipe["recipe"]}
    if requested == "local":
        return {**base, "runtime": "local", "why": "params say local"}
    if requested not in ("auto", "docker"):
        raise LfbenchError(f"unknown runtime {requested!r} (auto, docker or local)")
    if client is None:
        if requested == "docker":
            raise LfbenchError(
                "runtime docker: no Docker engine answers (check DOCKER_HOST or start dockerd)"
            )
        return {**base, "runtime": "local", "why": "auto: no Docker engine answers", "warn": True}
    try:
        image_id, how = obtain()
    except Exception as e:  # the engine's, a store's or a build's failure
        if not isinstance(e, LfbenchError):
            e = LfbenchError(f"{type(e).__name__}: {e}")
        if requested == "docker":
            raise LfbenchError(f"runtime docker: no image for recipe {recipe['tag']}: {e}") from e
        return {
            **base,
            "runtime": "local",
            "why": f"auto: no image for recipe {recipe['tag']}",
            "reason": str(e),
            "warn": True,
        }
    return {
        **base,
        "runtime": "docker",
        "image_id": image_id,
        "how": how,
        "why": f"{requested}: image {image_id[:19]} ({how})",
    }


def repro_key() -> str:
    """The `dvc` process this stage runs under (pid and start time), or this process if none:
    one runtime decision, and one warning, per `dvc repro` (or `dvc exp run`). `lfbench repro`
    names its run in `$LFBENCH_REPRO_KEY` (its stages are not children of a `dvc` process)."""
    named = os.environ.get("LFBENCH_REPRO_KEY", "").strip()
    if named and named.replace("-", "").isalnum():
        return named
    pid: int | None = procs.parent_pid()  # the caller's, in a stage of the warm server
    while pid is not None:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            break
        if any(Path(a.decode(errors="replace")).name == "dvc" for a in argv[:3]):
            return f"{pid}-{procs.start_time(pid)}"
        pid = procs.parent_of(pid)
    return f"{os.getpid()}-{procs.start_time(os.getpid())}"


def memo_path(root: Path, recipe: Mapping[str, Any], requested: str) -> Path:
    return root / ".lfbench" / "runtime" / f"{repro_key()}-{requested}-{recipe['recipe'][:12]}.json"


def remembered(root: Path, recipe: Mapping[str, Any], requested: str) -> Decision | None:
    """This `dvc repro`'s decision, if an earlier stage of it made one."""
    try:
        data = json.loads(memo_path(root, recipe, requested).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def deciding(root: Path) -> Iterator[None]:
    """An exclusive lock while a stage decides where this run's stages go (and may build the
    image): the stages of one `lfbench repro --jobs` start at once."""
    folder = root / ".lfbench" / "runtime"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def forget(root: Path, key: str) -> None:
    """Drop a finished `lfbench repro`'s decisions."""
    for old in (root / ".lfbench" / "runtime").glob(f"{key}-*.json"):
        old.unlink(missing_ok=True)


def remember(root: Path, recipe: Mapping[str, Any], requested: str, decision: Decision) -> None:
    folder = root / ".lfbench" / "runtime"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):  # decisions of finished dvc runs
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            old.unlink(missing_ok=True)
    write_json(memo_path(root, recipe, requested), dict(decision))


# ---------------------------------------------------------------- environment allow-list


def _api_key_envs(node: Any) -> Iterator[str]:
    """Every string value of a key named `api_key_env`, anywhere in the raw params."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "api_key_env" and isinstance(value, str) and value:
                yield value
            else:
                yield from _api_key_envs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _api_key_envs(value)


def allowed_names(raw_params: Mapping[str, Any]) -> list[str]:
    """Names of the variables a container may see beyond what the runner sets: the API keys
    params name (`api_key_env`) and the `env_passthrough` list."""
    names = list(_api_key_envs(raw_params))
    passthrough = raw_params.get("env_passthrough") or []
    if isinstance(passthrough, list):
        names.extend(str(n) for n in passthrough)
    out: list[str] = []
    for name in names:
        if not ENV_NAME_RE.match(name):
            raise LfbenchError(f"params: {name!r} is not a valid environment variable name")
        if name not in out:
            out.append(name)
    return out


def container_env(
    raw_params: Mapping[str, Any], environ: Mapping[str, str], runner_env: Mapping[str, str]
) -> dict[str, str]:
    """The whole environment of a stage's container (on top of the image's own ENV).

    `runner_env` holds what the runner sets (git commit and dirtiness, runtime, image digest);
    from the caller's `environ` only LFBENCH_DATA_MIRROR, LFBENCH_VERBOSE,
    LFBENCH_INTERRUPT_GRACE_S, what `lfbench repro` tells a stage (`REPRO_VARS`), the API-key
    variables params name and `env_passthrough` are copied, when set. Nothing else crosses (no
    PATH, HOME, tokens...).
    """
    env = {k: v for k, v in runner_env.items() if k in RUNNER_VARS}
    passed = [ENV_DATA_MIRROR, ENV_VERBOSE, INTERRUPT_GRACE_ENV, *REPRO_VARS]
    for name in [*passed, *allowed_names(raw_params)]:
        if name in environ and name not in env:
            env[name] = environ[name]
    env["HOME"] = "/tmp"
    return env


# ---------------------------------------------------------------- container id and stage records


# ---------------------------------------------------------------- wheelhouse and image build


# ---------------------------------------------------------------- running in a container


class Terminated(Exception):
    """SIGTERM arrived while a container ran (the container was stopped and removed)."""


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into an exception while a container runs, so it is stopped and removed."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write(stream: Any, data: bytes) -> None:
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        buffer.write(data)
    else:
        stream.write(data.decode("utf-8", errors="replace"))
    stream.flush()


def run_stage_in_container(
    image: str,
    argv: Sequence[str],
    workdir: Path,
    env: Mapping[str, str],
    *,
    client: Any,
    mounts: Sequence[Path] = (),
    stdout: Any = None,
    stderr: Any = None,
) -> int:
    """Run `argv` in `image` and return its exit status.

    The workspace `workdir` is mounted read-write at the same absolute path and is the working
    directory (plus read-only `mounts`, e.g. the data mirror); the process runs as the caller's
    uid:gid with host networking and exactly `env`. Its stdout and stderr are streamed to ours.
    The container is removed afterwards, and stopped first on Ctrl-C or SIGTERM.
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    workdir = workdir.resolve()
    volumes = {str(workdir): {"bind": str(workdir), "mode": "rw"}}
    for m in mounts:
        m = m.resolve()
        if m.exists() and str(m) not in volumes and not m.is_relative_to(workdir):
            volumes[str(m)] = {"bind": str(m), "mode": "ro"}
    container = client.containers.create(
        image,
        command=list(argv),
        user=f"{os.getuid()}:{os.getgid()}",
        working_dir=str(workdir),
        environment=dict(env),
        network_mode="host",
        volumes=volumes,
        detach=True,
    )
    try:
        with _sigterm_raises():
            try:
                # Attach first (the request is made now), then start: no output is missed.
                stream = client.api.attach(
                    container.id, stdout=True, stderr=True, stream=True, logs=True, demux=True
                )
                container.start()
                for chunk_out, chunk_err in stream:
                    if chunk_out:
                        _write(out, chunk_out)
                    if chunk_err:
                        _write(err, chunk_err)
                result = container.wait()
                return int(result.get("StatusCode", 1))
            except (KeyboardInterrupt, Terminated):
                # SIGTERM lets the stage's requests in flight finish into its journal for the
                # grace time (a second Ctrl-C here kills the container at once)
                grace = interrupt_grace_s(env)
                log.warning(
                    "stopping container %s (up to %g s for the requests in flight; Ctrl-C"
                    " again kills it)",
                    container.short_id,
                    grace,
                )
                since = int(time.time())
                try:
                    container.stop(timeout=int(grace) + 10)
                    with contextlib.suppress(Exception):  # what the stage said as it stopped
                        _write(err, container.logs(stdout=False, stderr=True, since=since))
                finally:
                    remove_container(client, container.id)
                raise
    finally:
        remove_container(client, container.id)


def remove_container(client: Any, container_id: str) -> bool:
    """Remove a container for sure: retried (an engine under load may fail or time out), and
    checked gone. Says so, naming it, if it could not be removed."""
    import docker.errors

    error: Exception | None = None
    for attempt in range(REMOVE_ATTEMPTS):
        try:
            client.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            return True
        except Exception as e:  # noqa: BLE001 - a conflict (removal in progress), a timeout, ...
            error = e
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return True
        except Exception as e:  # noqa: BLE001 - the engine went away
            error = e
        time.sleep(0.5 * (attempt + 1))
    log.warning(
        "container %s could not be removed (%s): `docker rm -f %s`",
        container_id[:12],
        error,
        container_id[:12],
    )
    return False


def stage_argv(stage: str, args: Sequence[str], params_path: Path) -> list[str]:
    """The command in the container: the workspace's own code (on PYTHONPATH) in the image's
    environment."""
    return ["python", "-m", "pipeline.cli", "stage", stage, *args, "--params", str(params_path)]
