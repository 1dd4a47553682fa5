"""`lfbench run STAGE ...` (every dvc.yaml stage's command): the stage run where params.yaml's
`runtime` says, in the pinned image or in this process.

The first stage of a `dvc repro` (or of an `lfbench repro`, `LFBENCH_REPRO_KEY`) decides, and
says so (or warns once); the others follow the remembered decision quietly (`containers`). In
the image, the stage runs `lfbench stage ...` from the mounted workspace with the allow-listed
environment; here, the caller's `here` runs it in this process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.config import load_yaml
from pipeline.core.lineage import ENV_IMAGE_DIGEST, ENV_IMAGE_RECIPE, ENV_RUNTIME, git_env
from pipeline.core.params import load_params
from pipeline.env import containers, image, image_store

log = logging.getLogger("lfbench")


def run_stage(
    stage_name: str,
    args: Sequence[str],
    params_path: Path,
    here: Callable[[list[str]], None],
) -> int:
    """Run the stage in the chosen runtime; its exit status (`here(argv)` runs `lfbench stage
    ARGV` in this process)."""
    params = load_params(params_path, [])  # the stage validates its own benchmark's section
    root = Path.cwd()
    # said by the stage that decides (with its one warning); the others follow it quietly
    decided = containers.remembered(root, image.read_recipe(root), params.runtime)
    decision, client = runtime(root, params.runtime)
    log.log(
        logging.DEBUG if decided else logging.INFO,
        "stage %s: runtime %s (%s)",
        stage_name,
        decision["runtime"],
        decision["why"],
    )
    recipe_env = {ENV_IMAGE_RECIPE: str(decision["recipe"])}
    if decision["runtime"] == "local":
        os.environ.update({**git_env(root), **recipe_env, ENV_RUNTIME: "local"})
        here([stage_name, *args, "--params", str(params_path)])
        return 0
    image_id = str(decision["image_id"])
    runner_env = {
        **git_env(root),
        **recipe_env,
        ENV_RUNTIME: "docker",
        ENV_IMAGE_DIGEST: image_id,
        "PYTHONPATH": str(root.resolve()),
        # The image ships no bytecode (smaller, and reproducible): the stages' imports are
        # compiled once per image into the workspace's .lfbench/pycache, then reused.
        "PYTHONPYCACHEPREFIX": str(root.resolve() / containers.PYCACHE_DIR / image_id[7:19]),
        "PYTHONDONTWRITEBYTECODE": "",
    }
    env = containers.container_env(load_yaml(params_path) or {}, os.environ, runner_env)
    mirror = os.environ.get(containers.ENV_DATA_MIRROR)
    try:
        return containers.run_stage_in_container(
            image_id,
            containers.stage_argv(stage_name, args, params_path),
            root,
            env,
            client=client or containers.docker_client(),
            mounts=[Path(mirror)] if mirror else [],
        )
    except containers.Terminated:
        return 143


def runtime(root: Path, requested: str) -> tuple[dict[str, Any], Any]:
    """Where this `dvc repro`'s stages run: decided (and said, or warned) by its first stage,
    remembered for the others."""
    recipe = image.read_recipe(root)
    memo = containers.remembered(root, recipe, requested)
    if memo is not None:
        return memo, None
    with containers.deciding(root):  # stages starting at once (lfbench repro --jobs): one decides
        memo = containers.remembered(root, recipe, requested)
        if memo is not None:
            return memo, None
        return _decide(root, recipe, requested)


def _decide(root: Path, recipe: dict[str, Any], requested: str) -> tuple[dict[str, Any], Any]:
    client = containers.docker_client() if requested != "local" else None
    decision = containers.decide(
        requested,
        recipe,
        client=client,
        obtain=lambda: image_store.ensure_image(root, recipe, client=client),
    )
    if decision.get("warn"):
        log.warning(
            "stages of this run go local, not in the pinned image: %s (set `runtime: local` "
            "to silence this, or `runtime: docker` to make it an error)",
            ": ".join(str(decision[k]) for k in ("why", "reason") if decision.get(k)),
        )
    containers.remember(root, recipe, requested, decision)
    return decision, client
