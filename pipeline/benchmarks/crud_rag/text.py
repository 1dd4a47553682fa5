"""Chinese text: jieba tokens, sentences, and the chunking of the retrieval corpus.

- `tokens(text)`: jieba's default (accurate) mode, every token as jieba gives it, spaces and
  punctuation included: what BLEU and ROUGE-L count (as the authors' metrics do).
- `words(text)`: the tokens BM25 indexes: jieba tokens without whitespace and punctuation,
  lower-cased.
- `sentences(text)`: a sentence ends at 。！？；!?; or a line break (closing quotes and
  brackets stay with it).
- `chunks(text, size, overlap)`: a document cut into chunks of at most `size` cl100k_base tokens,
  whole sentences packed in order (a longer sentence is cut by characters), each chunk starting
  with the last sentences of the previous one that fit in `overlap` tokens. Documents are
  chunked one at a time (a chunk never spans two news items).

Segmenting the corpus is most of what building an index costs (about 8 CPU-seconds for the
1,328 released records' news, two chunkings), and every generate stage (one per model) and
retrieval stage builds the same indexes. So `segment_all` keeps each text's words in
`.lfbench/cache/crud_rag-segments.sqlite` (or the file `LFBENCH_SEGMENT_CACHE` names, to share it
between copies of a project), keyed by the SHA-256 of jieba's version, this module's source and
the text: a pure function of those, so a cached segmentation is the one jieba would give.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

ENV_SEGMENT_CACHE = "LFBENCH_SEGMENT_CACHE"
_SCAN = 500  # keys per SQL query

_SENTENCE = re.compile(r"[^。！？；!?;\n]*(?:[。！？；!?;]+[”’」』）)\]]*|\n|$)")


@lru_cache(maxsize=1)
def _jieba() -> object:
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def tokens(text: str) -> list[str]:
    """jieba tokens of `text`, exactly as `jieba.lcut` gives them."""
    return list(_tokens(text))


@lru_cache(maxsize=20_000)
def _tokens(text: str) -> tuple[str, ...]:
    """Each text is cut once (ROUGE-L and BLEU both tokenise the output and the reference)."""
    return _cut(text)


def _cut(text: str) -> tuple[str, ...]:
    jieba = _jieba()
    return tuple(jieba.lcut(text))  # type: ignore[attr-defined]


_WORD = re.compile(r"\w")


_WORDS: dict[str, tuple[str, ...]] = {}  # text -> its words: each text is segmented once
_PARALLEL_FROM = 2000  # texts: fewer are segmented in this process


def _segment(text: str) -> tuple[str, ...]:
    # cut directly: the corpus's tens of thousands of pieces, memoised in `_WORDS`, would only
    # push the metrics' texts out of `_tokens`' cache
    return tuple(t.lower() for t in _cut(text) if _WORD.search(t))


def words(text: str) -> list[str]:
    """The tokens BM25 indexes: no whitespace or punctuation, lower-cased (memoised: a
    corpus's sentences are segmented once per process)."""
    done = _WORDS.get(text)
    if done is None:
        done = _WORDS[text] = _segment(text)
    return list(done)


def segment_all(texts: Sequence[str], cache: Path | None = None) -> None:
    """Segment many texts at once, on every core, for `words` to find (the same words: jieba
    on each text, as `words` would run it); those segmented before are read from the segment
    cache (`cache`, default `segment_cache_path()`), the others stored there."""
    from pipeline.core.parallel import fork_map

    todo = [t for t in dict.fromkeys(texts) if t not in _WORDS]
    if not todo:
        return
    store = _SegmentCache.open(cache or segment_cache_path())
    try:
        if store is not None:
            found = store.get_many(todo)
            _WORDS.update(found)
            todo = [t for t in todo if t not in found]
        if len(todo) >= _PARALLEL_FROM:
            _jieba()  # its dictionary loaded once, before the workers fork, not once in each
        done = fork_map(_segment, todo, min_items=_PARALLEL_FROM)
        _WORDS.update(zip(todo, done, strict=True))
        if store is not None and todo:
            store.put_many(zip(todo, done, strict=True))
    finally:
        if store is not None:
            store.close()


def segment_cache_path() -> Path:
    """`.lfbench/cache/crud_rag-segments.sqlite` of the project (the working folder of a
    stage), or the file $LFBENCH_SEGMENT_CACHE names."""
    override = os.environ.get(ENV_SEGMENT_CACHE)
    if override:
        return Path(override)
    return Path.cwd() / ".lfbench" / "cache" / "crud_rag-segments.sqlite"


@lru_cache(maxsize=1)
def segmenter_id() -> str:
    """What a text's words depend on besides the text: jieba's version (its dictionary ships
    with it) and this module's source (the rules of `_segment`)."""
    from importlib.metadata import version

    source = Path(__file__).read_bytes()
    return hashlib.sha256(f"jieba={version('jieba')}\0".encode() + source).hexdigest()


class _SegmentCache:
    """Texts' words, keyed by SHA-256 of `segmenter_id()` and the text, in one SQLite file
    that concurrent stages share (a text segmented twice at once stores the same words)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._prefix = f"{segmenter_id()}\0".encode()

    @classmethod
    def open(cls, path: Path) -> _SegmentCache | None:
        """The cache at `path`, or None (segment without it) when it cannot be opened."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS words (key BLOB PRIMARY KEY, words TEXT NOT NULL)"
            )
        except (OSError, sqlite3.Error) as e:
            log.warning("segment cache %s not used: %s", path, e)
            return None
        return cls(conn)

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(self._prefix + text.encode()).digest()

    def get_many(self, texts: Sequence[str]) -> dict[str, tuple[str, ...]]:
        by_key = {self._key(t): t for t in texts}
        keys = list(by_key)
        found: dict[str, tuple[str, ...]] = {}
        for start in range(0, len(keys), _SCAN):
            chunk = keys[start : start + _SCAN]
            marks = ",".join("?" * len(chunk))
            for key, words in self._conn.execute(
                f"SELECT key, words FROM words WHERE key IN ({marks})", chunk
            ):
                found[by_key[key]] = tuple(json.loads(words))
        return found

    def put_many(self, items: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        rows = [(self._key(t), json.dumps(list(w), ensure_ascii=False)) for t, w in items]
        try:
            self._conn.execute("BEGIN")
            self._conn.executemany("INSERT OR IGNORE INTO words (key, words) VALUES (?, ?)", rows)
            self._conn.execute("COMMIT")
        except sqlite3.Error as e:  # a full disk, a read-only copy: the words are still here
            log.warning("segment cache: %d texts not stored: %s", len(rows), e)
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def close(self) -> None:
        self._conn.close()


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


def chunks(text: str, size: int, overlap: int, count: Callable[[str], int]) -> list[list[str]]:
    """`text` cut into chunks of at most `size` tokens (by `count`), overlapping by up to
    `overlap` tokens of whole sentences: each chunk as its pieces (sentences, or parts of a
    sentence longer than a chunk), to be joined with no separator."""
    pieces: list[tuple[str, int]] = []
    for s in sentences(text):
        n = count(s)
        if n <= size:
            pieces.append((s, n))
            continue
        # a sentence longer than a chunk: cut it by characters
        step = max(1, len(s) * size // n)
        for i in range(0, len(s), step):
            part = s[i : i + step]
            pieces.append((part, count(part)))
    out: list[list[str]] = []
    cur: list[tuple[str, int]] = []
    total = 0
    for piece in pieces:
        if cur and total + piece[1] > size:
            out.append([p for p, _ in cur])
            carried: list[tuple[str, int]] = []
            kept = 0
            for p in reversed(cur):
                if kept + p[1] > overlap or kept + p[1] + piece[1] > size:
                    break
                carried.insert(0, p)
                kept += p[1]
            cur, total = carried, kept
        cur.append(piece)
        total += piece[1]
    if cur:
        out.append([p for p, _ in cur])
    return out


def join_context(texts: Sequence[str]) -> str:
    return "\n\n".join(texts)
