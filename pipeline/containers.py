"""Running a stage in the pinned image: runtime choice, image build, container runs, records.

- `choose_runtime` decides where a stage runs (params `runtime: auto|docker|local`).
- `build_image` makes the image from the Dockerfile and a hash-locked wheelhouse downloaded on
  the host, and returns the record `lfbench image build` writes to build/image.json; in the local
  runtime `local_record` is written instead (deterministic: it changes only with the lock).
- `run_stage_in_container` runs a command in the image with the workspace mounted at the same
  path, the caller's uid:gid, host networking and an allow-listed environment (`container_env`),
  streams its output and returns its exit status; the container is always removed.
- `write_stage_record` (called by every `lfbench stage ...`) notes where the stage ran in
  .lfbench/stages/.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from pipeline.core.errors import LfbenchError
from pipeline.core.io import canonical_json, write_json
from pipeline.core.lineage import (
    ENV_GIT_COMMIT,
    ENV_GIT_DIRTY,
    ENV_IMAGE_DIGEST,
    ENV_RUNTIME,
)

log = logging.getLogger(__name__)

Runtime = Literal["docker", "local"]

IMAGE_JSON = Path("build/image.json")
WHEELHOUSE_DIR = Path("build/wheelhouse")
NODEPS_LOCK = "requirements-nodeps.lock"
DEFAULT_TAG = "lfbench:latest"
ENV_BASE_IMAGE = "LFBENCH_BASE_IMAGE"
ENV_DATA_MIRROR = "LFBENCH_DATA_MIRROR"
ENV_CACHE = "LFBENCH_CACHE_DIR"
# What the runner itself sets for a stage; only these LFBENCH_* variables go in.
RUNNER_VARS = (ENV_GIT_COMMIT, ENV_GIT_DIRTY, ENV_RUNTIME, ENV_IMAGE_DIGEST, ENV_DATA_MIRROR)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RECORD_VERSION = 1
PING_TIMEOUT_S = 5
# Every call after the ping (create, attach, wait, stop, remove): a busy engine on 2 cores can take
# well over the ping's 5 s to remove a container, and a call cut short by the client's timeout
# may leave the container behind.
CALL_TIMEOUT_S = 300
REMOVE_ATTEMPTS = 5


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def read_image_record(root: Path) -> dict[str, Any] | None:
    path = root / IMAGE_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def choose_runtime(
    requested: str, engine: bool, record: Mapping[str, Any] | None
) -> tuple[Runtime, str]:
    """Where a stage runs, and why. `docker` without an engine or an image is an error."""
    image = (record or {}).get("image_id")
    if requested == "local":
        return "local", "params say local"
    if requested == "docker":
        if not engine:
            raise LfbenchError(
                "runtime docker: no Docker engine answers (check DOCKER_HOST or start dockerd)"
            )
        if not image:
            raise LfbenchError(
                f"runtime docker: {IMAGE_JSON} names no image; build it with "
                "`lfbench image build` (or `dvc repro image`) while runtime is docker"
            )
        return "docker", f"params say docker; image {str(image)[:19]}"
    if requested != "auto":
        raise LfbenchError(f"unknown runtime {requested!r} (auto, docker or local)")
    if not engine:
        return "local", "auto: no Docker engine answers"
    if not image:
        return "local", f"auto: {IMAGE_JSON} names no image"
    return "docker", f"auto: engine answers and image {str(image)[:19]} is built"


def build_runtime(requested: str, engine: bool) -> Runtime:
    """Where `lfbench image build` builds: local when asked, or auto without an engine."""
    if requested == "local" or (requested == "auto" and not engine):
        return "local"
    if requested == "docker" and not engine:
        raise LfbenchError(
            "runtime docker: no Docker engine answers (check DOCKER_HOST or start dockerd)"
        )
    return "docker"


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
    from the caller's `environ` only LFBENCH_DATA_MIRROR, the API-key variables params name and
    `env_passthrough` are copied, when set. Nothing else crosses (no PATH, HOME, tokens...).
    """
    env = {k: v for k, v in runner_env.items() if k in RUNNER_VARS}
    for name in [ENV_DATA_MIRROR, *allowed_names(raw_params)]:
        if name in environ and name not in env:
            env[name] = environ[name]
    env["HOME"] = "/tmp"
    return env


