"""Resumable journal of finished items: a JSONL file, one line per successful answer.

Each line is written, flushed and fsync'd as soon as its item finishes (by a writer thread, so the
event loop does not wait for the disk). A run that is killed leaves the journal behind; the next
run loads it and does not send those items again. A torn last line (SIGKILL mid-write) is
ignored and cut off before appending. The caller deletes the journal (:func:`clear_journal`)
once it has written its outputs.
"""

from __future__ import annotations

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


def _line(e: JournalEntry) -> str:
    """One JSON line (keys sorted), without dataclasses.asdict's deep copy."""
    obj = {
        "cache_key": e.cache_key,
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


def load_journal(path: Path) -> dict[str, JournalEntry]:
    """Entries by cache key; unreadable lines (a torn last line) are skipped."""
    out: dict[str, JournalEntry] = {}
    if not path.exists():
        return out
    with path.open("rb") as f:
        for raw in f:
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
            except (ValueError, KeyError, TypeError):
                continue
            out[entry.cache_key] = entry
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
