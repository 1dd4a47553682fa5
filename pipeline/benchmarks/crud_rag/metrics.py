"""CRUD-RAG's reference-based text metrics, per output, as the authors define them.

Both texts are cut into jieba tokens (text.tokens: every token jieba gives, spaces and
punctuation included), then:

- BLEU: 4-gram, one reference, no smoothing: the geometric mean of the modified n-gram
  precisions (0 when one of them is 0) times the brevity penalty (exp(1 - r/c) when the output
  is not longer than the reference, else 1). `bleu` is BLEU without the brevity penalty, the
  number the authors report (their code divides it out); `bleu_bp` keeps it; `bleu1`..`bleu4`
  are the modified precisions. The n-gram counts are NLTK's (`modified_precision`,
  `brevity_penalty`).
- ROUGE-L: the F-measure of `rouge-score`'s rougeL on the jieba tokens.
- length: characters of the output.

An output that cannot be scored (empty, or no jieba token) raises `MetricError`: the item is
marked invalid with the reason, left out of the means and counted (the authors' code scores it
0). All values are in [0, 1]; the rows show them x100.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from pipeline.benchmarks.crud_rag import text as T
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core.benchmark import Embed
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.core.types import LOCAL_EMBEDDING_MODEL, EndpointConfig

METRICS = ("bleu", "bleu_bp", "bleu1", "bleu2", "bleu3", "bleu4", "rouge_l")
EMBEDDING = "embedding_sim"  # cosine similarity of output and reference embeddings
SHA = "crud_rag-text/1"  # the text judge's version (its judgements' judge_prompt_sha)
MAX_ORDER = 4


class MetricError(ValueError):
    """An output the metrics cannot score."""


class _JiebaTokenizer:
    """`rouge-score`'s tokenizer interface over jieba."""

    def tokenize(self, text: str) -> list[str]:
        return T.tokens(text)


@lru_cache(maxsize=1)
def _rouge() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_JiebaTokenizer())


def bleu(generation: list[str], reference: list[str]) -> dict[str, float]:
    from nltk.translate.bleu_score import brevity_penalty, modified_precision

    precisions = [
        float(modified_precision([reference], generation, n)) for n in range(1, MAX_ORDER + 1)
    ]
    geo = math.exp(sum(math.log(p) for p in precisions) / MAX_ORDER) if min(precisions) > 0 else 0.0
    bp = brevity_penalty(len(reference), len(generation))
    out = {"bleu": geo, "bleu_bp": geo * bp}
    out |= {f"bleu{n}": p for n, p in enumerate(precisions, start=1)}
    return out


def rouge_l(generation: str, reference: str) -> float:
    score = _rouge().score(reference, generation)["rougeL"]
    return float(score.fmeasure)


def text_metrics(generation: str, reference: str) -> dict[str, float]:
    """Every text metric of one output (MetricError when it cannot be scored)."""
    if not generation.strip():
        raise MetricError("empty output")
    gen, ref = T.tokens(generation), T.tokens(reference)
    if not ref:
        raise MetricError("empty reference")
    return {**bleu(gen, ref), "rouge_l": rouge_l(generation, reference), "length": len(generation)}


def embedding_label(choice: str | EndpointConfig | None) -> str | None:
    """Whose vectors the embedding similarity uses (shown beside it in rows and reports)."""
    if choice is None:
        return None
    if isinstance(choice, EndpointConfig):
        return f"{choice.model} at {choice.base_url}"
    return LOCAL_EMBEDDING_MODEL


def embedding_similarities(
    embed: Embed, gens: Sequence[Generation], items: Mapping[str, Item]
) -> dict[str, float]:
    """Cosine similarity of each output's and its reference's embeddings (generation id ->
    value); outputs with no text are left out (they are invalid items)."""
    scored = [g for g in gens if (g.text or "").strip()]
    texts = list(
        dict.fromkeys([items[g.item_id].reference for g in scored] + [g.text or "" for g in scored])
    )
    if not texts:
        return {}
    at = {t: i for i, t in enumerate(texts)}
    vectors = np.asarray(embed(texts), dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    out = {}
    for g in scored:
        a, b = at[g.text or ""], at[items[g.item_id].reference]
        denom = float(norms[a] * norms[b]) or 1.0
        out[g.generation_id] = float(vectors[a] @ vectors[b]) / denom
    return out


def judgement(
    gen: Generation,
    item: Item,
    judge: str,
    similarity: float | None = None,
    embedding_model: str | None = None,
) -> Judgement:
    """The text judge's verdicts on one output: one per metric (label = the value; the
    embedding similarity's raw names the embedding model)."""
    try:
        values = text_metrics(gen.text or "", item.reference)
        verdicts = [Verdict(target_id=k, label=repr(float(v))) for k, v in values.items()]
        if similarity is not None:
            verdicts.append(
                Verdict(target_id=EMBEDDING, label=repr(float(similarity)), raw=embedding_model)
            )
        status = "ok"
    except MetricError as e:
        verdicts = [Verdict(target_id="all", label="INVALID", status="invalid", raw=str(e))]
        status = "invalid"
    return Judgement.of("crud_rag", gen, judge, SHA, status, verdicts)
