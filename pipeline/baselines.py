"""Summarizers that need no model: lower bounds for any benchmark of (query, documents) -> text.

Both return bullet points, one sentence each, that cite the documents the sentence comes from as
`[i]` (the document's id, e.g. its position in a SummHay haystack):

- :func:`lead`: the first sentence of each document, in the order given (the context order),
  then the second sentences, and so on, until `n` bullets.
- :func:`extractive`: the sentences most relevant to the query by BM25 over all sentences of
  the documents, skipping near-duplicates of a sentence already taken (content-word Jaccard
  >= `max_overlap`); a sentence found (near-)verbatim in several documents cites them all.

Sentence splitting (:func:`split_sentences`) is a small rule-based splitter: a sentence ends at
., ! or ? followed by whitespace and an upper-case letter, digit or quote, unless the word
before the period is a known abbreviation or a single capital letter; line breaks always end a
sentence. Sentences shorter than `min_words` words are not used.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.retrieval.bm25 import bm25_scores, tokenize

ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "inc",
        "ltd",
        "co",
        "corp",
        "no",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "u.s",
        "e.g",
        "i.e",
    ]
)
_BOUNDARY = re.compile(r"([.!?][\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")


@dataclass(frozen=True)
class Doc:
    """A document as a baseline sees it: the id a bullet cites and its text."""

    doc_id: int
    text: str


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` (see the module docstring), stripped, empty ones dropped."""
    out: list[str] = []
    for line in text.splitlines():
        start = 0
        for m in _BOUNDARY.finditer(line):
            before = line[start : m.start() + 1].rstrip()
            last = before.rsplit(None, 1)[-1].rstrip(".").lower() if before.split() else ""
            if last in ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
                continue
            out.append(line[start : m.end(1)].strip())
            start = m.end()
        out.append(line[start:].strip())
    return [s for s in out if s]


def _bullet(sentence: str, doc_ids: Sequence[int]) -> str:
    return f"- {sentence} " + "".join(f"[{d}]" for d in doc_ids)


def lead(query: str, documents: Sequence[Doc], n: int, *, min_words: int = 5) -> str:
    """Leading sentences of the documents in the given order (the query is not used)."""
    del query
    per_doc = [
        [s for s in split_sentences(d.text) if len(s.split()) >= min_words] for d in documents
    ]
    bullets: list[str] = []
    depth = 0
    while len(bullets) < n and any(depth < len(s) for s in per_doc):
        for d, sents in zip(documents, per_doc, strict=True):
            if depth < len(sents) and len(bullets) < n:
                bullets.append(_bullet(sents[depth], [d.doc_id]))
        depth += 1
    return "\n".join(bullets)


def _jaccard(a: set[str], b: set[str]) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def extractive(
    query: str,
    documents: Sequence[Doc],
    n: int,
    *,
    min_words: int = 5,
    max_overlap: float = 0.6,
) -> str:
    """The `n` sentences most relevant to `query` (BM25), near-duplicates merged into one
    bullet citing every document that holds them."""
    sentences: list[tuple[str, int]] = []
    for d in documents:
        sentences.extend(
            (s, d.doc_id) for s in split_sentences(d.text) if len(s.split()) >= min_words
        )
    if not sentences:
        return ""
    scores = bm25_scores(query, [s for s, _ in sentences])
    order = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
    words = [set(tokenize(s)) for s, _ in sentences]
    chosen: list[int] = []
    for i in order:
        if len(chosen) == n:
            break
        if all(_jaccard(words[i], words[j]) < max_overlap for j in chosen):
            chosen.append(i)
    bullets = []
    for i in chosen:
        cites = sorted(
            {
                sentences[j][1]
                for j in range(len(sentences))
                if _jaccard(words[i], words[j]) >= max_overlap
            }
        )
        bullets.append(_bullet(sentences[i][0], cites))
    return "\n".join(bullets)
