"""Where a stage process runs, noted by the stage itself (`lfbench stage ...`, before any work)
in .lfbench/stages/<stage>-<digest>.json: its runtime (local or docker), the image's digest and
recipe, the container it runs in, its user, Python and commit. Not a DVC output: .lfbench/ is
git-ignored."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.core.io import canonical_json, write_json
from pipeline.core.lineage import ENV_GIT_COMMIT, ENV_IMAGE_DIGEST, ENV_IMAGE_RECIPE, ENV_RUNTIME

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
