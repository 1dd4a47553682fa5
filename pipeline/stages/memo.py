"""Finished results of the user's own code (a python retriever's rankings, a python RAG
system's answers), kept like a model's answers: in the stage's journal (appended and fsync'd as
each finishes: a kill loses none) and in the response cache (a re-run of the stage, forced or
because another file of `inputs/` changed, calls the code only for what it never finished).

Keys digest the code (every .py file of its folder), the entry's settings and the input, so
an edit to the code computes everything again."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from pipeline.core.io import canonical_json, sha256_text
from pipeline.llm.cache import CachedAnswer, ResponseCache, backend_for
from pipeline.llm.journal import JournalEntry, JournalWriter, load_journal
from pipeline.stages.common import llm_paths


def memo_key(kind: str, *parts: object) -> str:
    return sha256_text(canonical_json({"v": 1, "kind": kind, "parts": list(parts)}))


class Memo:
    def __init__(self, root: Path, stage: str) -> None:
        cache_path, self.journal_path = llm_paths(root, stage)
        self.journal = load_journal(self.journal_path)
        backend = backend_for(cache_path)
        self.cache = ResponseCache(backend=backend) if backend is not None else None
        self.writer: JournalWriter | None = None
        self.journal_hits = self.cache_hits = 0

    def get_many(self, keys: Iterable[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(keys))
        found = {k: self.journal[k].text for k in wanted if k in self.journal}
        self.journal_hits += len(found)
        if self.cache is not None:
            cached = self.cache.get_many([k for k in wanted if k not in found])
            self.cache_hits += len(cached)
            found |= {k: a.text for k, a in cached.items()}
        return found

    def put(self, key: str, label: str, text: str) -> None:
        if self.writer is None:
            self.writer = JournalWriter(self.journal_path)
        self.writer.append(JournalEntry(key, label, text, None, 0, 0))
        if self.cache is not None:
            self.cache.put(CachedAnswer(key, text, None, 0, 0))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.cache is not None:
            self.cache.close()

    def __enter__(self) -> Memo:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
