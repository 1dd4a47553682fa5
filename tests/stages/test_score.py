"""`lfbench score` on hostile input (issue 26, points 5, 7 and 8): ids, file line numbers, bytes
that are not UTF-8 and output paths that cannot be written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.core.errors import DataError
from pipeline.stages.score import score_file

GOOD = {"generation": "中国队夺得冠军", "reference": "中国队夺冠"}


def _score(tmp_path: Path, text: str | bytes) -> tuple[int, int, list[dict[str, Any]]]:
    src = tmp_path / "mine.jsonl"
    if isinstance(text, str):
        src.write_text(text, encoding="utf-8")
    else:
        src.write_bytes(text)
    out = tmp_path / "scored.jsonl"
    scored, errors, _ = score_file(registry.get("crud_rag"), src, out)
    return scored, errors, [json.loads(x) for x in out.read_text("utf-8").split("\n") if x]


def _line(**fields: Any) -> str:
    return json.dumps(fields, ensure_ascii=False) + "\n"


@pytest.mark.parametrize(
    ("ident", "message"),
    [
        (None, "field 'id' must be a non-empty string"),
        (7, "field 'id' must be a non-empty string"),
        (["a"], "field 'id' must be a non-empty string"),
        ("  ", "field 'id' must be a non-empty string"),
    ],
)
def test_an_id_that_is_not_a_string_is_an_error_of_its_line(
    tmp_path: Path, ident: object, message: str
) -> None:
    scored, errors, rows = _score(tmp_path, _line(id="a", **GOOD) + _line(id=ident, **GOOD))
    assert (scored, errors) == (1, 1)
    assert "metrics" in rows[0] and "metrics" not in rows[1]
    assert message in rows[1]["error"] and "(line 2)" in rows[1]["error"]


def test_the_same_id_twice_is_an_error_of_both_lines(tmp_path: Path) -> None:
    text = _line(id="a", **GOOD) + _line(id="b", **GOOD) + _line(id="a", **GOOD)
    scored, errors, rows = _score(tmp_path, text)
    assert (scored, errors) == (1, 2)
    assert "metrics" in rows[1]
    for row in (rows[0], rows[2]):
        assert "metrics" not in row and "id 'a' is on lines 1, 3" in row["error"]


def test_line_numbers_are_the_files_blank_lines_and_all(tmp_path: Path) -> None:
    # a blank line, then a line without reference: it is line 3 of the file, not the 2nd line
    text = _line(id="a", **GOOD) + "\n" + _line(id="b", generation="x") + "  \n"
    text += _line(id="c", text="\u2028 is not a line break", **GOOD)
    _, errors, rows = _score(tmp_path, text)
    assert errors == 1 and len(rows) == 3
    assert "item b (line 3): missing field 'reference'" in rows[1]["error"]
    (tmp_path / "mine.jsonl").write_text(text + "\nnot json\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 7: not JSON"):
        score_file(registry.get("crud_rag"), tmp_path / "mine.jsonl", tmp_path / "o.jsonl")


def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path: Path) -> None:
    data = _line(id="a", **GOOD).encode() + b"\n" + b'{"id": "b", "generation": "\xff\xfe"}\n'
    with pytest.raises(DataError) as e:
        _score(tmp_path, data)
    assert e.value.file == str(tmp_path / "mine.jsonl") and e.value.line == 3
    assert "not valid UTF-8 (byte 0xff at column 28)" in str(e.value)
    assert not (tmp_path / "scored.jsonl").exists()


@pytest.mark.parametrize(
    "where", ["a folder", "under a file", "a read-only folder", "a pseudo file system"]
)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, where: str
) -> None:
    src = tmp_path / "mine.jsonl"
    src.write_text("not json: refused only if the input were read first\n", encoding="utf-8")
    if where == "a folder":
        out = tmp_path / "out"
        out.mkdir()
        match = "is a folder"
    elif where == "under a file":
        out = src / "scored.jsonl"
        match = "cannot write here"
    elif where == "a pseudo file system":
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc here")
        out = Path("/proc/lfbench-scored.jsonl")  # no file can be made there, even by root
        match = "cannot write in /proc"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = ro / "scored.jsonl"
        match = "cannot write in"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(DataError, match=match) as e:
        score_file(registry.get("crud_rag"), src, out)
    assert e.value.file == str(out)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no .tmp left behind


def test_lfbench_score_exits_non_zero_when_a_line_cannot_be_scored(tmp_path: Path) -> None:
    """As a linter does: any line with an error makes the exit status 3 (the output is still
    written, every line back); every line scored, 0. Before the fix it exited 0 either way."""
    import subprocess
    import sys

    lfbench = Path(sys.executable).parent / "lfbench"
    src, out = tmp_path / "mine.jsonl", tmp_path / "scored.jsonl"

    def run(text: str) -> subprocess.CompletedProcess[str]:
        src.write_text(text, encoding="utf-8")
        argv = ["score", "--benchmark", "crud_rag", "--input", str(src), "--out", str(out)]
        return subprocess.run([str(lfbench), *argv], capture_output=True, text=True)

    bad = run(_line(id="a", **GOOD) + _line(id="b", generation="", reference="x"))
    assert bad.returncode == 3, (bad.returncode, bad.stdout, bad.stderr)
    assert "1 scored, 1 with an error" in bad.stdout
    assert "error: 1 of 2 lines could not be scored" in bad.stderr
    assert "item b (line 2)" in bad.stderr and str(out) in bad.stderr
    rows = [json.loads(x) for x in out.read_text("utf-8").splitlines()]
    assert "metrics" in rows[0] and "empty output" in rows[1]["error"]

    good = run(_line(id="a", **GOOD))
    assert good.returncode == 0 and "1 scored, 0 with an error" in good.stdout, good.stderr
