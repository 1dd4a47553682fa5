"""The `long2rag:` section of params.yaml, and the providers Long²RAG defines itself."""

from __future__ import annotations

import itertools
import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipeline.core.config import (
    BenchmarkParams,
    ModelSettings,
    OwnedJudge,
    OwnedModel,
    PromptFiles,
    Strict,
    no_repeats,
)
from pipeline.data.haystacks import HaystackSelection

PROMPTS = "pipeline/benchmarks/long2rag/prompts"
# rag_<budget>, or rag_<budget>@<retriever>: the chunks ranked by a retrievers entry of yours
SETTING_RE = re.compile(r"^(long_context|rag_[1-9][0-9]*(@[A-Za-z0-9_][A-Za-z0-9_-]*)?)$")


class Long2ragLeadModel(OwnedModel):
    """A no-model baseline: the leading sentences of the context's documents, in turn, up to
    `long2rag.generation.max_words` words (no call, no key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["long2rag-lead"]
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    settings: ModelSettings | None = Field(
        default=None,
        min_length=1,
        description="the long2rag.settings to run (a list or {long2rag: [names]}; default: all)",
    )


class OverlapJudge(OwnedJudge):
    """A no-model entailment judge: a key point is entailed by the answer sentence that holds
    the largest share of its content words (see judging.py). A transparent lexical baseline,
    not a model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["long2rag-overlap"]
    full: float = Field(default=0.6, gt=0, le=1, description="share of words for 'yes'")
    partial: float = Field(default=0.3, gt=0, le=1, description="share of words for 'neutral'")

    @model_validator(mode="after")
    def _check(self) -> OverlapJudge:
        if self.partial > self.full:
            raise ValueError(f"partial ({self.partial}) must not exceed full ({self.full})")
        return self


class Long2ragPrompts(PromptFiles):
    decompose: str = f"{PROMPTS}/decompose.txt"
    extract: str = f"{PROMPTS}/extract.txt"
    aggregate: str = f"{PROMPTS}/aggregate.txt"
    filter: str = f"{PROMPTS}/filter.txt"
    generate: str = f"{PROMPTS}/generate.txt"
    judge_point: str = f"{PROMPTS}/judge_point.txt"
    judge_batch: str = f"{PROMPTS}/judge_batch.txt"
    repair: str = f"{PROMPTS}/repair.txt"


class Long2ragDerived(HaystackSelection):
    """The offline default: Long2RAG-format questions derived from SummHay haystacks."""

    retriever: Literal["bm25", "dense"] = "bm25"


class Long2ragConstruct(Strict):
    """Key-point construction with an LLM, for questions of a user's file that have none."""

    llm: str | None = Field(
        default=None, description="a judges entry (provider openai) that builds the key points"
    )
    rounds: int = Field(default=2, ge=1, description="extraction rounds per document")
    filter: bool = Field(default=True, description="score each point, keep those >= threshold")
    threshold: float = Field(default=0.7, ge=0, le=1)
    decompose: bool = Field(default=False, description="also write sub-questions for retrieval")
    on_check_failure: Literal["error", "unmerged"] = Field(
        default="error",
        description="when aggregation breaks the exactly-one rule after a repair: fail the "
        "question, or keep its points unmerged (exact duplicates removed)",
    )


class Long2ragGeneration(Strict):
    max_tokens: int | None = Field(
        default=None, ge=1, description="LLM answer length (null = the model entry's max_tokens)"
    )
    max_words: int = Field(default=300, ge=1, description="answer length of no-model baselines")
    chunk_tokens: int = Field(default=128, ge=8, description="RAG chunk size, cl100k tokens")
    chunk_overlap: int = Field(default=16, ge=0, description="tokens shared by adjacent chunks")
    chunk_ranker: Literal["bm25", "dense"] = "bm25"

    @model_validator(mode="after")
    def _check(self) -> Long2ragGeneration:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError("chunk_overlap must be smaller than chunk_tokens")
        return self


class Long2ragScoring(Strict):
    neutral: Literal["not_entailed", "entailed"] = Field(
        default="not_entailed", description="how a 'neutral' verdict counts (paper: inferred 0)"
    )
    length_buckets: list[int] = Field(
        default=[8000, 16000, 25000, 32000],
        description="upper edges (cl100k tokens of the 5 documents) of the input-length buckets",
    )

    @field_validator("length_buckets")
    @classmethod
    def _increasing(cls, edges: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(edges)) or any(e <= 0 for e in edges):
            raise ValueError(f"length_buckets must be positive and increasing, got {edges}")
        return edges


class Long2ragParams(BenchmarkParams):
    # `summhay` derives the offline dataset from data/summhay; or the path of your JSONL file.
    source: str = "summhay"
    n_documents: int = Field(default=5, ge=1, description="documents per question")
    derived: Long2ragDerived = Long2ragDerived()
    construction: Long2ragConstruct = Long2ragConstruct()
    settings: list[str] = Field(
        default=["long_context", "rag_512", "rag_1024", "rag_2048"], min_length=1
    )
    generation: Long2ragGeneration = Long2ragGeneration()
    prompts: Long2ragPrompts = Long2ragPrompts()
    scoring: Long2ragScoring = Long2ragScoring()

    @field_validator("settings")
    @classmethod
    def _settings(cls, settings: list[str]) -> list[str]:
        for s in settings:
            if not SETTING_RE.match(s):
                raise ValueError(
                    f"unknown setting {s!r}; use long_context, rag_<budget tokens> or"
                    " rag_<budget tokens>@<a retrievers entry>"
                )
        no_repeats(settings=settings)
        return settings

    def construction_llm(self) -> str | None:
        """The judges entry (provider openai) that construction asks, if it needs a model."""
        return None if self.source == "summhay" else self.construction.llm
