"""The image of a recipe travels through an OCI registry (Debian's docker-registry on loopback,
pinned by manifest digest) and through the DVC remote (an archive keyed by the recipe digest),
and comes back as the same image id; an image without the recipe's label is refused.

A tiny image (`FROM scratch`, one file, the recipe label) stands in for the lfbench image: the
stores move any image the same way, and the real image's push and pull times are measured by
perf/container_overhead.py instead (about 1.3 GB).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.env import containers, image_store
from pipeline.env import image as img
from tests.conftest import ROOT, dvc_workspace, run

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def engine() -> Any:
    client = containers.docker_client()
    if client is None:
        pytest.skip("no Docker engine answers (DOCKER_HOST / /var/run/docker.sock)")
    return client


def _tiny(engine: Any, tmp: Path, label: str | None) -> tuple[dict[str, str], str]:
    """A one-file image tagged as a recipe's; labelled with the recipe unless `label` says."""
    digest = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    ctx = tmp / f"ctx-{digest[:8]}"
    ctx.mkdir()
    (ctx / "hello").write_text(digest)
    (ctx / "Dockerfile").write_text(
        f"FROM scratch\nCOPY hello /hello\nLABEL {img.RECIPE_LABEL}={label or digest}\n"
    )
    rec = {"recipe": digest, "tag": f"{img.IMAGE_REPO}:{digest[:12]}"}
    image, _ = engine.images.build(path=str(ctx), tag=rec["tag"], rm=True)
    return rec, str(image.id)


def _forget(engine: Any, rec: dict[str, str], image_id: str) -> None:
    """Remove the image from the engine, as on a colleague's machine that never had it."""
    engine.images.remove(image_id, force=True)
    assert img.find_image(engine, rec) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def registry(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("Debian's docker-registry is not installed (apt-get install docker-registry)")
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "registry")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    log = (tmp_path / "registry.log").open("w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "registry did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}/lfbench"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _workspace(tmp_path: Path) -> Path:
    """A DVC project whose default remote is a local folder."""
    return dvc_workspace(tmp_path / "ws", tmp_path / "remote")


def test_through_a_registry_pinned_by_digest(engine: Any, registry: str, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    rec, image_id = _tiny(engine, tmp_path, None)
    ref = image_store.push_registry(ws, rec, registry, client=engine)
    assert ref.startswith(f"{registry}@sha256:")
    refs = json.loads((ws / img.REFS_JSON).read_text())
    assert refs == {rec["recipe"]: {"registry": ref}}

    _forget(engine, rec, image_id)
    assert image_store.pull(ws, rec, client=engine) == (image_id, "pulled from the registry")
    assert img.find_image(engine, rec) == image_id

    # A reference whose image carries another recipe's label is not adopted under this one.
    other, other_id = _tiny(engine, tmp_path, label="someone-else")
    engine.images.get(other_id).tag(registry, "other")
    pushed = engine.images.push(registry, tag="other", stream=True, decode=True)
    digest = next(c["aux"]["Digest"] for c in pushed if "Digest" in (c.get("aux") or {}))
    refs[other["recipe"]] = {"registry": f"{registry}@{digest}"}
    (ws / img.REFS_JSON).write_text(json.dumps(refs))
    engine.images.remove(other_id, force=True)
    assert image_store.pull_registry(ws, other, client=engine) is None
    assert img.find_image(engine, other) is None
    for ref in (f"{registry}@{digest}", image_id):
        engine.images.remove(ref, force=True)


def test_through_the_dvc_remote(engine: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    rec, image_id = _tiny(engine, tmp_path, None)
    assert image_store.pull_dvc(ws, rec, client=engine) is None  # nothing pushed yet
    dest = image_store.push_dvc(ws, rec, client=engine)
    archive = tmp_path / "remote" / image_store.DVC_FOLDER / f"{rec['recipe']}.tar"
    assert Path(dest) == archive and archive.exists()
    assert not list(archive.parent.glob("*.partial"))

    _forget(engine, rec, image_id)
    assert image_store.pull(ws, rec, client=engine) == (image_id, "pulled from the DVC remote")

    # A corrupted upload is refused, naming the archive.
    _forget(engine, rec, image_id)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(LfbenchError, match=r"does not match its \.sha256"):
        image_store.pull_dvc(ws, rec, client=engine)

    # No image, no store: a clear error from the CLI, not a traceback. The CLI computes the
    # recipe from the workspace's files and params (as the image stage does): the project's,
    # with a Dockerfile of its own so that no engine or store has its image.
    for name in (*img.RECIPE_FILES, "params.yaml"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, ws / name)
    with (ws / "Dockerfile").open("a") as f:
        f.write(f"# {uuid.uuid4().hex}\n")
    archive.unlink()
    proc = run(["lfbench", "image", "pull"], ws, check=False)
    assert proc.returncode != 0 and "no store has the image" in proc.stderr
    assert "Traceback" not in proc.stderr
