"""`lfbench image` as a user meets it (issue 36, point 21), on a real engine and buildah:

- in a fresh clone, `lfbench image pull` works before any `dvc repro image` (it needed
  build/image.json, a DVC output a clone does not have): the recipe is computed from the
  workspace, as the `image` stage computes it, and a stale build/image.json is said to be so;
- one cold rebuild (`lfbench image verify`; buildah has no layer cache) gives the id of the
  module's image: the image is reproducible. A record of another id for the recipe and base is
  refused and the build warns, both naming both ids; the record stays; the build leaves no
  copy of the base in buildah's storage (each left about 150 MB). One cold build proves all of
  it: each costs about 65 CPU-seconds and two minutes on 2 busy cores;
- what a build records (its id and the base's, not over a record of another id on this base),
  and `image verify` refusing a record made on another base, without a build.

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


def test_a_cold_rebuild_gives_the_recipe_s_id_warns_and_keeps_the_record_and_no_base_copy(
    engine: Any,  # noqa: F811 - the fixture
    image: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    """One cold rebuild (buildah has no layer cache) proves the image reproducible and checks
    what a user meets around it: `lfbench image verify` rebuilds the recipe from scratch; the
    rebuild has the id of the module's image (built cold by the fixture, or by an earlier run:
    verify compares with it first), so a record of another id is refused naming both ids, the
    build itself warned naming both, the record stays, and buildah keeps no copy of the base."""
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
    before = refs.read_bytes()

    done = run(["lfbench", "image", "verify"], ws, check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    # reproducible: the rebuild matched the engine's image (compared first), then differed from
    # the record, and said so naming both
    assert (
        f"recipe {image['tag']} rebuilt from scratch gives {image['image_id']}, but the id"
        f" {img.REFS_JSON} records is {wrong}"
    ) in done.stderr, said
    assert (
        f"the build gave {image['image_id']} for recipe {image['tag']} on base {_base_image()},"
        f" but build/image.refs.json records {wrong}"
    ) in done.stderr, said
    assert refs.read_bytes() == before  # kept
    assert hexid not in _buildah_ids(), "buildah kept its copy of the base"
    assert img.find_image(engine, image) == image["image_id"]
    assert not [t for i in engine.images.list() for t in i.tags if t.startswith("lfbench-verify:")]


def test_a_build_records_its_id_unless_a_record_on_this_base_names_another(
    engine: Any,  # noqa: F811 - the fixture
    image: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    """What `lfbench image build` writes after a buildah build (the cold build itself is the
    test above): its id, with the base's; a record of this recipe on this base that names
    another id stays (what `image verify` checks); a record made on another base is replaced.
    And `image verify` refuses a record made on another base before any build."""
    from pipeline.core.errors import LfbenchError
    from pipeline.env import image_store

    ws = _workspace(tmp_path / "ws")
    rec = {k: v for k, v in image.items() if k != "image_id"}
    base_id = str(engine.images.get(_base_image()).id)
    refs = ws / img.REFS_JSON

    def recorded() -> dict[str, Any]:
        return dict(json.loads(refs.read_text())[image["recipe"]]["build"])

    assert img.record_build(ws, rec, image["image_id"], client=engine)
    mine = {"image_id": image["image_id"], "base_image": _base_image(), "base_id": base_id}
    assert recorded() == mine
    wrong = "sha256:" + "0" * 64
    refs.write_text(json.dumps({image["recipe"]: {"build": {**mine, "image_id": wrong}}}))
    assert not img.record_build(ws, rec, image["image_id"], client=engine)
    assert recorded()["image_id"] == wrong
    elsewhere = {**mine, "image_id": wrong, "base_id": "sha256:" + "b" * 64}
    refs.write_text(json.dumps({image["recipe"]: {"build": elsewhere}}))
    if img.image_builder() == "buildah":
        with pytest.raises(LfbenchError, match="cannot give the recorded id"):
            image_store.verify(ws, rec, client=engine)  # refused before building
    assert img.record_build(ws, rec, image["image_id"], client=engine)
    assert recorded() == mine
