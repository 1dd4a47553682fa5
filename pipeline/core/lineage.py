"""Where a number came from: git commit, DVC stage and data hashes, runtime and image.

`lfbench run` collects the git facts on the host and passes them to the stage in environment
variables (a container may have no git); a stage run directly falls back to asking git.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.io import canonical_json

ENV_GIT_COMMIT = "LFBENCH_GIT_COMMIT"
ENV_GIT_DIRTY = "LFBENCH_GIT_DIRTY"
ENV_RUNTIME = "LFBENCH_RUNTIME"
ENV_IMAGE_DIGEST = "LFBENCH_IMAGE_DIGEST"
ENV_IMAGE_RECIPE = "LFBENCH_IMAGE_RECIPE"
ENV_CONTAINER_ID = "LFBENCH_CONTAINER_ID"


def load_yaml_text(text: str) -> Any:
    """YAML with libyaml's parser where PyYAML has it (dvc.lock grows to hundreds of kB)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _not_dirt(root: Path) -> list[str]:
    """Pathspecs of what a `dvc repro` itself rewrites (dvc.lock, the .gitignore files DVC keeps
    beside its outputs, and every declared output, e.g. the git-tracked metrics files DVC deletes
    before re-running a stage): changes there do not make the code or the configuration dirty."""
    specs = [":!dvc.lock", ":(exclude,glob)**/.gitignore"]
    from pipeline.core import dvcfile
    from pipeline.core.errors import ConfigError

    try:
        stages = dvcfile.stages(root / "dvc.yaml")
    except ConfigError:
        return specs
    for stage in stages.values():
        for kind in ("outs", "metrics", "plots"):
            for path in dvcfile.paths(stage.get(kind)):
                prefix = path.split("${", 1)[0]
                if prefix:
                    specs.append(f":!{prefix}")
    return specs


@dataclass(frozen=True)
class GitInfo:
    commit: str
    dirty: bool | None


def git_info(root: Path) -> GitInfo:
    commit = os.environ.get(ENV_GIT_COMMIT)
    if commit:
        dirty_env = os.environ.get(ENV_GIT_DIRTY)
        return GitInfo(commit, None if dirty_env is None else dirty_env == "true")
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        status = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                *_not_dirt(root),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return GitInfo(commit, bool(status.strip()))
    except (OSError, subprocess.CalledProcessError):
        return GitInfo("unknown", None)


def git_env(root: Path) -> dict[str, str]:
    info = git_info(root)
    env = {ENV_GIT_COMMIT: info.commit}
    if info.dirty is not None:
        env[ENV_GIT_DIRTY] = "true" if info.dirty else "false"
    return env


# dvc.lock parsed once per version of the file: a result's MLflow run looks up two or three
# stages in it, and parsing the whole lock takes about 0.2 s (168 SummHay rows: a minute).
_LOCKS: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def dvc_lock_entry(root: Path, stage: str) -> dict[str, Any] | None:
    lock = (root / "dvc.lock").resolve()
    try:
        st = lock.stat()
    except FileNotFoundError:
        return None
    version = (st.st_mtime_ns, st.st_size)
    cached = _LOCKS.get(lock)
    if cached is None or cached[0] != version:
        data = load_yaml_text(lock.read_text(encoding="utf-8")) or {}
        cached = (version, data.get("stages") or {})
        _LOCKS[lock] = cached
    entry = cached[1].get(stage)
    return entry if isinstance(entry, dict) else None


def stage_md5(entry: dict[str, Any]) -> str:
    """A digest of a stage's dvc.lock entry: its command, the hashes of its dependencies and
    outputs, and its parameter values. Equal digests mean the same stage made the same outputs."""
    return hashlib.md5(canonical_json(entry).encode(), usedforsecurity=False).hexdigest()


def dvc_file_md5(path: Path) -> str | None:
    """The md5 a .dvc file records for its (single) output, e.g. data.dvc -> data/."""
    if not path.exists():
        return None
    data = load_yaml_text(path.read_text(encoding="utf-8")) or {}
    outs = data.get("outs") or []
    return str(outs[0]["md5"]) if outs and "md5" in outs[0] else None


def runtime_tags() -> dict[str, str]:
    return {
        "runtime": os.environ.get(ENV_RUNTIME, "local"),
        "image.digest": os.environ.get(ENV_IMAGE_DIGEST, "none"),
        "image.recipe": os.environ.get(ENV_IMAGE_RECIPE, "none"),
    }
