"""Running a stage in the pinned image: the recipe, runtime choice, image build, container runs.

- The image is the environment only: the pinned base and the hash-locked dependencies. The
  project's code runs from the mounted workspace, so a code change re-runs only the stages whose
  code changed, exactly as locally.
- `recipe` is what build/image.json records (the `image` stage): the base reference and the hashes
  of the Dockerfile, .dockerignore and locks, and their digest. It is input-addressed: the same on
  every machine, whether stages then run in docker or locally, so dvc.lock is too. The image of a
  recipe is tagged `lfbench:<recipe12>` and labelled with the full digest.
- `decide` says where the stages of one `dvc repro` run (params `runtime: auto|docker|local`):
  auto takes the recipe's image when an engine answers and the image is present, pulled
  (`image_store`: a registry, then the DVC remote) or built; otherwise local, with one warning.
  The decision is remembered for the rest of that `dvc repro` (`.lfbench/runtime/`).
- `build_image` makes the image from the Dockerfile and a hash-locked wheelhouse downloaded on
  the host.
- `run_stage_in_container` runs a command in the image with the workspace mounted at the same
  path, the caller's uid:gid, host networking and an allow-listed environment (`container_env`),
  streams its output and returns its exit status; the container is always removed.
- `write_stage_record` (called by every `lfbench stage ...`) notes where the stage ran in
  .lfbench/stages/.
"""

from __future__ import annotations

import contextlib
import fcntl
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

from pipeline.core.errors import INTERRUPT_GRACE_ENV, LfbenchError, interrupt_grace_s
from pipeline.core.io import canonical_json, file_digest, write_json
from pipeline.core.lineage import (
    ENV_GIT_COMMIT,
    ENV_GIT_DIRTY,
    ENV_IMAGE_DIGEST,
    ENV_IMAGE_RECIPE,
    ENV_RUNTIME,
)

log = logging.getLogger(__name__)

Runtime = Literal["docker", "local"]

IMAGE_JSON = Path("build/image.json")
WHEELHOUSE_DIR = Path("build/wheelhouse")
NODEPS_LOCK = "requirements-nodeps.lock"
# The image installs what the stages import (requirements-image.in, pinned by requirements.lock),
# not the host's whole environment (dvc, docker, the MLflow server...).
IMAGE_LOCK = "requirements-image.lock"
IMAGE_REPO = "lfbench"
RECIPE_LABEL = "org.lfbench.recipe"
ENV_DATA_MIRROR = "LFBENCH_DATA_MIRROR"
ENV_CACHE = "LFBENCH_CACHE_DIR"
ENV_IMAGE_PULL = "LFBENCH_IMAGE_PULL"  # 0: never pull an image (build it instead)
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
# it may use, its run's key, and that the workspace's response cache has other users right now.
REPRO_VARS = (
    "LFBENCH_PROGRESS_FILE",
    "LFBENCH_WORKERS",
    "LFBENCH_EMBED_WORKERS",
    "LFBENCH_REPRO_KEY",
    "LFBENCH_CACHE_CLAIMS",
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RECORD_VERSION = 2
# Inputs of the recipe: what the image is made of (the wheelhouse follows from the locks).
RECIPE_FILES = ("Dockerfile", ".dockerignore", IMAGE_LOCK, NODEPS_LOCK)
PING_TIMEOUT_S = 5
# Every call after the ping (create, attach, wait, stop, remove): a busy engine on 2 cores can take
# well over the ping's 5 s to remove a container, and a call cut short by the client's timeout
# may leave the container behind.
CALL_TIMEOUT_S = 300
REMOVE_ATTEMPTS = 5
# The bit-reproducible builder (Debian's buildah): every file and the config's `created` carry
# this time, so the image id is a function of the recipe and the base's id.
ENV_BUILDER = "LFBENCH_IMAGE_BUILDER"  # buildah (default when installed) or docker (classic)
SOURCE_DATE_EPOCH = 0
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
PYCACHE_DIR = Path(".lfbench/pycache")


def sha256_file(path: Path) -> str:
    return file_digest(path, "sha256")


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


def read_recipe(root: Path) -> dict[str, Any]:
    """build/image.json (the `image` stage's output), checked."""
    path = root / IMAGE_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise LfbenchError(f"{IMAGE_JSON} is missing: run `dvc repro image`") from e
    except (OSError, json.JSONDecodeError) as e:
        raise LfbenchError(f"{IMAGE_JSON}: not a readable JSON file ({e})") from e
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or "recipe" not in data:
        raise LfbenchError(
            f"{IMAGE_JSON}: not an image recipe of version {RECORD_VERSION} "
            "(made by an older lfbench?): run `dvc repro image`"
        )
    return data


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


def _proc_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot): with the pid, a unique process key."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    return ppid if ppid > 1 else None