# ---------------------------------------------------------------- container id and stage records


_CONTAINER_PATTERNS = (
    re.compile(r"/docker/containers/([0-9a-f]{64})/"),  # mountinfo: /etc/hostname etc.
    re.compile(r"/docker[/-]([0-9a-f]{64})(?:\.scope)?(?:\s|$|/)"),  # cgroup v1/v2 paths
)


def container_id_from(text: str) -> str | None:
    """The 64-hex Docker container id in a /proc/self/mountinfo (or /proc/self/cgroup) text."""
    for pattern in _CONTAINER_PATTERNS:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def own_container_id() -> str | None:
    for path in ("/proc/self/mountinfo", "/proc/self/cgroup"):
        try:
            found = container_id_from(Path(path).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if found:
            return found
    return None


def stage_record(stage: str, argv: Sequence[str]) -> dict[str, Any]:
    runtime = os.environ.get(ENV_RUNTIME, "local")
    return {
        "stage": stage,
        "args": list(argv),
        "runtime": runtime,
        "image_digest": os.environ.get(ENV_IMAGE_DIGEST),
        "container_id": own_container_id(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "git_commit": os.environ.get(ENV_GIT_COMMIT),
    }


def stage_record_path(root: Path, stage: str, argv: Sequence[str]) -> Path:
    digest = hashlib.sha256(canonical_json([stage, *argv]).encode()).hexdigest()[:8]
    return root / ".lfbench" / "stages" / f"{stage}-{digest}.json"


def write_stage_record(root: Path, stage: str, argv: Sequence[str]) -> Path:
    """Note where this stage process runs (not a DVC output: .lfbench/ is git-ignored)."""
    path = stage_record_path(root, stage, argv)
    write_json(path, stage_record(stage, argv))
    return path


# ---------------------------------------------------------------- wheelhouse and image build


def _lock_entries(lock: Path) -> list[tuple[str, str]]:
    """(canonical name, version) of every lock entry whose marker holds on this platform."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    entries = []
    for line in lock.read_text(encoding="utf-8").splitlines():
        if not line or line[0] in " #-\t":
            continue
        req = Requirement(line.rstrip(" \\"))
        if req.marker is not None and not req.marker.evaluate():
            continue
        [spec] = list(req.specifier)
        entries.append((str(canonicalize_name(req.name)), spec.version))
    return entries


def _dist_of(filename: str) -> tuple[str, str] | None:
    from packaging.utils import InvalidSdistFilename, parse_sdist_filename, parse_wheel_filename

    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidSdistFilename, ValueError):
        return None
    return str(name), str(version)


def check_wheelhouse(lock: Path, folder: Path) -> None:
    """Every lock entry for this platform has exactly one file in the wheelhouse."""
    have: dict[tuple[str, str], list[str]] = {}
    for f in folder.iterdir():
        dist = _dist_of(f.name)
        if dist:
            have.setdefault(dist, []).append(f.name)
    missing = [f"{n}=={v}" for n, v in _lock_entries(lock) if (n, v) not in have]
    if missing:
        raise LfbenchError(f"wheelhouse {folder} lacks {', '.join(missing)}")


def cache_root() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lfbench"


def locks_sha256(locks: list[Path]) -> str:
    """One digest for the lock files an image installs (requirements.lock, then the no-deps one)."""
    return hashlib.sha256("".join(sha256_file(p) for p in locks).encode()).hexdigest()


def lock_files(root: Path) -> list[Path]:
    """requirements.lock, and requirements-nodeps.lock (installed with --no-deps) if present."""
    locks = [root / "requirements.lock"]
    if (root / NODEPS_LOCK).exists():
        locks.append(root / NODEPS_LOCK)
    return locks


def wheelhouse(locks: Path | list[Path], emit: Callable[[str], None] = log.info) -> Path:
    """The locks' files (wheels, or an sdist where no wheel exists), downloaded once per lock
    hash with the host's pip, hash-checked, into ~/.cache/lfbench/wheelhouse/<sha12>."""
    locks = [locks] if isinstance(locks, Path) else locks
    digest = sha256_file(locks[0]) if len(locks) == 1 else locks_sha256(locks)
    key = digest[:12]
    final = cache_root() / "wheelhouse" / key
    if (final / ".complete").exists():
        return final
    partial = final.with_name(f"{key}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for lock in locks:
        emit(f"image: downloading the wheelhouse for {lock} into {final}")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        cmd += ["--require-hashes", "--no-deps", "-r", str(lock), "-d", str(partial)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise LfbenchError(f"pip download of {lock} failed:\n{tail}")
        check_wheelhouse(lock, partial)
    (partial / ".complete").write_text(f"{digest}\n", encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def stage_wheelhouse(source: Path, dest: Path) -> None:
    """Make `dest` hold exactly the wheelhouse's files (hard links where possible)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in sorted(source.iterdir()):
        if f.name.startswith("."):
            continue
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)


def default_base_image(dockerfile: Path) -> str:
    """The digest-pinned base the Dockerfile names (`ARG BASE_IMAGE=...`)."""
    m = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile.read_text(encoding="utf-8"), re.MULTILINE)
    if not m:
        raise LfbenchError(f"{dockerfile}: no `ARG BASE_IMAGE=...` line")
    return m.group(1)


def local_record(lock: Path) -> dict[str, Any]:
    """The record of the local runtime: no image; changes only when a lock changes."""
    record: dict[str, Any] = {
        "version": RECORD_VERSION,
        "runtime": "local",
        "image_id": None,
        "lock_sha256": sha256_file(lock),
    }
    if (lock.parent / NODEPS_LOCK).exists():
        record["nodeps_lock_sha256"] = sha256_file(lock.parent / NODEPS_LOCK)
    return record


class BaseUnavailable(LfbenchError):
    """The base image is neither present nor pullable."""


def ensure_base(client: Any, base: str) -> Any:
    import docker.errors

    try:
        return client.images.get(base)
    except docker.errors.ImageNotFound:
        pass
    try:
        log.info("image: pulling base %s", base)
        return client.images.pull(base)
    except docker.errors.APIError as e:
        raise BaseUnavailable(
            f"base image {base} is not present and cannot be pulled "
            f"({e.explanation or e}); build an air-gapped one with "
            f"scripts/build-base-image.sh and set {ENV_BASE_IMAGE}=lfbench-base:bookworm"
        ) from e


def build_image(
    root: Path,
    *,
    client: Any,
    base: str | None = None,
    tag: str = DEFAULT_TAG,
    nocache: bool = False,
    emit: Callable[[str], None] = log.info,
) -> dict[str, Any]:
    """Build the image from `root` (its Dockerfile) and return its record for image.json."""
    import docker.errors

    dockerfile = root / "Dockerfile"
    lock = root / "requirements.lock"
    base = base or os.environ.get(ENV_BASE_IMAGE) or default_base_image(dockerfile)
    base_image = ensure_base(client, base)
    stage_wheelhouse(wheelhouse(lock_files(root), emit), root / WHEELHOUSE_DIR)
    emit(f"image: building {tag} on {base}")
    image_id = None
    tail: deque[str] = deque(maxlen=20)
    try:
        for chunk in client.api.build(
            path=str(root),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs={"BASE_IMAGE": base},
            rm=True,
            forcerm=True,
            nocache=nocache,
            pull=False,
            decode=True,
        ):
            if "error" in chunk:
                last = "\n".join(f"  | {t}" for t in tail)
                raise LfbenchError(f"docker build failed: {chunk['error'].strip()}\n{last}")
            line = str(chunk.get("stream", "")).rstrip()
            if line:
                log.debug("%s", line)
                tail.extend(t for t in line.splitlines() if t.strip())
            aux = chunk.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = str(aux["ID"])
    except docker.errors.APIError as e:
        raise LfbenchError(f"docker build failed: {e.explanation or e}") from e
    image_id = client.images.get(tag).id if image_id is None else image_id
    return {
        "version": RECORD_VERSION,
        "runtime": "docker",
        "image_id": image_id,
        "tag": tag,
        "base_image": base,
        "base_image_id": base_image.id,
        "lock_sha256": sha256_file(lock),
        "locks_sha256": locks_sha256(lock_files(root)),
        "dockerfile_sha256": sha256_file(dockerfile),
    }


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
                log.warning("stopping container %s", container.short_id)
                try:
                    container.stop(timeout=10)
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
    return ["lfbench", "stage", stage, *args, "--params", str(params_path)]
