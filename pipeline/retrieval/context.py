"""The context a SummHay summarizer sees: which documents, in which order, within what budget.

Settings (`SETTINGS`):

* Full context (`FULL_SETTINGS`), the whole haystack, not truncated unless a budget is given:
  - `full`: haystack order (the paper's default, "Random", order);
  - `full-sort`: the documents relevant to the subtopic at the **top** (paper §5.4, Table 3
    "Top"; released name `fl-ctxt-sort`);
  - `full-rev-sort`: the relevant documents at the **bottom** (Table 3 "Bottom"; released
    `fl-ctxt-rev-sort`);
  - `full-middle`: the relevant documents in the **middle** (released `fl-ctxt-middle`; in the
    released data, not reported in the paper);
  - `full-shuffle`: the haystack in a random order drawn from `seed` (lfbench's addition, to
    measure position sensitivity against several random orders).
  A document is relevant when it holds at least one of the subtopic's insights (its oracle score,
  the number of the subtopic's insights it holds, is > 0). See `order_documents` for the order
  inside each group.
* Retrieval (`RETRIEVERS`): documents ranked by a retriever's scores, highest first, packed into
  a token budget (default 15,000 cl100k_base tokens, paper §5.1). The released scores
  (`RELEASED_RETRIEVERS`: random, vector, longembed, keywords, rerank3, oracle) are read from
  the subtopic; `bm25` and `dense` (`COMPUTED_RETRIEVERS`) are computed here on the query string
  `retrieval_query` (the subtopic's query and its subtopic text, as the released retriever
  scores were computed).

Order of a RAG context: the paper says the highest-scored documents up to 15k tokens are
selected but not in which order they are shown; the released code shows them in retrieval
order (descending score), which lfbench follows. Whatever the order, every document is shown
under its haystack position (`format_document`), so a citation `[i]` always names the document
at position i of the haystack.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.core.errors import LfbenchError
from pipeline.data.haystacks import Document, Haystack, Subtopic

DEFAULT_BUDGET_TOKENS = 15_000
FULL_SETTINGS = ("full", "full-sort", "full-rev-sort", "full-middle", "full-shuffle")
RELEASED_RETRIEVERS = ("random", "vector", "longembed", "keywords", "rerank3", "oracle")
COMPUTED_RETRIEVERS = ("bm25", "dense")
RETRIEVERS = RELEASED_RETRIEVERS + COMPUTED_RETRIEVERS
SETTINGS = FULL_SETTINGS + RETRIEVERS
SEPARATOR = "\n\n"


class TokenCounter(Protocol):
    """Counts and truncates text in some tokenizer's tokens (default: `tokens.CL100K`)."""

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, n: int) -> str: ...


DocFormatter = Callable[[int, str], str]


def format_document(position: int, text: str) -> str:
    """How a document appears in a context: its haystack position in brackets, then its text.

    >>> format_document(12, "Some news.")
    '[12]\\nSome news.'
    """
    return f"[{position}]\n{text}"


@dataclass(frozen=True)
class PackedDoc:
    """A document as placed in a context.

    `text` is the document's text, cut to fit the budget when `truncated`; `tokens` is the
    token count of the formatted document (header included, separator not).
    """

    position: int
    text: str
    tokens: int
    truncated: bool


@dataclass(frozen=True)
class Context:
    setting: str
    documents: list[PackedDoc]
    text: str
    n_tokens: int
    budget_tokens: int | None


# ------------------------------------------------------------------ relevance and ordering


def oracle_scores(haystack: Haystack, subtopic: Subtopic) -> list[int]:
    """For each document (in haystack order), how many of the subtopic's insights it holds."""
    own = {i.insight_id for i in subtopic.insights}
    return [sum(1 for i in d.insight_ids if i in own) for d in haystack.documents]


