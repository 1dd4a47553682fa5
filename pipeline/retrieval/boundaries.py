"""Where the windows of a long text begin, for an encoder with a short input: one rule for the
dense retriever's word pieces (`pipeline.retrieval.dense`) and for the text windows an
embedding server is sent (`pipeline.retrieval.windows`), so both embed the same windows."""

from __future__ import annotations

from collections.abc import Sequence


def window_starts(n: int, size: int, words: Sequence[int | None] | None = None) -> list[int]:
    """Where each of the consecutive windows of at most `size` of `n` tokens begins. Given each
    token's word, a window begins at a word's first token (a word longer than `size` is cut)."""
    starts = [0]
    while starts[-1] + size < n:
        s = e = starts[-1] + size
        if words is not None:
            while e > starts[-1] and words[e] is not None and words[e] == words[e - 1]:
                e -= 1
            if e == starts[-1]:
                e = s
        starts.append(e)
    return starts