def repro_key() -> str:
    """The `dvc` process this stage runs under (pid and start time), or this process if none:
    one runtime decision, and one warning, per `dvc repro` (or `dvc exp run`). `lfbench repro`
    names its run in `$LFBENCH_REPRO_KEY` (its stages are not children of a `dvc` process)."""
    named = os.environ.get("LFBENCH_REPRO_KEY", "").strip()
    if named and named.replace("-", "").isalnum():
        return named
    pid: int | None = os.getppid()
    while pid is not None:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            break
        if any(Path(a.decode(errors="replace")).name == "dvc" for a in argv[:3]):
            return f"{pid}-{_proc_start(pid)}"
        pid = _parent(pid)
    return f"{os.getpid()}-{_proc_start(os.getpid())}"


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
        "image_recipe": os.environ.get(ENV_IMAGE_RECIPE),
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
    """One digest for the lock files an image installs (the image lock, then the no-deps one)."""
    return hashlib.sha256("".join(sha256_file(p) for p in locks).encode()).hexdigest()


def lock_files(root: Path) -> list[Path]:
    """requirements-image.lock, and requirements-nodeps.lock (installed with --no-deps) if
    present."""
    locks = [root / IMAGE_LOCK]
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


def recipe(root: Path, base: str | None = None) -> dict[str, Any]:
    """What build/image.json records: the image's inputs and their digest (no engine needed).

    `base` is params' `image_base` (None: the Dockerfile's digest-pinned `ARG BASE_IMAGE`).
    """
    files = {}
    for name in RECIPE_FILES:
        path = root / name
        if path.exists():
            files[name] = sha256_file(path)
        elif name != NODEPS_LOCK:
            raise LfbenchError(f"image recipe: {name} is missing")
    inputs = {"base_image": base or default_base_image(root / "Dockerfile"), "files": files}
    digest = hashlib.sha256(canonical_json(inputs).encode()).hexdigest()
    return {
        "version": RECORD_VERSION,
        **inputs,
        "recipe": digest,
        "tag": f"{IMAGE_REPO}:{digest[:12]}",
    }


class BaseUnavailable(LfbenchError):
    """The base image is neither present nor pullable."""


def ensure_base(client: Any, base: str) -> Any:
    import docker.errors

    try:
        return client.images.get(base)
    except docker.errors.ImageNotFound:
        pass
    if os.environ.get(ENV_IMAGE_PULL) == "0":
        raise BaseUnavailable(f"base image {base} is not present ({ENV_IMAGE_PULL}=0: no pull)")
    try:
        log.info("image: pulling base %s", base)
        return client.images.pull(base)
    except docker.errors.APIError as e:
        raise BaseUnavailable(
            f"base image {base} is not present and cannot be pulled "
            f"({e.explanation or e}); without a registry, build an air-gapped one with "
            "scripts/build-base-image.sh and set `image_base: lfbench-base:bookworm` in params.yaml"
        ) from e


def find_image(client: Any, rec: Mapping[str, Any]) -> str | None:
    """The id of the recipe's image on this engine, if present (tag and label agree)."""
    import docker.errors

    try:
        image = client.images.get(rec["tag"])
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(RECIPE_LABEL) != rec["recipe"]:
        log.warning("image: %s is not labelled with recipe %s; ignored", rec["tag"], rec["recipe"])
        return None
    return str(image.id)


def image_builder() -> str:
    """buildah (bit-reproducible) when installed and the engine is the default socket's, else
    Docker's classic builder; the LFBENCH_IMAGE_BUILDER variable (buildah or docker) chooses."""
    wanted = os.environ.get(ENV_BUILDER, "")
    if wanted not in ("", "buildah", "docker"):
        raise LfbenchError(f"{ENV_BUILDER}={wanted!r}: expected buildah or docker")
    if wanted == "buildah" and shutil.which("buildah") is None:
        raise LfbenchError(
            f"{ENV_BUILDER}=buildah but buildah is not installed (apt-get install buildah)"
        )
    # buildah reaches the engine at the default socket only (containers/image ignores DOCKER_HOST
    # on purpose), for the base and for the result.
    host = os.environ.get("DOCKER_HOST", DEFAULT_DOCKER_HOST)
    if wanted == "buildah" and host != DEFAULT_DOCKER_HOST:
        raise LfbenchError(
            f"{ENV_BUILDER}=buildah reaches only the engine at {DEFAULT_DOCKER_HOST}, "
            f"not DOCKER_HOST={host}"
        )
    if wanted:
        return wanted
    return "buildah" if shutil.which("buildah") and host == DEFAULT_DOCKER_HOST else "docker"


