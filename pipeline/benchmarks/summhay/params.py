"""The `summhay:` section of params.yaml."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.config import BenchmarkParams, PromptFiles, Strict, known, no_repeats
from pipeline.data.haystacks import HAYSTACK_IDS

PROMPTS = "pipeline/benchmarks/summhay/prompts"

# The context settings a model can run in (see generation.py and retrieval/context.py).
CONTEXT_SETTINGS = (
    "full",
    "full-sort",
    "full-rev-sort",
    "full-middle",
    "random",
    "vector",
    "longembed",
    "keywords",
    "rerank3",
    "oracle",
    "bm25",
    "dense",
)
DEFAULT_SETTINGS = ("oracle",)


class SummhayPrompts(PromptFiles):
    generate_news: str = f"{PROMPTS}/generate_news.txt"
    generate_conversation: str = f"{PROMPTS}/generate_conversation.txt"
    judge_insight: str = f"{PROMPTS}/judge_insight.txt"
    judge_batch: str = f"{PROMPTS}/judge_batch.txt"
    judge_repair: str = f"{PROMPTS}/judge_repair.txt"


class SummhayScoring(Strict):
    modes: list[Literal["paper", "corrected"]] = Field(
        default=["paper"],
        min_length=1,
        description="paper: the authors' pooled scorer, quirks kept; corrected: fixed + macro",
    )
    partial_credit: float = Field(default=50.0, ge=0, le=100)


class SummhayAgreement(Strict):
    bootstrap_resamples: int = Field(
        default=1000, ge=0, description="resamples for the 95% intervals (0: no intervals)"
    )
    judge_vs_judge: bool = Field(
        default=True, description="also compare every two judges on the summaries both scored"
    )
    max_samples: int | None = Field(
        default=None,
        ge=1,
        description="score only the first N annotated summaries (quick runs; null = all 200)",
    )


class SummhayParams(BenchmarkParams):
    haystacks: list[str] = Field(default_factory=lambda: list(HAYSTACK_IDS), min_length=1)
    subtopics: int | None = Field(
        default=None, ge=1, description="keep only the first N subtopics of each haystack"
    )
    rag_budget_tokens: int = Field(
        default=15000, ge=1, description="cl100k_base tokens of documents in a RAG context"
    )
    prompts: SummhayPrompts = SummhayPrompts()
    scoring: SummhayScoring = SummhayScoring()
    agreement: SummhayAgreement = SummhayAgreement()

    @model_validator(mode="after")
    def _check(self) -> SummhayParams:
        known("haystack", self.haystacks, HAYSTACK_IDS)
        no_repeats(haystacks=self.haystacks)
        return self


def settings_of(spec: object) -> list[str]:
    """The context settings a model entry runs in (its own, or the default)."""
    settings = getattr(spec, "settings", None)
    return list(settings) if settings else list(DEFAULT_SETTINGS)
