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
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from functools import lru_cache

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


def segment_all(texts: Sequence[str]) -> None:
    """Segment many texts at once, on every core, for `words` to find (the same words: jieba
    on each text, as `words` would run it)."""
    from pipeline.core.parallel import fork_map

    todo = [t for t in dict.fromkeys(texts) if t not in _WORDS]
    if len(todo) >= _PARALLEL_FROM:
        _jieba()  # its dictionary loaded once, before the workers fork, not once in each
    _WORDS.update(zip(todo, fork_map(_segment, todo, min_items=_PARALLEL_FROM), strict=True))


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
