"""File helpers: atomic writes, canonical JSON, hashing, validated JSONL reading.

A stage writes only its declared outputs, and writes each one atomically (temporary file in the
same directory, fsync, rename), so a crash never leaves a half-written output that DVC or the
next stage could mistake for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from pipeline.core.errors import DataError, first_error

M = TypeVar("M", bound=BaseModel)


def canonical_json(obj: Any) -> str:
    """A stable JSON text: sorted keys, no spaces, UTF-8 kept. Used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: Path, algorithm: str = "md5") -> str:
    """Hex digest of a file's bytes (md5 is what DVC records for a file output)."""
    h = hashlib.new(algorithm)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The git blob id of a file (`git hash-object`), as pinned in SOURCES.md."""
    data = path.read_bytes()
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {len(data)}\0".encode())
    h.update(data)
    return h.hexdigest()


def _read_umask() -> int:
    mask = os.umask(
        0
    )  # read once, at import (single-threaded): umask can only be read by setting it
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically, with the mode a plain `open` would give (mkstemp's
    temporary file is 0600: an output left by a failed stage must still be readable by the
    team that shares the workspace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).chmod(0o666 & ~_UMASK)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_output(path: Path) -> None:
    """An output file can be written at `path`: not a folder, and the nearest folder that
    exists on its way is a folder a file can be made in (the missing folders are made when the
    output is written). Called before the work the output is for, so a bad path fails at once;
    it leaves nothing behind."""
    if path.is_dir():
        raise DataError("is a folder; name a file to write", file=str(path))
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise DataError(f"cannot write here: {parent} is a file, not a folder", file=str(path))
    try:  # a file made and removed at once: permissions, a read-only or pseudo file system
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".lfbench-probe.", suffix=".tmp")
        os.close(fd)
        Path(probe).unlink()
    except OSError as e:
        raise DataError(f"cannot write in {parent}: {e.strerror or e}", file=str(path)) from e


def check_output_dir(path: Path) -> None:
    """A folder outputs can be written in at `path` (made if missing): not a file, and the
    nearest folder on its way that exists can be written in. Called before the work."""
    if path.exists() and not path.is_dir():
        raise DataError("is a file, not a folder; name a folder to write in", file=str(path))
    check_output(path / ".lfbench-probe")


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_if_changed(path: Path, data: bytes) -> bool:
    """`data` into `path` atomically, unless the file holds exactly these bytes already (a
    process may be reading it: it keeps its file). Returns whether it wrote."""
    try:
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except OSError:
        pass
    atomic_write_bytes(path, data)
    return True


# A spreadsheet reads a cell starting with one of these as a formula (`=HYPERLINK(...)` in a model
# answer would run when the CSV is opened): such a cell is written with a leading ' (OWASP's
# advice against CSV injection), which `from_spreadsheet` takes off again.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def to_spreadsheet(cell: str) -> str:
    """A CSV cell that no spreadsheet runs as a formula: a leading ' before = + - @, a tab or a
    CR (also before a cell that already starts with such quotes, so it reads back unchanged)."""
    return "'" + cell if cell.lstrip("'").startswith(FORMULA_START) else cell


def from_spreadsheet(cell: str) -> str:
    """The value `to_spreadsheet` protected (a cell read back from the project's own CSV)."""
    return cell[1:] if cell.startswith("'") and cell.lstrip("'").startswith(FORMULA_START) else cell


def dumps_record(record: BaseModel | dict[str, Any]) -> str:
    payload = record.model_dump(mode="json") if isinstance(record, BaseModel) else record
    return json.dumps(payload, ensure_ascii=False, sort_keys=True)


def write_jsonl(path: Path, records: Iterable[BaseModel | dict[str, Any]]) -> int:
    """Write records as JSON lines, atomically. Returns the number of lines."""
    lines = [dumps_record(r) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def _bad_utf8(data: bytes, e: UnicodeDecodeError, file: str, first_line: int = 1) -> DataError:
    line = first_line + data.count(b"\n", 0, e.start)
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    return DataError(
        f"not valid UTF-8 (byte 0x{data[e.start]:02x} at column {column})", file=file, line=line
    )


def read_text(path: Path, shown: str | None = None) -> str:
    """A text input, decoded as UTF-8: bad bytes or an unreadable path (a folder, no permission)
    are a DataError naming the file (as `shown`, default the path) and the line, never a
    UnicodeDecodeError or OSError traceback."""
    file = str(path) if shown is None else shown
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise DataError("file not found", file=file) from e
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", file=file) from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad_utf8(data, e, file) from None


def iter_lines(path: Path, shown: str | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a text input, as the file counts them (split at
    newline bytes only: a U+2028 inside a JSON string does not end a line), decoded as UTF-8
    with the same errors as `read_text`."""
    file = str(path) if shown is None else shown
    try:
        f = path.open("rb")
    except FileNotFoundError as e:
        raise DataError("file not found", file=file) from e
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", file=file) from e
    with f:
        for lineno, raw in enumerate(f, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _bad_utf8(raw, e, file, lineno) from None


def read_json(path: Path) -> Any:
    if not path.exists():
        raise DataError("file not found", file=str(path))
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise DataError(
            f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", file=str(path)
        ) from e


def iter_jsonl(path: Path, model: type[M]) -> Iterator[M]:
    """Read a JSONL file of one record type, validating every line.

    Errors name the file, the line and the field, never a bare KeyError.
    """
    for _, record in iter_jsonl_lines(path, model):
        yield record


def read_jsonl_lines(path: Path, model: type[M]) -> tuple[list[M], list[str]]:
    """The records of a JSONL file and where each was read (`<file>:<line>`)."""
    records, wheres = [], []
    for where, record in iter_jsonl_lines(path, model):
        records.append(record)
        wheres.append(where)
    return records, wheres


def iter_jsonl_lines(path: Path, model: type[M]) -> Iterator[tuple[str, M]]:
    """`(<file>:<line>, record)` for every non-blank line (lines counted as in the file)."""
    if not path.exists():
        raise DataError("file not found", file=str(path))
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"not valid JSON ({e.msg})", file=f"{path}:{lineno}") from e
        try:
            record = model.model_validate(raw)
        except ValidationError as e:
            field, msg = first_error(e)
            item = raw.get("item_id") if isinstance(raw, dict) else None
            raise DataError(msg, file=f"{path}:{lineno}", item=item, field=field) from e
        yield f"{path}:{lineno}", record


def read_jsonl(path: Path, model: type[M]) -> list[M]:
    return list(iter_jsonl(path, model))
