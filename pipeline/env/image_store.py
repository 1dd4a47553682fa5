"""Where the image of a recipe travels: an OCI registry and the DVC remote.

- A registry (`lfbench image push --registry HOST:PORT/REPO`): the image is pushed under its
  recipe tag and pinned by the manifest digest the registry returns, recorded in the committed
  `build/image.refs.json` (recipe digest -> `REPO@sha256:...`). A pull asks for that digest only,
  so a colleague gets the author's bytes or nothing.
- The DVC remote (`lfbench image push --dvc`, for teams without a registry): `docker save` of the
  image as `<remote>/lfbench-images/<recipe>.tar` with a `.sha256` beside it, through DVC's own
  filesystem for the remote (a folder, S3, ...), so the remote's credentials stay DVC's.

`pull` tries the registry references of the recipe, then the DVC remote, and returns the image
id and how it was had, or None; a pulled image must carry the recipe's label.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline.core.errors import LfbenchError
from pipeline.core.io import write_json
from pipeline.env.image import (
    ENV_IMAGE_PULL,
    RECIPE_LABEL,
    REFS_JSON,
    base_image_id,
    build_image,
    find_image,
    image_builder,
    read_refs,
    sha256_file,
    warn_if_unexpected,
)

log = logging.getLogger(__name__)

DVC_FOLDER = "lfbench-images"


# ---------------------------------------------------------------- registry


def push_registry(root: Path, rec: Mapping[str, Any], registry: str, *, client: Any) -> str:
    """Push the recipe's image to `registry` (HOST:PORT/REPO) and record its digest reference."""
    image_id = find_image(client, rec)
    if image_id is None:
        raise LfbenchError(f"no image {rec['tag']} here to push: `lfbench image build` first")
    tag = rec["recipe"][:12]
    image = client.images.get(image_id)
    image.tag(registry, tag)
    digest = None
    for chunk in client.images.push(registry, tag=tag, stream=True, decode=True):
        if "error" in chunk:
            raise LfbenchError(f"push to {registry}: {chunk['error']}")
        aux = chunk.get("aux")
        if isinstance(aux, dict) and "Digest" in aux:
            digest = str(aux["Digest"])
    if digest is None:
        raise LfbenchError(f"push to {registry}: the registry returned no manifest digest")
    ref = f"{registry}@{digest}"
    refs = read_refs(root)
    refs[rec["recipe"]] = {**refs.get(rec["recipe"], {}), "registry": ref}
    write_json(root / REFS_JSON, refs)
    return ref


def pull_registry(root: Path, rec: Mapping[str, Any], *, client: Any) -> str | None:
    """Pull the recipe's image by the digest `build/image.refs.json` records; its id or None."""
    import docker.errors

    ref = read_refs(root).get(rec["recipe"], {}).get("registry")
    if not ref:
        return None
    try:
        image = client.images.pull(ref)
    except docker.errors.APIError as e:
        log.info("image: %s cannot be pulled (%s)", ref, e.explanation or e)
        return None
    return _adopt(client, image, rec, ref)


def _adopt(client: Any, image: Any, rec: Mapping[str, Any], source: str) -> str | None:
    """Tag a fetched image as the recipe's, if it carries the recipe's label."""
    if (image.labels or {}).get(RECIPE_LABEL) != rec["recipe"]:
        log.warning("image: %s is not labelled with recipe %s; not used", source, rec["recipe"])
        return None
    repo, tag = str(rec["tag"]).split(":", 1)
    image.tag(repo, tag)
    return str(image.id)


# ---------------------------------------------------------------- DVC remote


def _dvc_remote(root: Path, remote: str | None) -> tuple[Any, str]:
    """DVC's filesystem for the remote and the archive folder's path on it."""
    from pipeline import dvc_internals as dvc

    return dvc.remote_folder(root, remote, DVC_FOLDER)


def push_dvc(
    root: Path,
    rec: Mapping[str, Any],
    *,
    client: Any,
    remote: str | None = None,
    emit: Callable[[str], None] = log.info,
) -> str:
    """`docker save` the recipe's image into the DVC remote; returns the archive's path there."""
    image_id = find_image(client, rec)
    if image_id is None:
        raise LfbenchError(f"no image {rec['tag']} here to push: `lfbench image build` first")
    fs, folder = _dvc_remote(root, remote)
    dest = fs.join(folder, f"{rec['recipe']}.tar")
    with tempfile.TemporaryDirectory(prefix="lfbench-image-") as tmp:
        archive = Path(tmp) / "image.tar"
        emit(f"image: saving {rec['tag']} ({image_id[:19]})")
        with archive.open("wb") as f:
            for chunk in client.images.get(image_id).save(named=True):
                f.write(chunk)
        digest = sha256_file(archive)
        emit(f"image: uploading {archive.stat().st_size / 1e6:.1f} MB to {dest}")
        fs.makedirs(folder, exist_ok=True)
        fs.put_file(str(archive), dest + ".partial")
        fs.mv(dest + ".partial", dest)
        sums = Path(tmp) / "sha256"
        sums.write_text(f"{digest}  {rec['recipe']}.tar\n", encoding="utf-8")
        fs.put_file(str(sums), dest + ".sha256")
    return str(dest)


