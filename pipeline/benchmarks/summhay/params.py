"""The `summhay:` section of params.yaml."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.config import (
    BenchmarkParams,
    PromptFiles,
    Strict,
    known,
    no_repeats,
    settings_for,
)
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
    llm_max_samples: int | None = Field(
        default=20,
        ge=1,
        description="an LLM judge (provider openai) scores only the first N of them (20: about"
        " 140 per-insight calls; null = all, 1,419 calls for the 200)",
    )


SYNTH = f"{PROMPTS}/synthesis"


class SynthesisPrompts(PromptFiles):
    subtopics: str = f"{SYNTH}/subtopics.txt"
    overlap: str = f"{SYNTH}/overlap.txt"
    insights: str = f"{SYNTH}/insights.txt"
    duplicates: str = f"{SYNTH}/duplicates.txt"
    categorise: str = f"{SYNTH}/categorise.txt"
    document: str = f"{SYNTH}/document.txt"
    chapter: str = f"{SYNTH}/chapter.txt"
    chapter_check: str = f"{SYNTH}/chapter_check.txt"
    leak_check: str = f"{SYNTH}/leak_check.txt"
    presence_check: str = f"{SYNTH}/presence_check.txt"
    remove: str = f"{SYNTH}/remove.txt"
    add: str = f"{SYNTH}/add.txt"
    query: str = f"{SYNTH}/query.txt"
    repair: str = f"{SYNTH}/repair.txt"


class SynthesisHaystack(Strict):
    """One haystack to synthesize (its id becomes `syn-<id>`); the sizes default to the paper's."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=40)
    topic: str = Field(min_length=1)
    domain: Literal["news", "conversation"] = "news"
    participants: list[str] = Field(
        default_factory=list, description="conversation: who talks (at least two)"
    )
    seed_documents: list[str] = Field(
        default_factory=list, description="text files (project paths) to draw subtopics from"
    )
    subtopics: int = Field(default=10, ge=1)
    insights_per_subtopic: int = Field(default=6, ge=1)
    documents: int = Field(default=100, ge=1)
    insights_per_document: int | None = Field(
        default=None, ge=1, description="null: the fewest that give every insight its minimum"
    )
    min_documents_per_insight: int = Field(default=5, ge=1)
    words_per_document: int = Field(default=750, ge=20)

    @model_validator(mode="after")
    def _check(self) -> SynthesisHaystack:
        if self.domain == "conversation" and len(self.participants) < 2:
            raise ValueError(f"{self.id}: a conversation needs at least two participants")
        if self.min_documents_per_insight > self.documents:
            raise ValueError(
                f"{self.id}: min_documents_per_insight ({self.min_documents_per_insight}) is more"
                f" than documents ({self.documents})"
            )
        return self


class SummhaySynthesis(Strict):
    llm: str | None = Field(
        default=None, description="the judges entry (provider openai) that writes and checks"
    )
    haystacks: list[SynthesisHaystack] = Field(default_factory=list)
    extra: int = Field(
        default=2, ge=0, description="subtopics and insights asked for beyond the target"
    )
    rounds: int = Field(default=5, ge=0, description="rewrite rounds of each document check")
    chapter_rounds: int = Field(default=10, ge=0, description="regenerations of a chapter")
    on_residual: Literal["remap", "keep", "drop"] = Field(
        default="remap",
        description="a document still failing a check after the last round: its map follows the"
        " last check (remap), stays as sampled and is flagged (keep), or it is dropped (drop)",
    )
    prompts: SynthesisPrompts = SynthesisPrompts()

    @model_validator(mode="after")
    def _check(self) -> SummhaySynthesis:
        no_repeats(**{"synthesis.haystacks": [h.id for h in self.haystacks]})
        if self.haystacks and self.llm is None:
            raise ValueError("synthesis.haystacks needs synthesis.llm (a judges entry)")
        return self


class SummhayLengths(Strict):
    """The length study: released haystacks' tasks rebuilt at target lengths (recombine.py)."""

    haystacks: list[str] = Field(
        default_factory=list, description="released haystacks whose task is rebuilt"
    )
    tokens: list[int] = Field(
        default_factory=list, description="target lengths in cl100k_base tokens of documents"
    )

    @model_validator(mode="after")
    def _check(self) -> SummhayLengths:
        known("lengths.haystacks", self.haystacks, HAYSTACK_IDS)
        no_repeats(
            **{"lengths.haystacks": self.haystacks, "lengths.tokens": [str(t) for t in self.tokens]}
        )
        if any(t < 1000 for t in self.tokens):
            raise ValueError("lengths.tokens: each target must be at least 1000 tokens")
        return self


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
    lengths: SummhayLengths = SummhayLengths()
    synthesis: SummhaySynthesis = SummhaySynthesis()

    @model_validator(mode="after")
    def _check(self) -> SummhayParams:
        known("haystack", self.haystacks, HAYSTACK_IDS)
        no_repeats(haystacks=self.haystacks)
        return self

    def construction_llm(self) -> str | None:
        """The judges entry (provider openai) that construction asks, if it needs a model."""
        return self.synthesis.llm if self.synthesis.haystacks else None


def settings_of(spec: object, retrievers: Sequence[str] = ()) -> list[str]:
    """The context settings a model entry runs in (those of its `settings` SummHay has:
    `CONTEXT_SETTINGS` and the section's `retrievers`; else the default)."""
    return settings_for(spec, "summhay", (*CONTEXT_SETTINGS, *retrievers)) or list(DEFAULT_SETTINGS)
