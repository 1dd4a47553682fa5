"""Long²RAG generation: contexts for both settings of the paper, answers per model provider.

Settings (`long2rag.settings`):
- `long_context`: all the question's documents, whole, in dataset order (the paper's "N/A").
- `rag_<B>` (default 512, 1024, 2048): standard RAG. Each document is cut into chunks of
  `generation.chunk_tokens` cl100k_base tokens (default 128) with `chunk_overlap` (16) tokens
  shared by neighbours; all chunks of the question's documents are ranked against the question
  by BM25 (`chunk_ranker: bm25`, pipeline.retrieval.bm25) or MiniLM (`dense`); the best are taken
  until the next would pass B tokens (chunk lengths summed, overlaps counted twice, so the context
  never holds more than B document tokens). The chosen chunks are shown per document, in document
  order, adjacent chunks joined. (The paper's "trunk size" is a per-document character cut whose
  exact meaning it leaves open; this is the issue's chunk-and-pack reading.)

Every context shows documents as "Document <n>" blocks with their title when known.

Providers (one function per provider in `PROVIDERS`):
- `openai`: the prompt `prompts.generate` through `pipeline.llm` (cache + journal), answer length
  `generation.max_tokens` (null: the model entry's max_tokens).
- `long2rag-lead`: no model: the leading sentences of the context's documents taken in turn
  (sentence 1 of each document, then sentence 2, ...) up to `generation.max_words` words.
- `baseline` (pipeline/baselines.py, when present): `method` of the entry names a function
  (query, documents) -> text; its answer is cut to `generation.max_words` words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.benchmarks.long2rag.params import Long2ragGeneration, Long2ragParams
from pipeline.benchmarks.long2rag.schema import Question
from pipeline.core.benchmark import Planned
from pipeline.core.config import OpenAIModel, settings_for
from pipeline.core.errors import ConfigError
from pipeline.core.prompts import Prompt
from pipeline.core.records import Generation, generation_id
from pipeline.core.types import ChatRequest

LONG_CONTEXT = "long_context"
DOC_SEPARATOR = "\n\n"
CHUNK_JOIN = " [...] "


@dataclass(frozen=True)
class Chunk:
    doc_index: int
    start: int  # token offsets in the document
    end: int
    text: str


@dataclass(frozen=True)
class Context:
    setting: str
    documents: list[tuple[str, str | None, str]]  # (doc_id, title, text shown)
    n_tokens: int  # document tokens shown (chunk sums for RAG)
    chunks: list[tuple[str, int, int]]  # (doc_id, start, end) of RAG chunks, [] in long context

    def render(self) -> str:
        blocks = []
        for n, (_, title, text) in enumerate(self.documents, start=1):
            head = f"Document {n}" + (f": {title}" if title else "")
            blocks.append(f"{head}\n{text}")
        return DOC_SEPARATOR.join(blocks)


def rag_budget(setting: str) -> int | None:
    if setting == LONG_CONTEXT:
        return None
    m = re.fullmatch(r"rag_([1-9][0-9]*)(@.+)?", setting)
    if not m:
        raise ConfigError(f"long2rag.settings: unknown setting {setting!r}")
    return int(m.group(1))


def ranker_of(setting: str) -> str | None:
    """The retrievers entry of a `rag_<budget>@<entry>` setting (None: the chunk_ranker)."""
    _, at, name = setting.partition("@")
    return name if at else None


def chunk_id(c: Chunk) -> str:
    """A chunk as a passage of the retrieval stage: its document's place and token span."""
    return f"{c.doc_index}:{c.start}-{c.end}"


def question_chunks(q: Question, cfg: Long2ragGeneration) -> list[Chunk]:
    return [
        c
        for i, d in enumerate(q.documents)
        for c in chunk_document(i, d.text, cfg.chunk_tokens, cfg.chunk_overlap)
    ]


# A retrievers entry's ranking of a question's chunks (chunk ids, best first), by its name
RankOf = Callable[[str, Question], "list[str]"]


def no_ranking(name: str, q: Question) -> list[str]:
    raise ConfigError(f"long2rag: no rankings of retriever {name!r} were given")