def pull_dvc(
    root: Path,
    rec: Mapping[str, Any],
    *,
    client: Any,
    remote: str | None = None,
    emit: Callable[[str], None] = log.info,
) -> str | None:
    """Load the recipe's image from the DVC remote's archive (checksum checked); its id or None."""
    try:
        fs, folder = _dvc_remote(root, remote)
        src = fs.join(folder, f"{rec['recipe']}.tar")
        if not fs.exists(src) or not fs.exists(src + ".sha256"):
            return None
    except Exception as e:  # noqa: BLE001 - no remote, unreachable store: not an image source
        log.info("image: the DVC remote has no image archive (%s)", e)
        return None
    with tempfile.TemporaryDirectory(prefix="lfbench-image-") as tmp:
        archive, sums = Path(tmp) / "image.tar", Path(tmp) / "sha256"
        emit(f"image: downloading {src}")
        fs.get_file(src, str(archive))
        fs.get_file(src + ".sha256", str(sums))
        want = sums.read_text(encoding="utf-8").split()[0]
        if sha256_file(archive) != want:
            raise LfbenchError(f"{src}: the archive does not match its .sha256 (corrupt upload?)")
        with archive.open("rb") as f:
            images = client.images.load(f)
    for image in images:
        got = _adopt(client, image, rec, src)
        if got:
            return got
    return None


def pull(
    root: Path,
    rec: Mapping[str, Any],
    *,
    client: Any,
    emit: Callable[[str], None] = log.info,
) -> tuple[str, str] | None:
    """The recipe's image from the team's stores: a registry first, then the DVC remote."""
    got, how = pull_registry(root, rec, client=client), "pulled from the registry"
    if not got:
        got, how = pull_dvc(root, rec, client=client, emit=emit), "pulled from the DVC remote"
    if not got:
        return None
    warn_if_unexpected(root, rec, got, f"the image {how}", client=client)
    return got, how


def ensure_image(
    root: Path,
    rec: Mapping[str, Any],
    *,
    client: Any,
    emit: Callable[[str], None] = log.info,
) -> tuple[str, str]:
    """The recipe's image on this engine: present, pulled (a registry, then the DVC remote)
    or built. Returns (image id, how)."""
    found = find_image(client, rec)
    if found:
        return found, "present"
    if os.environ.get(ENV_IMAGE_PULL) != "0":
        pulled = pull(root, rec, client=client, emit=emit)
        if pulled:
            return pulled
    return build_image(root, rec, client=client, emit=emit), "built"


# ---------------------------------------------------------------- the expected image id


def verify(
    root: Path,
    rec: Mapping[str, Any],
    *,
    client: Any,
    emit: Callable[[str], None] = log.info,
) -> dict[str, str]:
    """Rebuild the recipe's image from scratch (under a scratch tag) and compare its id with the
    one build/image.refs.json records and with the recipe's image on this engine (pulled or
    built). Raises, naming both ids, when one differs; returns what was compared."""
    if image_builder() != "buildah":
        raise LfbenchError(
            "image verify needs the reproducible builder, buildah (apt-get install buildah): "
            "Docker's classic builder stamps build times into every image"
        )
    recorded = read_refs(root).get(rec["recipe"], {}).get("build")
    present = find_image(client, rec)
    base_id = base_image_id(client, str(rec["base_image"]))
    if recorded and recorded.get("base_id") != base_id:
        raise LfbenchError(
            f"image verify: {REFS_JSON} records the image of recipe {rec['tag']} on base "
            f"{recorded.get('base_image')} = {recorded.get('base_id')}, but that base here is "
            f"{base_id}: a build on another base cannot give the recorded id"
        )
    scratch = f"lfbench-verify:{rec['recipe'][:12]}"
    built = build_image(root, rec, client=client, emit=emit, tag=scratch)
    try:
        checked = {"rebuilt": built, "base_id": base_id}
        for what, want in (
            ("the image on this engine", present),
            (f"the id {REFS_JSON} records", (recorded or {}).get("image_id")),
        ):
            if want is None:
                continue
            if want != built:
                raise LfbenchError(
                    f"image verify: recipe {rec['tag']} rebuilt from scratch gives {built}, "
                    f"but {what} is {want}"
                )
            checked[what] = want
        if len(checked) == 2:
            raise LfbenchError(
                f"image verify: nothing to compare the rebuild ({built}) with: no image of recipe "
                f"{rec['tag']} here and no id recorded in {REFS_JSON} (`lfbench image build` "
                "records it)"
            )
        return checked
    finally:
        client.images.remove(scratch)  # the tag only, when the recipe's tag holds the same id
