"""`lfbench image` as a user meets it (issue 36, point 21), on a real engine and buildah:

- in a fresh clone, `lfbench image pull` works before any `dvc repro image` (it needed
  build/image.json, a DVC output a clone does not have): the recipe is computed from the
  workspace, as the `image` stage computes it, and a stale build/image.json is said to be so;
- a buildah build leaves no copy of the base in buildah's storage (each left about 150 MB);
- a build whose image id is not the one build/image.refs.json records for the recipe and base
  warns, naming both ids, and keeps the record.

Needs a Docker engine and the air-gapped base (see tests/e2e/test_docker.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.env import image as img
from tests.conftest import ROOT, run
from tests.e2e.test_docker import _base_image, engine, image  # noqa: F401 - fixtures

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _workspace(dest: Path) -> Path:
    """What the image commands read: the recipe's files and params.yaml (the test base)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in img.RECIPE_FILES:
        shutil.copy2(ROOT / name, dest / name)
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["image_base"] = _base_image()
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return dest


def test_image_pull_in_a_fresh_clone(
    image: dict[str, Any],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path / "clone")
    assert not (ws / img.IMAGE_JSON).exists()  # a clone: `dvc repro image` not run
    done = run(["lfbench", "image", "pull"], ws)
    assert f"{image['tag']} {image['image_id']} (present)" in done.stdout, done.stdout + done.stderr
    # a build/image.json of another recipe (the Dockerfile changed since `dvc repro image`)
    stale = {**img.recipe(ws, "python:3.11-slim-bookworm"), "tag": "lfbench:0123456789ab"}
    (ws / img.IMAGE_JSON).parent.mkdir(parents=True, exist_ok=True)
    (ws / img.IMAGE_JSON).write_text(json.dumps(stale), encoding="utf-8")
    done = run(["lfbench", "image", "pull"], ws)
    assert f"{image['tag']} {image['image_id']} (present)" in done.stdout
    said = "build/image.json names recipe lfbench:0123456789ab, but this workspace's files make"
    assert said in done.stderr


def _buildah_ids() -> set[str]:
    out = subprocess.run(
        ["buildah", "images", "--quiet", "--no-trunc", "--all"], capture_output=True, text=True
    ).stdout
    return {line.strip().removeprefix("sha256:") for line in out.splitlines() if line.strip()}


def test_a_build_warns_when_its_id_is_not_the_recorded_one_and_leaves_no_base_copy(
    engine: Any,  # noqa: F811 - the fixture
    image: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    if img.image_builder() != "buildah":
        pytest.skip("buildah is not installed: Docker's classic builder is not reproducible")
    ws = _workspace(tmp_path / "ws")
    base_id = str(engine.images.get(_base_image()).id)
    hexid = base_id.removeprefix("sha256:")
    if hexid in _buildah_ids():  # a copy an earlier build left: this test starts without one
        subprocess.run(["buildah", "rmi", base_id], capture_output=True)
    if hexid in _buildah_ids():
        pytest.skip("buildah's copy of the base is in use by another build")
    wrong = "sha256:" + "0" * 64
    refs = ws / img.REFS_JSON
    refs.parent.mkdir(parents=True, exist_ok=True)
    build = {"image_id": wrong, "base_image": _base_image(), "base_id": base_id}
    refs.write_text(json.dumps({image["recipe"]: {"build": build}}), encoding="utf-8")

    done = run(["lfbench", "image", "build", "--no-cache"], ws)
    said = done.stdout + done.stderr
    # reproducible: the cold build gives the module's image id, which is not the record's
    assert f"{image['tag']} {image['image_id']}" in done.stdout, said
    assert (
        f"the build gave {image['image_id']} for recipe {image['tag']} on base {_base_image()},"
        f" but build/image.refs.json records {wrong}"
    ) in done.stderr, said
    assert json.loads(refs.read_text())[image["recipe"]]["build"]["image_id"] == wrong  # kept
    assert "recorded in" not in done.stdout
    assert hexid not in _buildah_ids(), "buildah kept its copy of the base"