def chunk_document(doc_index: int, text: str, size: int, overlap: int) -> list[Chunk]:
    """Consecutive windows of `size` tokens, each starting `size - overlap` after the last."""
    from pipeline.retrieval.tokens import get_encoding

    enc = get_encoding()
    ids = enc.encode_ordinary(text)
    step = size - overlap
    out = []
    start = 0
    while True:
        end = min(start + size, len(ids))
        out.append(Chunk(doc_index, start, end, enc.decode(ids[start:end])))
        if end >= len(ids):
            return out
        start += step


def _scores(query: str, texts: Sequence[str], ranker: str) -> list[float]:
    if ranker == "bm25":
        from pipeline.retrieval.bm25 import bm25_scores

        return bm25_scores(query, texts)
    from pipeline.retrieval.dense import dense_scores

    return dense_scores(query, texts, whole_document=False)


def build_context(
    q: Question, setting: str, cfg: Long2ragGeneration, rank_of: RankOf = no_ranking
) -> Context:
    budget = rag_budget(setting)
    if budget is None:
        from pipeline.retrieval.tokens import count_tokens_batch

        texts = [d.text for d in q.documents]
        return Context(
            setting,
            [(d.doc_id, d.title, d.text) for d in q.documents],
            sum(count_tokens_batch(texts)),
            [],
        )
    from pipeline.retrieval.tokens import get_encoding

    chunks = question_chunks(q, cfg)
    ranker = ranker_of(setting)
    if ranker is None:
        scores = _scores(q.question, [c.text for c in chunks], cfg.chunk_ranker)
        order = sorted(range(len(chunks)), key=lambda i: (-scores[i], i))
    else:
        index = {chunk_id(c): i for i, c in enumerate(chunks)}
        ranked = rank_of(ranker, q)
        unknown = [c for c in ranked if c not in index]
        if unknown:
            raise ConfigError(
                f"{q.item_id}: retriever {ranker!r} ranks chunks this question does not have"
                f" ({unknown[:3]}): its retrieval stage chunked with other settings"
            )
        order = [index[c] for c in ranked]
    chosen: list[Chunk] = []
    used = 0
    for i in order:
        n = chunks[i].end - chunks[i].start
        if used + n > budget:
            continue
        chosen.append(chunks[i])
        used += n
    enc = get_encoding()
    shown = []
    for di, d in enumerate(q.documents):
        spans = sorted((c.start, c.end) for c in chosen if c.doc_index == di)
        if not spans:
            continue
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        ids = enc.encode_ordinary(d.text)
        text = CHUNK_JOIN.join(enc.decode(ids[a:b]).strip() for a, b in merged)
        shown.append((d.doc_id, d.title, text))
    return Context(
        setting,
        shown,
        used,
        [(q.documents[c.doc_index].doc_id, c.start, c.end) for c in chosen],
    )


# ---------------------------------------------------------------- no-model answers

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def cut_words(text: str, max_words: int) -> str:
    words = text.split()
    return text if len(words) <= max_words else " ".join(words[:max_words])


def lead_answer(documents: Sequence[str], max_words: int) -> str:
    """Sentence 1 of every document, then sentence 2 of every document, ... up to max_words
    words (the sentence that would pass the limit is cut at it)."""
    per_doc = [sentences(d) for d in documents]
    out: list[str] = []
    n_words = 0
    for k in range(max((len(s) for s in per_doc), default=0)):
        for ss in per_doc:
            if k >= len(ss):
                continue
            words = ss[k].split()
            room = max_words - n_words
            if room <= 0:
                return " ".join(out)
            take = words[:room]
            out.append(" ".join(take))
            n_words += len(take)
    return " ".join(out)


AnswerFn = Callable[[Any, str, list[str], Long2ragGeneration], str]


def _lead(spec: Any, question: str, documents: list[str], cfg: Long2ragGeneration) -> str:
    return lead_answer(documents, cfg.max_words)


