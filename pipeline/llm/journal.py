"""Resumable journal of finished items: a JSONL file, one line per successful answer.

Each line is written, flushed and fsync'd as soon as its item finishes (by a writer thread, so the
event loop does not wait for the disk). A run that is killed leaves the journal behind; the next
run loads it and does not send those items again. A torn last line (SIGKILL mid-write) is
ignored and cut off before appending. The caller deletes the journal (:func:`clear_journal`)
once it has written its outputs.

Every line carries a SHA-256 of its content (``checksum``, as cache entries do), checked on read:
a line that fails it (edited on disk) is refused, counted (``journal_corrupt`` in the usage
report), warned about once per journal, and its request fetched again. A journal written before
lines carried checksums (no line has one) is checksummed on read: its entries are taken as they
are and the file is rewritten with checksums (one log line), so lines appended later never mix
with unchecked ones; in a journal where lines carry checksums, a line without one is refused
like an edited line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("lfbench.llm")


@dataclass(frozen=True)
class JournalEntry:
    cache_key: str
    key: str
    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int


def checksum(e: JournalEntry) -> str:
    """SHA-256 of an entry's content (every field, in a fixed JSON form)."""
    body = json.dumps(
        [e.cache_key, e.key, e.text, e.finish_reason, e.input_tokens, e.output_tokens],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def _line(e: JournalEntry) -> str:
    """One JSON line (keys sorted), without dataclasses.asdict's deep copy."""
    obj = {
        "cache_key": e.cache_key,
        "checksum": checksum(e),
        "finish_reason": e.finish_reason,
        "input_tokens": e.input_tokens,
        "key": e.key,
        "output_tokens": e.output_tokens,
        "text": e.text,
    }
    return json.dumps(obj, ensure_ascii=False) + "\n"


def clear_journal(path: Path) -> None:
    """Delete a journal (after the caller has written the outputs it covers)."""
    path.unlink(missing_ok=True)


class Journal(dict[str, JournalEntry]):
    """The entries of a journal by cache key, and the lines refused (`corrupt`)."""

    corrupt: int = 0


def load_journal(path: Path) -> Journal:
    """Entries by cache key that pass their checksum; unreadable lines (a torn last line) are
    skipped, lines that fail their checksum are refused and counted (one warning)."""
    out = Journal()
    if not path.exists():
        return out
    entries: list[tuple[int, JournalEntry, str | None]] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                d: Any = json.loads(raw)
                entry = JournalEntry(
                    cache_key=str(d["cache_key"]),
                    key=str(d["key"]),
                    text=str(d["text"]),
                    finish_reason=None
                    if d.get("finish_reason") is None
                    else str(d["finish_reason"]),
                    input_tokens=int(d.get("input_tokens", 0)),
                    output_tokens=int(d.get("output_tokens", 0)),
                )
                stored = d.get("checksum")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            entries.append((lineno, entry, None if stored is None else str(stored)))
    legacy = bool(entries) and all(stored is None for _, _, stored in entries)
    if legacy:
        log.info(
            "journal %s: %d entries written before journal lines carried checksums:"
            " checksummed now",
            path,
            len(entries),
        )
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            f.write("".join(_line(e) for _, e, _ in entries).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    bad: list[tuple[int, JournalEntry]] = []
    for lineno, entry, stored in entries:
        if not legacy and stored != checksum(entry):
            bad.append((lineno, entry))
        else:
            out[entry.cache_key] = entry
    # a refused line whose answer was fetched again later (a valid line) is no longer missing
    bad = [(n, e) for n, e in bad if e.cache_key not in out]
    if bad:
        out.corrupt = len({e.cache_key for _, e in bad})
        lineno, first = bad[0]
        log.warning(
            "journal %s: %d entries fail their checksum (first: line %d, item %s): refused, they"
            " will be fetched again",
            path,
            len(bad),
            lineno,
            first.key,
        )
    return out


def _cut_torn_tail(path: Path) -> None:
    """Truncate a last line that has no newline (it was torn by a kill)."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        block = 4096
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(start + nl + 1)
                return
            pos = start
        f.truncate(0)


class JournalWriter:
    """Appends entries from a writer thread: write, flush and fsync (grouped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(path)
        self._f: IO[bytes] = path.open("ab")
        self._queue: queue.SimpleQueue[JournalEntry | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="lfbench-llm-journal", daemon=True)
        self._thread.start()
        self.errors = 0

    def append(self, entry: JournalEntry) -> None:
        self._queue.put(entry)

    def _loop(self) -> None:
        """Group commit: take every entry queued so far, write them, fsync once. An entry is
        durable when the fsync after it returns; entries that finish together share it."""
        fd = self._f.fileno()
        done = False
        while not done:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                done = True
            lines = [_line(e) for e in batch if e is not None]
            if not lines:
                continue
            try:
                self._f.write("".join(lines).encode("utf-8"))
                self._f.flush()
                os.fsync(fd)
            except OSError as e:
                self.errors += len(lines)
                log.warning("journal %s: could not append %d entries: %s", self.path, len(lines), e)

    def close(self) -> None:
        """Finish the queued writes and close (blocking)."""
        self._queue.put(None)
        self._thread.join()
        self._f.close()