def _check_fresh(root: Path, rec: Mapping[str, Any]) -> None:
    if recipe(root, rec["base_image"])["recipe"] != rec["recipe"]:
        raise LfbenchError(
            f"{IMAGE_JSON} is stale: the Dockerfile, .dockerignore or a lock changed since it was "
            "written; run `dvc repro image`"
        )


def build_image(
    root: Path,
    rec: Mapping[str, Any],
    *,
    client: Any,
    nocache: bool = False,
    emit: Callable[[str], None] = log.info,
    tag: str | None = None,
) -> str:
    """Build the recipe's image from `root` (its Dockerfile), tag it (`tag`, by default the
    recipe's) and return its id. With buildah every build is cold (no layer cache) and gives the
    same id for the same recipe and base."""
    _check_fresh(root, rec)
    base = str(rec["base_image"])
    base_image = ensure_base(client, base)
    stage_wheelhouse(wheelhouse(lock_files(root), emit), root / WHEELHOUSE_DIR)
    tag = tag or str(rec["tag"])
    builder = image_builder()
    emit(f"image: building {tag} on {base} with {builder}")
    if builder == "buildah":
        _build_buildah(root, rec, str(base_image.id), tag)
    else:
        _build_classic(root, rec, client=client, nocache=nocache, tag=tag)
    found = find_image(client, {**rec, "tag": tag})
    if found is None:
        raise LfbenchError(f"the build of {tag} left no image labelled with recipe {rec['recipe']}")
    if builder == "buildah":
        from pipeline.env.image_store import warn_if_unexpected

        warn_if_unexpected(root, rec, found, "the build", client=client)
    return found


def _run_tool(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(
            f"  | {t}" for t in (proc.stderr or proc.stdout).strip().splitlines()[-20:]
        )
        raise LfbenchError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd[:3])} ...\n{tail}"
        )
    return proc.stdout


def _build_buildah(root: Path, rec: Mapping[str, Any], base_id: str, tag: str) -> None:
    """`buildah bud` with fixed timestamps, in OCI format (whose config has no container id or
    hostname), from the base in the engine (by id), then copied into the engine under `tag`:
    the engine's image id is the digest of that config, the same on every build."""
    work = f"localhost/lfbench-build:{rec['recipe'][:12]}-{os.getpid()}"
    cmd = ["buildah", "bud", "--quiet", "--timestamp", str(SOURCE_DATE_EPOCH), "--format", "oci"]
    cmd += ["--isolation", "chroot", "--layers=false", "--no-cache", "-f", "Dockerfile", "-t", work]
    for arg in (
        f"BASE_IMAGE=docker-daemon:{base_id}",
        f"RECIPE={rec['recipe']}",
        f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}",
    ):
        cmd += ["--build-arg", arg]
    # buildah copies the base from the engine into its own storage (about 150 MB, named
    # docker.io/library/sha256:<id>) and keeps it: removed after the build unless it was there
    # before (another build of this machine may be using it)
    had_base = _buildah_has(base_id)
    try:
        _run_tool([*cmd, str(root)], "buildah build")
        _run_tool(["buildah", "push", "--quiet", work, f"docker-daemon:{tag}"], "buildah push")
    finally:
        subprocess.run(["buildah", "rmi", "--force", work], capture_output=True)
        if not had_base and _buildah_has(base_id):
            gone = subprocess.run(["buildah", "rmi", base_id], capture_output=True, text=True)
            if gone.returncode != 0:
                log.info("image: buildah kept its copy of the base %s (%s)", base_id[:19],
                         gone.stderr.strip()[:200])  # fmt: skip


def _buildah_has(image_id: str) -> bool:
    """buildah's storage holds the image of this id (its copy of a base)."""
    proc = subprocess.run(
        ["buildah", "images", "--quiet", "--no-trunc", "--all"], capture_output=True, text=True
    )
    wanted = image_id.removeprefix("sha256:")
    return any(line.strip().removeprefix("sha256:") == wanted for line in proc.stdout.splitlines())


def _build_classic(
    root: Path, rec: Mapping[str, Any], *, client: Any, nocache: bool, tag: str
) -> None:
    """Docker's classic builder: it stamps build times into the image (not reproducible)."""
    import docker.errors

    tail: deque[str] = deque(maxlen=20)
    try:
        for chunk in client.api.build(
            path=str(root),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs={"BASE_IMAGE": str(rec["base_image"]), "RECIPE": rec["recipe"]},
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
    except docker.errors.APIError as e:
        raise LfbenchError(f"docker build failed: {e.explanation or e}") from e


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
