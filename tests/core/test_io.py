"""Text inputs decode as UTF-8 with an error naming file and line (issue 26, point 7): every
reader of the core and the stage layer's Inputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.config import load_yaml
from pipeline.core.errors import ConfigError, DataError, LfbenchError
from pipeline.core.io import read_json, read_jsonl, read_text
from pipeline.core.prompts import load_prompt
from pipeline.core.records import Generation
from pipeline.stages.common import FileInputs

BAD = b'\n  \n{"b": "caf\xe9"}\n'  # line 3 is Latin-1 (lines 1 and 2 blank)


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        (lambda p: read_text(p), DataError),
        (lambda p: read_json(p), DataError),
        (lambda p: read_jsonl(p, Generation), DataError),
        (lambda p: FileInputs(p.parent).text(p.name), DataError),
        (lambda p: FileInputs(p.parent).json(p.name), DataError),
        (lambda p: FileInputs(p.parent).jsonl(p.name), DataError),
        (lambda p: load_yaml(p), ConfigError),
        (lambda p: load_prompt(p), ConfigError),
    ],
)
def test_bytes_that_are_not_utf8_are_an_error_naming_file_and_line(
    tmp_path: Path, read: Callable[[Path], Any], kind: type[LfbenchError]
) -> None:
    path = tmp_path / "input.txt"
    path.write_bytes(BAD)
    with pytest.raises(kind) as e:
        read(path)
    assert "input.txt" in str(e.value) and "line 3" in str(e.value)
    assert "not valid UTF-8 (byte 0xe9 at column 11)" in str(e.value)


def test_a_folder_given_as_a_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read"):
        read_text(tmp_path)
