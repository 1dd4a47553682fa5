"""The `crux:` section of params.yaml, and the providers CRUX defines itself."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipeline.core.config import (
    BenchmarkParams,
    OwnedJudge,
    OwnedModel,
    PromptFiles,
    Strict,
    no_repeats,
)
from pipeline.data.haystacks import HaystackSelection

PROMPTS = "pipeline/benchmarks/crux/prompts"
RELEASED = ("oracle", "random", "vector", "longembed", "keywords", "rerank3")
COMPUTED = ("zstar", "bm25", "dense")  # zstar: the oracle context Z* first (a reference)
CUTOFFS = ("zstar", "budget")  # besides whole numbers of passages


class ContextsModel(OwnedModel):
    """The retrieval contexts under evaluation: each retriever's ranking of a query's passages
    (no generation, no model call). Released rankings (SummHay's scores, or run files of CRUX's
    layout) and the project's own retrievers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["crux-contexts"]
    system: str | None = None
    retrievers: list[str] = Field(
        default_factory=lambda: ["zstar", *RELEASED, "bm25"],
        min_length=1,
        description="released rankings by name; bm25 or dense (computed here); zstar (the"
        " oracle context Z* first: the reference, Cov = Den = 100 at |Z*|)",
    )

    @field_validator("retrievers")
    @classmethod
    def _once(cls, names: list[str]) -> list[str]:
        no_repeats(retrievers=names)
        return names


class LabelsJudge(OwnedJudge):
    """The ratings the dataset holds (SummHay: 5 when a document holds the insight, else 0;
    CRUX's layout: its judgement files), replayed: no model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["crux-labels"]


class CruxPrompts(PromptFiles):
    rate: str = f"{PROMPTS}/rate.txt"
    repair: str = f"{PROMPTS}/repair.txt"
    passages: str = f"{PROMPTS}/passages.txt"
    query: str = f"{PROMPTS}/query.txt"
    questions: str = f"{PROMPTS}/questions.txt"


class CruxDerived(HaystackSelection):
    """The offline default: CRUX queries derived from the SummHay haystacks."""


class CruxConstruction(Strict):
    """Building CRUX data from your own documents and reference answers with an LLM."""

    llm: str | None = Field(default=None, description="a judges entry (provider openai)")
    n_questions: int = Field(default=10, ge=1, description="sub-questions per reference answer")


class CruxScoring(Strict):
    eta: int = Field(default=3, ge=1, le=5, description="a rating >= eta answers a sub-question")
    cutoffs: list[str] = Field(
        default_factory=lambda: ["zstar", "5", "10", "20", "budget"],
        min_length=1,
        description="passages per context: zstar (|Z*| of the query), N, or budget (packed "
        "into budget_tokens as SummHay generation packs)",
    )
    budget_tokens: int = Field(default=15000, ge=1, description="cl100k tokens of a budget context")
    alpha: float = Field(default=0.5, ge=0, lt=1, description="alpha-nDCG's redundancy penalty")
    w: float = Field(default=0.5, gt=0, description="density's exponent (the paper's w)")
    partial_answers: bool = Field(
        default=False, description="an answer's PARTIAL coverage answers a sub-question (Cov(y))"
    )
    bootstrap_resamples: int = Field(default=1000, ge=0, description="for the tau intervals")

    @field_validator("cutoffs", mode="before")
    @classmethod
    def _numbers(cls, cutoffs: object) -> object:
        if isinstance(cutoffs, list):
            return [
                str(c) if isinstance(c, int) and not isinstance(c, bool) else c for c in cutoffs
            ]
        return cutoffs

    @field_validator("cutoffs")
    @classmethod
    def _cutoffs(cls, cutoffs: list[str]) -> list[str]:
        for c in cutoffs:
            if c not in CUTOFFS and not (c.isdigit() and int(c) > 0):
                raise ValueError(f"unknown cutoff {c!r}; use zstar, budget or a number of passages")
        no_repeats(cutoffs=cutoffs)
        return cutoffs


class CruxAnswers(Strict):
    """Final answers whose coverage the contexts should predict (Table 1's last row): the
    released SummHay summaries, judged by the SummHay judges (their outputs in the pipeline)."""

    generations: str | None = Field(
        default="generations/summhay/published.jsonl", description="null: no answer analysis"
    )
    judgements: list[str] = Field(
        default_factory=lambda: ["judgements/summhay/published/published-gpt-4o.jsonl"]
    )
    metrics: str | None = Field(
        default="metrics/summhay.released.json",
        description="SummHay's rows of the released systems, for Joint (system level)",
    )
    cutoff: str = Field(default="budget", description="the contexts the summarizers were given")


class CruxParams(BenchmarkParams):
    # `summhay` derives the offline default from data/summhay; or a folder in CRUX's layout.
    source: str = "summhay"
    domain: str | None = Field(
        default=None,
        description="the domain of a CRUX-layout folder (default: the folder's name)",
    )
    derived: CruxDerived = CruxDerived()
    construction: CruxConstruction = CruxConstruction()
    scoring: CruxScoring = CruxScoring()
    judge_sample: int | None = Field(
        default=3,
        ge=1,
        description="judges other than the labels rate the contexts of the first N queries of "
        "each collection (null: every query)",
    )
    local_sentences: int = Field(
        default=1,
        ge=1,
        description="the local judge: sentences of a passage it sees per sub-question (those "
        "sharing the most content words with it)",
    )
    answers: CruxAnswers = CruxAnswers()
    prompts: CruxPrompts = CruxPrompts()

    @model_validator(mode="after")
    def _answers(self) -> CruxParams:
        if self.answers.cutoff not in self.scoring.cutoffs:
            raise ValueError(
                f"answers.cutoff {self.answers.cutoff!r} is not one of scoring.cutoffs"
            )
        return self

    def construction_llm(self) -> str | None:
        """The judges entry (provider openai) that construction asks, if it needs a model."""
        return self.construction.llm if self.source.endswith(".jsonl") else None
