"""BM25 relevance of documents to a query (lfbench's own `bm25` retriever).

Scoring is done by `bm25s` with Lucene's BM25 variant (k1 = 1.5, b = 0.75, idf =
log(1 + (N - df + 0.5) / (df + 0.5)), so never negative), the statistics being those of the
documents passed in (for SummHay: the ~100 documents of one haystack).

Tokenisation (`tokenize`) is deliberately simple and documented here so it can be reproduced:
lower-case the text, take the maximal runs of letters and digits (Unicode-aware; the regex
`[^\\W_]+`, so "COVID-19's" -> "covid", "19", "s"), and drop the tokens in `STOPWORDS`, a
short English stopword list kept in this module. No stemming.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

K1 = 1.5
B = 0.75
METHOD = "lucene"

_WORD = re.compile(r"[^\W_]+")

_STOPWORD_TEXT = """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves s t d ll m re ve
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def tokenize(text: str, *, stopwords: bool = True) -> list[str]:
    """Lower-cased word tokens of `text`, without stopwords unless `stopwords` is False."""
    tokens = _WORD.findall(text.lower())
    if stopwords:
        return [t for t in tokens if t not in STOPWORDS]
    return tokens


def bm25_scores(query: str, docs: Sequence[str], *, stopwords: bool = True) -> list[float]:
    """BM25 score of each of `docs` for `query`, aligned with `docs` (0.0 where no term matches).

    >>> s = bm25_scores("solar panels", ["wind farms at sea", "cheap solar panels", "panels"])
    >>> s[1] > s[2] > s[0] == 0.0
    True
    """
    if not docs:
        return []
    key = (tuple(docs), stopwords)
    vocab = _corpus(*key)[1]
    query_tokens = [t for t in tokenize(query, stopwords=stopwords) if t in vocab]
    if not query_tokens:
        return [0.0] * len(docs)
    scores = _retriever(*key).get_scores(query_tokens)
    return [float(s) for s in scores]


# The same documents are scored for many queries (a SummHay haystack's ~100 documents for each
# of its subtopics and settings): each set is tokenised and indexed once per process. An index
# is only read by `get_scores`, so the scores are those of a fresh index.


@lru_cache(maxsize=16)
def _corpus(docs: tuple[str, ...], stopwords: bool) -> tuple[list[list[str]], frozenset[str]]:
    corpus = [tokenize(d, stopwords=stopwords) for d in docs]
    return corpus, frozenset(t for doc in corpus for t in doc)


@lru_cache(maxsize=16)
def _retriever(docs: tuple[str, ...], stopwords: bool) -> Any:
    import bm25s  # type: ignore[import-untyped]  # here: it loads scipy.sparse (half a second)

    retriever = bm25s.BM25(k1=K1, b=B, method=METHOD)
    retriever.index(_corpus(docs, stopwords)[0], show_progress=False)
    return retriever
