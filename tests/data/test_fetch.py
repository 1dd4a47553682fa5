"""`lfbench data fetch`: pinned sources or a mirror, checksums, the derived file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import DataError
from pipeline.data.fetch import (
    derive_json_list_complete_prefix,
    fetch,
    load_manifest,
)

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "data.sources.yaml"


# ---------------------------------------------------------------- data fetch


@pytest.fixture
def small_manifest(tmp_path: Path, mirror: Path) -> Path:
    """The real manifest restricted to two small files."""
    data = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    keep = [
        "crud_rag/QuestAnswer1Doc_quest_gt_save.json",
        "crud_rag/HalluModified_quest_gt_save.json",
    ]
    data["files"] = {k: data["files"][k] for k in keep}
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_manifest_covers_the_mirror(mirror: Path) -> None:
    manifest = load_manifest(MANIFEST)
    on_disk = {str(p.relative_to(mirror)) for p in mirror.rglob("*.json")}
    assert set(manifest.files) == on_disk


def test_fetch_from_mirror_then_idempotent(
    tmp_path: Path, mirror: Path, small_manifest: Path
) -> None:
    data_dir = tmp_path / "data"
    report = fetch(data_dir, small_manifest, mirror=mirror, log=lambda m: None)
    assert len(report.copied) == 2
    again = fetch(data_dir, small_manifest, mirror=mirror, log=lambda m: None)
    assert (again.copied, len(again.already_ok)) == ([], 2)


def test_corrupted_mirror_file_is_named(tmp_path: Path, mirror: Path, small_manifest: Path) -> None:
    bad = tmp_path / "mirror"
    shutil.copytree(mirror / "crud_rag", bad / "crud_rag")
    target = bad / "crud_rag" / "QuestAnswer1Doc_quest_gt_save.json"
    target.chmod(0o644)
    raw = bytearray(target.read_bytes())
    raw[100] = (raw[100] + 1) % 256  # same size, one byte off
    target.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="corrupted") as info:
        fetch(tmp_path / "data", small_manifest, mirror=bad, log=lambda m: None)
    assert info.value.file == str(target)


def test_missing_mirror_file_is_named(tmp_path: Path, small_manifest: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="missing from the mirror") as info:
        fetch(tmp_path / "data", small_manifest, mirror=empty, log=lambda m: None)
    assert info.value.file is not None and info.value.file.endswith(".json")


def test_unknown_file_in_data_is_refused(
    tmp_path: Path, mirror: Path, small_manifest: Path
) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "summhay").mkdir(parents=True)
    (data_dir / "summhay" / "mine.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"files not in data\.sources\.yaml: summhay/mine\.json"):
        fetch(data_dir, small_manifest, mirror=mirror, log=lambda m: None)


def test_derived_crud_file_reproduces_the_mirror_bytes(mirror: Path) -> None:
    """The derivation applied to a truncated list gives back the mirror's file exactly."""
    target = (mirror / "crud_rag" / "event_summary.first1328.json").read_bytes()
    records = json.loads(target)
    # A truncated upload: the complete records, then a record cut in the middle.
    truncated = json.dumps([*records, {"event": "cut here"}], ensure_ascii=False, indent=2)
    truncated = truncated[: truncated.rindex("cut") + 2]
    assert derive_json_list_complete_prefix(truncated.encode("utf-8")) == target


def test_fetch_over_http_pinned_urls_and_derived_file(
    tmp_path: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The public-source path: files served at <repo>/<commit>/<path> by a loopback HTTP
    server; the CRUD file is served truncated (as upstream is) and derived on the fly."""
    import http.server
    import threading

    manifest = load_manifest(MANIFEST)
    keep = ["crud_rag/QuestAnswer1Doc_quest_gt_save.json", "crud_rag/event_summary.first1328.json"]
    served = tmp_path / "served"
    for name in keep:
        spec = manifest.files[name]
        dest = served / spec.repo / spec.commit / spec.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = (mirror / name).read_bytes()
        if spec.derive:
            records = json.loads(data)
            text = json.dumps([*records, {"event": "cut"}], ensure_ascii=False, indent=2)
            data = text[: text.rindex("cut")].encode("utf-8")
        dest.write_bytes(data)
    small = tmp_path / "sources.yaml"
    raw = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    raw["files"] = {k: raw["files"][k] for k in keep}
    # Our synthetic truncated upload is not the upstream blob: skip only that source check.
    raw["files"][keep[1]].pop("source_git_blob")
    small.write_text(yaml.safe_dump(raw), encoding="utf-8")

    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(served)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        monkeypatch.setenv(
            "LFBENCH_DATA_URL_TEMPLATE", f"http://127.0.0.1:{port}/{{repo}}/{{commit}}/{{path}}"
        )
        report = fetch(tmp_path / "data", small, mirror=None, log=lambda m: None)
    finally:
        server.shutdown()
    assert sorted(report.copied) == sorted(keep)
    for name in keep:
        assert (tmp_path / "data" / name).read_bytes() == (mirror / name).read_bytes()