def order_documents(
    haystack: Haystack, subtopic: Subtopic, setting: str, seed: int = 0
) -> list[Document]:
    """The whole haystack in the order of a full-context setting.

    - `full`: haystack order.
    - `full-sort` (Top): relevant documents first, by oracle score descending, then the others.
    - `full-rev-sort` (Bottom): the others first, then the relevant documents by oracle score
      ascending (the most relevant document is last), i.e. the exact reverse criterion.
    - `full-middle`: the first half of the others (rounded down), the relevant documents by
      oracle score descending, then the rest of the others.
    - `full-shuffle`: a permutation drawn with `random.Random(seed)`.

    Equal oracle scores keep haystack order, and the documents that are not relevant always
    keep their haystack order (the released code sorts the whole haystack by oracle score,
    descending for Top and ascending for Bottom: a stable sort gives these orders).
    """
    docs = list(haystack.documents)
    if setting == "full":
        return docs
    if setting == "full-shuffle":
        random.Random(seed).shuffle(docs)
        return docs
    if setting not in FULL_SETTINGS:
        raise _unknown(setting, FULL_SETTINGS)
    score = dict(zip((d.position for d in docs), oracle_scores(haystack, subtopic), strict=True))
    relevant = [d for d in docs if score[d.position] > 0]
    others = [d for d in docs if score[d.position] == 0]
    if setting == "full-rev-sort":
        return others + sorted(relevant, key=lambda d: score[d.position])
    relevant.sort(key=lambda d: -score[d.position])
    if setting == "full-sort":
        return relevant + others
    half = len(others) // 2
    return others[:half] + relevant + others[half:]


def retrieval_query(subtopic: Subtopic) -> str:
    """The text the computed retrievers score documents against."""
    return f"{subtopic.query} {subtopic.subtopic}"


def retriever_scores(haystack: Haystack, subtopic: Subtopic, retriever: str) -> list[float]:
    """One score per document, in haystack order."""
    if retriever in RELEASED_RETRIEVERS:
        scores = subtopic.retriever_scores.get(retriever)
        if scores is None:
            have = ", ".join(sorted(subtopic.retriever_scores)) or "none"
            raise LfbenchError(
                f"item {subtopic.item_id}: no released {retriever!r} retriever scores "
                f"(it has: {have})"
            )
        if len(scores) != len(haystack.documents):
            raise LfbenchError(
                f"item {subtopic.item_id}: {len(scores)} {retriever!r} scores for "
                f"{len(haystack.documents)} documents"
            )
        return list(scores)
    texts = [d.text for d in haystack.documents]
    if retriever == "bm25":
        from pipeline.retrieval.bm25 import bm25_scores

        return bm25_scores(retrieval_query(subtopic), texts)
    if retriever == "dense":
        from pipeline.retrieval.dense import dense_scores

        return dense_scores(retrieval_query(subtopic), texts)
    raise _unknown(retriever, RETRIEVERS)


def rank_documents(haystack: Haystack, subtopic: Subtopic, retriever: str) -> list[Document]:
    """All documents by descending retriever score; equal scores keep haystack order."""
    scores = retriever_scores(haystack, subtopic, retriever)
    ranked = sorted(
        zip(scores, haystack.documents, strict=True), key=lambda p: (-p[0], p[1].position)
    )
    return [d for _, d in ranked]


# ------------------------------------------------------------------ packing


def _default_counter() -> TokenCounter:
    from pipeline.retrieval.tokens import CL100K

    return CL100K


def pack(
    documents: Sequence[Document],
    budget_tokens: int | None = DEFAULT_BUDGET_TOKENS,
    counter: TokenCounter | None = None,
    *,
    fmt: DocFormatter = format_document,
) -> list[PackedDoc]:
    """Take `documents` in the given order while they fit in `budget_tokens`.

    Each document costs the tokens of `fmt(position, text)` plus, from the second document on,
    the tokens of `SEPARATOR`. The first document that does not fit whole is truncated to the
    tokens left (header and separator included) and is the last one taken; if not even one
    token of its text fits, it is left out. `budget_tokens=None` takes every document whole.
    The context text, `SEPARATOR.join` of the formatted documents, then has at most
    `budget_tokens` tokens (token counts of concatenated texts can only be smaller than the
    sum of the parts, except in rare BPE cases that `build_context` checks for).
    """
    if budget_tokens is not None and budget_tokens < 0:
        raise ValueError(f"negative token budget {budget_tokens}")
    counter = counter or _default_counter()
    sep_tokens = counter.count(SEPARATOR)
    out: list[PackedDoc] = []
    used = 0
    for doc in documents:
        sep = sep_tokens if out else 0
        n = counter.count(fmt(doc.position, doc.text))
        if budget_tokens is None or used + sep + n <= budget_tokens:
            out.append(PackedDoc(doc.position, doc.text, n, truncated=False))
            used += sep + n
            continue
        left = budget_tokens - used - sep
        cut = _truncate_to_fit(doc, left, counter, fmt)
        if cut is not None:
            out.append(cut)
        break
    return out


