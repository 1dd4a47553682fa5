"""Stages refuse raw data that is not the pinned bytes (issue 36, point 2): `verify_data` on its
own (the memo of verified files included), and a real `dvc repro` of a construct stage on a
project copy whose data/ has one byte changed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import DataError
from pipeline.data import verify
from pipeline.data.verify import data_paths, verify_data
from tests.conftest import run


def _root(tmp_path: Path) -> Path:
    """A project root with two pinned files under data/b and one under data/c."""
    files = {"b/one.json": b'{"a": 1}\n', "b/two.json": b"[1, 2, 3]\n", "c/x.txt": b"x\n"}
    pins = {}
    for name, data in files.items():
        path = tmp_path / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        pins[name] = {
            "repo": "o/r", "commit": "c", "path": name, "git_blob": "g", "license": "x",
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
        }  # fmt: skip
    (tmp_path / "data.sources.yaml").write_text(yaml.safe_dump({"version": 1, "files": pins}))
    return tmp_path


def test_a_changed_byte_missing_or_unknown_file_is_refused_naming_file_and_fix(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path)
    assert data_paths(root, ["--data", "data/b", "--out", "datasets/x.jsonl"]) == [
        (root / "data" / "b").resolve()
    ]
    assert data_paths(root, ["--labels=data/c/x.txt", "inputs/b"]) == [
        (root / "data" / "c" / "x.txt").resolve()
    ]
    assert verify_data(root, data_paths(root, ["data/b"])) == 2
    assert verify_data(root, data_paths(root, ["data"])) == 3

    one = root / "data" / "b" / "one.json"
    pinned = hashlib.sha256(one.read_bytes()).hexdigest()
    one.write_bytes(b'{"a": 2}\n')  # one byte changed, same size
    with pytest.raises(DataError) as e:
        verify_data(root, data_paths(root, ["data/b"]))
    message = str(e.value)
    actual = hashlib.sha256(b'{"a": 2}\n').hexdigest()
    assert message.startswith("file data/b/one.json: sha256 " + actual), message
    assert f"expected {pinned}" in message and "lfbench data fetch" in message
    verify_data(root, data_paths(root, ["data/c"]))  # another folder is not concerned

    one.unlink()
    with pytest.raises(DataError, match=r"file data/b/one.json: missing; .*lfbench data fetch"):
        verify_data(root, data_paths(root, ["data/b"]))
    one.write_bytes(b'{"a": 1}\n')
    (root / "data" / "b" / "mine.json").write_text("{}")
    with pytest.raises(DataError, match=r"file data/b/mine.json: not in data.sources.yaml"):
        verify_data(root, data_paths(root, ["data/b"]))


def test_the_memo_trusts_an_unchanged_stat_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file hashed and matched is not hashed again while its stat is the same; a rewrite of
    the same size dated back to the same mtime is caught (its ctime moved), and a file changed
    in the last seconds is never memoised."""
    root = _root(tmp_path)
    time.sleep(verify.RACY_S + 0.5)  # written a while ago, as fetched data is
    hashed: list[str] = []
    real = verify._sha256

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(verify, "_sha256", counting)
    verify_data(root, data_paths(root, ["data"]))
    assert len(hashed) == 3
    verify_data(root, data_paths(root, ["data"]))
    assert len(hashed) == 3  # all trusted from the memo

    one = root / "data" / "b" / "one.json"
    st = one.stat()
    one.write_bytes(b'{"a": 2}\n')
    os.utime(one, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime as before
    with pytest.raises(DataError, match=r"data/b/one\.json: sha256"):
        verify_data(root, data_paths(root, ["data"]))
    one.write_bytes(b'{"a": 1}\n')  # back, but just now: hashed on every check
    before = len(hashed)
    verify_data(root, data_paths(root, ["data/b"]))
    verify_data(root, data_paths(root, ["data/b"]))
    assert hashed[before:].count("one.json") == 2


def test_dvc_repro_refuses_corrupted_data_and_leaves_data_dvc_alone(
    project: Path, mirror: Path
) -> None:
    """The probe: one byte of data/summhay/topic_news2.json changed, then `dvc repro
    summhay-construct`. Before: rc 0, the dataset built from it and data.dvc rewritten with the
    corrupted folder's hash. Now: the stage fails naming the file, both hashes and the fix, and
    writes nothing; data.dvc is untouched; `lfbench data fetch` repairs it and the repro runs."""
    path = project / "data" / "summhay" / "topic_news2.json"
    data = bytearray(path.read_bytes())
    at = data.index(b"the")
    data[at] = ord("T")
    path.write_bytes(bytes(data))
    data_dvc = (project / "data.dvc").read_text()

    proc = run(["dvc", "repro", "summhay-construct"], project, check=False)
    assert proc.returncode != 0, proc.stdout
    out = proc.stdout + proc.stderr
    actual = hashlib.sha256(bytes(data)).hexdigest()
    assert f"error: file data/summhay/topic_news2.json: sha256 {actual}" in out, out[-3000:]
    assert "expected 0bb71fdc90c0a3e8512cb137ae4eeaf8a80b40032c71ad31e10c1350ccb755c4" in out
    assert "lfbench data fetch" in out
    assert (project / "data.dvc").read_text() == data_dvc
    assert not (project / "datasets" / "summhay.jsonl").exists()
    status = run(["dvc", "status", "data.dvc"], project).stdout
    assert "modified" in status  # plain DVC still says the folder is not data.dvc's

    run(["lfbench", "data", "fetch", "--mirror", str(mirror)], project)
    run(["dvc", "repro", "summhay-construct"], project)
    assert (project / "data.dvc").read_text() == data_dvc
    assert (project / "datasets" / "summhay.jsonl").exists()
    diff = subprocess.run(["git", "diff", "--quiet", "data.dvc"], cwd=project)
    assert diff.returncode == 0