def _baseline(spec: Any, question: str, documents: list[str], cfg: Long2ragGeneration) -> str:
    """The project's no-model summarizers (pipeline/baselines.py, `kind` lead or extractive):
    sentences as bullets citing their document, cut to the generation length."""
    from pipeline import baselines

    fn = {"lead": baselines.lead, "extractive": baselines.extractive}.get(str(spec.kind))
    if fn is None:
        raise ConfigError(f"baseline kind {spec.kind!r} is not lead or extractive")
    docs = [baselines.Doc(i, text) for i, text in enumerate(documents, start=1)]
    # Enough sentences to fill the length limit; the cut keeps whole words.
    n = max(1, cfg.max_words // 5)
    return cut_words(fn(question, docs, n), cfg.max_words)


# Providers that answer without a model, in this process.
LOCAL_PROVIDERS: dict[str, AnswerFn] = {"long2rag-lead": _lead, "baseline": _baseline}


def render_prompt(prompt: Prompt, q: Question, ctx: Context) -> str:
    return prompt.render(question=q.question, documents=ctx.render())


def context_meta(ctx: Context) -> dict[str, Any]:
    return {
        "context_tokens": ctx.n_tokens,
        "context_docs": [d for d, _, _ in ctx.documents],
        "chunks": [list(c) for c in ctx.chunks],
    }


# ---------------------------------------------------------------- the stage's two paths


def settings_of(section: Long2ragParams, spec: object) -> list[str]:
    """The settings a model runs in: those of `long2rag.settings` its entry's `settings`
    picks (in the section's order), else all of them."""
    picked = settings_for(spec, "long2rag", section.settings)
    return [s for s in section.settings if s in picked] if picked else list(section.settings)


def contexts(
    section: Long2ragParams,
    dataset: Sequence[Question],
    rank_of: RankOf = no_ranking,
    settings: Sequence[str] | None = None,
) -> list[tuple[Question, Context]]:
    """Every (question, setting) context, in dataset order (`settings`: default, all)."""
    return [
        (q, build_context(q, s, section.generation, rank_of))
        for q in dataset
        for s in (section.settings if settings is None else settings)
    ]


def system_of(model: str, spec: Any) -> str:
    return str(getattr(spec, "system", None) or model)


def plan(
    section: Long2ragParams,
    model: str,
    spec: OpenAIModel,
    dataset: Sequence[Question],
    prompt: Prompt,
    rank_of: RankOf = no_ranking,
) -> list[Planned]:
    """One request per (question, setting), answer length `generation.max_tokens`."""
    system = system_of(model, spec)
    max_tokens = section.generation.max_tokens or spec.max_tokens
    out = []
    for q, ctx in contexts(section, dataset, rank_of, settings_of(section, spec)):
        request = ChatRequest(
            key=generation_id(q.item_id, system, ctx.setting, 0),
            messages=[{"role": "user", "content": render_prompt(prompt, q, ctx)}],
            prompt_sha=prompt.sha,
            max_tokens=section.generation.max_tokens,
        )
        meta = {
            **context_meta(ctx),
            "prompt": prompt.path,
            "prompt_sha": prompt.sha,
            "max_tokens": max_tokens,
        }
        out.append(Planned(request, q.item_id, system, ctx.setting, 0, meta))
    return out


def offline(
    section: Long2ragParams,
    model: str,
    spec: Any,
    dataset: Sequence[Question],
    rank_of: RankOf = no_ranking,
) -> list[Generation]:
    """The answers of a provider that needs no model (`LOCAL_PROVIDERS`)."""
    fn = LOCAL_PROVIDERS.get(spec.provider)
    if fn is None:
        raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run long2rag")
    system = system_of(model, spec)
    gens = []
    for q, ctx in contexts(section, dataset, rank_of, settings_of(section, spec)):
        text = fn(spec, q.question, [t for _, _, t in ctx.documents], section.generation)
        meta = {
            **context_meta(ctx),
            "prompt_sha": spec.provider,
            "max_words": section.generation.max_words,
        }
        gens.append(
            Generation.offline("long2rag", q.item_id, model, system, ctx.setting, text, meta)
        )
    return gens