def _truncate_to_fit(
    doc: Document, left: int, counter: TokenCounter, fmt: DocFormatter
) -> PackedDoc | None:
    """`doc` cut so that its formatted text has at most `left` tokens, or None if no text fits."""
    header = counter.count(fmt(doc.position, ""))
    n_text = left - header
    while n_text > 0:
        text = counter.truncate(doc.text, n_text)
        n = counter.count(fmt(doc.position, text))
        if text and n <= left:
            return PackedDoc(doc.position, text, n, truncated=True)
        n_text -= max(1, n - left)
    return None


def render(documents: Sequence[PackedDoc], fmt: DocFormatter = format_document) -> str:
    return SEPARATOR.join(fmt(d.position, d.text) for d in documents)


# ------------------------------------------------------------------ dispatch


def build_context(
    haystack: Haystack,
    subtopic: Subtopic,
    setting: str,
    *,
    budget_tokens: int | None = None,
    seed: int = 0,
    counter: TokenCounter | None = None,
    fmt: DocFormatter = format_document,
    ranking: Sequence[int] | None = None,
) -> Context:
    """The context of `setting` for one subtopic.

    `budget_tokens=None` means the setting's default: no limit for the full-context settings,
    `DEFAULT_BUDGET_TOKENS` (15,000) for the retrievers. An explicit budget applies to both.
    `ranking`: the document positions, best first, of a retriever of the user's (its retrieval
    stage's output), packed as the project's retrievers are; documents it leaves out are not
    shown.
    """
    if ranking is not None:
        by_position = {d.position: d for d in haystack.documents}
        unknown = [p for p in ranking if p not in by_position]
        if unknown:
            raise LfbenchError(
                f"item {subtopic.item_id}: the {setting!r} ranking names documents the haystack"
                f" lacks: {unknown[:5]}"
            )
        docs = [by_position[p] for p in ranking]
        budget: int | None = DEFAULT_BUDGET_TOKENS if budget_tokens is None else budget_tokens
    elif setting in FULL_SETTINGS:
        docs = order_documents(haystack, subtopic, setting, seed)
        budget = budget_tokens
    elif setting in RETRIEVERS:
        docs = rank_documents(haystack, subtopic, setting)
        budget = DEFAULT_BUDGET_TOKENS if budget_tokens is None else budget_tokens
    else:
        raise _unknown(setting, SETTINGS)
    counter = counter or _default_counter()
    packed = pack(docs, budget, counter, fmt=fmt)
    text = render(packed, fmt)
    n_tokens = counter.count(text)
    while budget is not None and n_tokens > budget and packed:
        # The parts fit but their concatenation does not (BPE merges across a boundary in the
        # wrong direction): shorten the last document by the excess and re-check.
        last = packed[-1]
        cut = _truncate_to_fit(
            Document(position=last.position, document_id="", text=last.text, insight_ids=[]),
            last.tokens - (n_tokens - budget),
            counter,
            fmt,
        )
        packed = packed[:-1] + ([cut] if cut else [])
        text = render(packed, fmt)
        n_tokens = counter.count(text)
    return Context(setting, packed, text, n_tokens, budget)


def _unknown(setting: str, known: Sequence[str]) -> LfbenchError:
    return LfbenchError(f"unknown context setting {setting!r}; known: {', '.join(known)}")
