"""The image every stage runs in: its recipe, its build, and the id a build of it must give.

- The image is the environment only: the pinned base and the hash-locked dependencies. The
  project's code runs from the mounted workspace, so a code change re-runs only the stages whose
  code changed, exactly as locally.
- `recipe` is what build/image.json records (the `image` stage): the base reference and the hashes
  of the Dockerfile, .dockerignore and locks, and their digest. It is input-addressed: the same on
  every machine, whether stages then run in docker or locally, so dvc.lock is too. The image of a
  recipe is tagged `lfbench:<recipe12>` and labelled with the full digest.
- `build_image` makes the image from the Dockerfile and a hash-locked wheelhouse downloaded on
  the host: with buildah every build is cold and gives the same id for the same recipe and base.
- The committed `build/image.refs.json` records the id a reproducible build of the recipe gives
  on its base (`record_build`); a build or pull that gives another one says so, naming both
  (`warn_if_unexpected`). Where the image travels (a registry, the DVC remote) is
  `pipeline/env/image_store.py`; where a stage runs, `pipeline/env/containers.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline.core.errors import LfbenchError
from pipeline.core.io import canonical_json, file_digest, write_json

log = logging.getLogger(__name__)

REFS_JSON = Path("build/image.refs.json")

IMAGE_JSON = Path("build/image.json")
WHEELHOUSE_DIR = Path("build/wheelhouse")
NODEPS_LOCK = "requirements-nodeps.lock"
# The image installs what the stages import (requirements-image.in, pinned by requirements.lock),
# not the host's whole environment (dvc, docker, the MLflow server...).
IMAGE_LOCK = "requirements-image.lock"
IMAGE_REPO = "lfbench"
RECIPE_LABEL = "org.lfbench.recipe"
ENV_IMAGE_PULL = "LFBENCH_IMAGE_PULL"  # 0: never pull an image (build it instead)
ENV_CACHE = "LFBENCH_CACHE_DIR"
RECORD_VERSION = 2
# Inputs of the recipe: what the image is made of (the wheelhouse follows from the locks).
RECIPE_FILES = ("Dockerfile", ".dockerignore", IMAGE_LOCK, NODEPS_LOCK)
# The bit-reproducible builder (Debian's buildah): every file and the config's `created` carry
# this time, so the image id is a function of the recipe and the base's id.
ENV_BUILDER = "LFBENCH_IMAGE_BUILDER"  # buildah (default when installed) or docker (classic)
SOURCE_DATE_EPOCH = 0
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def sha256_file(path: Path) -> str:
    return file_digest(path, "sha256")


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


# ---------------------------------------------------------------- the expected image id


def read_refs(root: Path) -> dict[str, dict[str, Any]]:
    path = root / REFS_JSON
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise LfbenchError(f"{REFS_JSON}: not a readable JSON file ({e})") from e
    if not isinstance(data, dict):
        raise LfbenchError(f"{REFS_JSON}: expected an object of recipe digests")
    return data


def record_build(root: Path, rec: Mapping[str, Any], image_id: str, *, client: Any) -> bool:
    """Record, in the committed build/image.refs.json, the id a reproducible build of the recipe
    gives on its base (the base's id with it: the air-gapped base of
    scripts/build-base-image.sh differs from machine to machine, so the id is a function of the
    recipe and of the base's id). A record of this recipe on this base that names another id
    stays (it is what `image verify` checks; the build warned, naming both): False then."""
    if recorded_differs(root, rec, image_id, client=client) is not None:
        return False
    base = str(rec["base_image"])
    refs = read_refs(root)
    refs[rec["recipe"]] = {
        **refs.get(rec["recipe"], {}),
        "build": {"image_id": image_id, "base_image": base, "base_id": base_image_id(client, base)},
    }
    write_json(root / REFS_JSON, refs)
    return True


def recorded_differs(
    root: Path, rec: Mapping[str, Any], image_id: str, *, client: Any
) -> str | None:
    """The id build/image.refs.json records for the recipe on this base, when `image_id` (a
    build's or a pull's) is another one (None: no record for this base, or the same id)."""
    recorded = read_refs(root).get(str(rec["recipe"]), {}).get("build")
    if not isinstance(recorded, dict) or not recorded.get("image_id"):
        return None
    if recorded.get("base_id") != base_image_id(client, str(rec["base_image"])):
        return None  # recorded on another base (the air-gapped one differs per machine)
    want = str(recorded["image_id"])
    return None if want == image_id else want


def warn_if_unexpected(
    root: Path, rec: Mapping[str, Any], image_id: str, how: str, *, client: Any
) -> None:
    """One warning, naming both ids, when a build or pull gives another image than the one
    build/image.refs.json records for this recipe and base."""
    want = recorded_differs(root, rec, image_id, client=client)
    if want is not None:
        log.warning(
            "image: %s gave %s for recipe %s on base %s, but %s records %s: not the recorded"
            " image (`lfbench image verify` rebuilds and compares)",
            how,
            image_id,
            rec["tag"],
            rec["base_image"],
            REFS_JSON,
            want,
        )


def base_image_id(client: Any, base: str) -> str:
    return str(ensure_base(client, base).id)
