"""The params.yaml schema, validated once, strictly.

Unknown keys, duplicate keys and wrong types are errors that name the key. Every knob a result
depends on lives here (or in a prompt file named here), so DVC sees it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.errors import ConfigError
from pipeline.io import format_loc
from pipeline.llm.client import EndpointConfig

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
HAYSTACKS = tuple([f"news{i}" for i in range(1, 6)] + [f"conv{i}" for i in range(1, 6)])


def _no_repeats(**lists: list[str]) -> None:
    """Each list names every entry once (a repeated model, judge or setting is a typo)."""
    for label, names in lists.items():
        if len(set(names)) != len(names):
            raise ValueError(f"{label} lists a name twice: {names}")


def _known(label: str, names: list[str], known: tuple[str, ...] | list[str]) -> None:
    for n in names:
        if n not in known:
            raise ValueError(f"unknown {label} {n!r}; known: {', '.join(known)}")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- models under test


class PublishedModel(Strict):
    """Replays the outputs a paper released (SummHay: 78 systems' summaries, news haystacks)."""

    provider: Literal["published"]
    benchmark: Literal["summhay"] = "summhay"
    systems: list[str] | None = Field(
        default=None, description="summarizer names to keep (default: all released)"
    )
    settings: list[str] | None = Field(
        default=None, description="settings to keep, e.g. [oracle, full] (default: all released)"
    )


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
CONTEXT_SETTINGS_DOC = (
    "full, full-sort, full-rev-sort, full-middle (whole haystack, in an order), or a retriever"
    " packed into summhay.rag_budget_tokens: random, vector, longembed, keywords, rerank3,"
    " oracle (released scores), bm25, dense (computed here)"
)


class OpenAIModel(EndpointConfig):
    """Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp, a LiteLLM proxy).

    The key is read from the environment variable named by `api_key_env`, never from here.
    """

    provider: Literal["openai"]
    benchmark: Literal["summhay"] = "summhay"
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    settings: list[str] = Field(default=["oracle"], min_length=1, description=CONTEXT_SETTINGS_DOC)
    samples: int = Field(default=1, ge=1, description="summaries per item and setting")

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig.model_validate(
            {k: getattr(self, k) for k in EndpointConfig.model_fields}
        )

    @model_validator(mode="after")
    def _check_settings(self) -> OpenAIModel:
        _known("setting", self.settings, CONTEXT_SETTINGS)
        _no_repeats(settings=self.settings)
        return self


class Long2ragLeadModel(Strict):
    """A no-model baseline built into the Long2RAG package: the leading sentences of the context's
    documents, in turn, up to `long2rag.generation.max_words` words (no call, no key)."""

    provider: Literal["long2rag-lead"]
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )


class BaselineModel(Strict):
    """A summarizer that needs no model (pipeline/baselines.py): `lead` takes the leading
    sentences of the context's documents in context order; `extractive` the sentences most
    relevant to the query (BM25 over sentences, near-duplicates dropped). Every bullet cites the
    documents its sentence comes from."""

    provider: Literal["baseline"]
    benchmark: Literal["summhay"] = "summhay"
    kind: Literal["lead", "extractive"]
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    settings: list[str] = Field(default=["oracle"], min_length=1, description=CONTEXT_SETTINGS_DOC)
    bullets: int | None = Field(
        default=None, ge=1, description="bullets per summary (default: as many as insights)"
    )

    @model_validator(mode="after")
    def _check_settings(self) -> BaselineModel:
        _known("setting", self.settings, CONTEXT_SETTINGS)
        _no_repeats(settings=self.settings)
        return self


ModelSpec = Annotated[
    PublishedModel | OpenAIModel | Long2ragLeadModel | BaselineModel,
    Field(discriminator="provider"),
]


# ---------------------------------------------------------------- judges


class PublishedJudge(Strict):
    """Replays the judgements a paper released (SummHay: GPT-4o coverage judgements)."""

    provider: Literal["published"]
    benchmark: Literal["summhay"] = "summhay"
    agreement_proxy: str | None = Field(
        default="prompted_gpt-4o",
        description="a replayed judge cannot score the human-annotated summaries; its agreement "
        "with people is that of these released predictions (the same judge model and prompt)",
    )


class OpenAIJudge(EndpointConfig):
    """An LLM judge behind an OpenAI-compatible endpoint, with the project's (or your) prompt."""

    provider: Literal["openai"]
    benchmark: Literal["summhay"] = "summhay"
    mode: Literal["per_insight", "batched"] = Field(
        default="per_insight",
        description="per_insight: one call per (insight, summary), as in the paper; batched: "
        "all insights of a summary in one call",
    )
    json_mode: bool = Field(
        default=True, description="ask the server for a JSON object (response_format)"
    )
    repair: bool = Field(default=True, description="one repair call after an unparseable answer")

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig.model_validate(
            {k: getattr(self, k) for k in EndpointConfig.model_fields}
        )


class OverlapJudge(Strict):
    """A no-model Long2RAG entailment judge built into the package: a key point is entailed by
    the answer sentence that holds the largest share of its content words (see
    pipeline/benchmarks/long2rag/judging.py). A transparent lexical baseline, not a model."""

    provider: Literal["long2rag-overlap"]
    full: float = Field(default=0.6, gt=0, le=1, description="share of words for 'yes'")
    partial: float = Field(default=0.3, gt=0, le=1, description="share of words for 'neutral'")

    @model_validator(mode="after")
    def _check(self) -> OverlapJudge:
        if self.partial > self.full:
            raise ValueError(f"partial ({self.partial}) must not exceed full ({self.full})")
        return self


class LocalJudgeTraining(Strict):
    """How the local judge is trained (stage local-judge-train): on the published GPT-4o
    judgements of these haystacks, minus every haystack in the human-annotated set."""

    haystacks: list[str] = Field(
        default=["news1", "news2", "news3", "news4", "news5"],
        min_length=1,
        description="haystacks whose released judgements may be used (annotated ones are dropped)",
    )
    c: float = Field(default=1.0, gt=0, description="inverse L2 strength of the logistic model")
    class_weight: Literal["none", "balanced"] = "none"


class LocalJudge(Strict):
    """The offline judge: MiniLM features and a calibrated classifier (pipeline/judges)."""

    provider: Literal["local"]
    benchmark: Literal["summhay"] = "summhay"
    model_path: str = Field(
        default="models/local-judge/model.json", description="the trained model (a stage output)"
    )
    embedding_cache: bool = Field(
        default=True,
        description="keep MiniLM vectors in .lfbench/cache/embeddings.sqlite (a pure function of"
        " the text, shared by stages)",
    )
    train: LocalJudgeTraining = LocalJudgeTraining()


JudgeSpec = Annotated[
    PublishedJudge | OpenAIJudge | OverlapJudge | LocalJudge, Field(discriminator="provider")
]


# ---------------------------------------------------------------- benchmarks


class SummhayScoring(Strict):
    modes: list[Literal["paper", "corrected"]] = Field(
        default=["paper"],
        min_length=1,
        description="paper: the authors' pooled scorer, quirks kept; corrected: fixed + macro",
    )
    partial_credit: float = Field(default=50.0, ge=0, le=100)


class SummhayPrompts(Strict):
    """Prompt files (paths relative to the project). Each file's hash is part of every cache key
    and MLflow run; point one at your own file (e.g. the paper's wording) to override it."""

    generate_news: str = "prompts/summhay/generate_news.txt"
    generate_conversation: str = "prompts/summhay/generate_conversation.txt"
    judge_insight: str = "prompts/summhay/judge_insight.txt"
    judge_batch: str = "prompts/summhay/judge_batch.txt"
    judge_repair: str = "prompts/summhay/judge_repair.txt"


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


class SummhayParams(Strict):
    haystacks: list[str] = Field(default_factory=lambda: list(HAYSTACKS), min_length=1)
    subtopics: int | None = Field(
        default=None, ge=1, description="keep only the first N subtopics of each haystack"
    )
    rag_budget_tokens: int = Field(
        default=15000, ge=1, description="cl100k_base tokens of documents in a RAG context"
    )
    prompts: SummhayPrompts = SummhayPrompts()
    models: list[str] = Field(min_length=1)
    judges: list[str] = Field(min_length=1)
    scoring: SummhayScoring = SummhayScoring()
    agreement: SummhayAgreement = SummhayAgreement()

    @model_validator(mode="after")
    def _check(self) -> SummhayParams:
        _known("haystack", self.haystacks, HAYSTACKS)
        _no_repeats(haystacks=self.haystacks, models=self.models, judges=self.judges)
        return self


class Long2ragPrompts(Strict):
    """Prompt files (paths relative to the project); each file's hash goes into every cache key
    and MLflow run."""

    decompose: str = "prompts/long2rag/decompose.txt"
    extract: str = "prompts/long2rag/extract.txt"
    aggregate: str = "prompts/long2rag/aggregate.txt"
    filter: str = "prompts/long2rag/filter.txt"
    generate: str = "prompts/long2rag/generate.txt"
    judge_point: str = "prompts/long2rag/judge_point.txt"
    judge_batch: str = "prompts/long2rag/judge_batch.txt"
    repair: str = "prompts/long2rag/repair.txt"


class Long2ragDerived(Strict):
    """The offline default: Long2RAG-format questions derived from SummHay haystacks."""

    haystacks: list[str] = Field(default_factory=lambda: list(HAYSTACKS), min_length=1)
    subtopics: int | None = Field(default=None, ge=1, description="first N subtopics per haystack")
    retriever: Literal["bm25", "dense"] = "bm25"

    @field_validator("haystacks")
    @classmethod
    def _known(cls, hs: list[str]) -> list[str]:
        _known("haystack", hs, HAYSTACKS)
        _no_repeats(haystacks=hs)
        return hs


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


LONG2RAG_SETTING_RE = re.compile(r"^(long_context|rag_[1-9][0-9]*)$")


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


class Long2ragParams(Strict):
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
    models: list[str] = Field(min_length=1)
    judges: list[str] = Field(min_length=1)
    scoring: Long2ragScoring = Long2ragScoring()

    @model_validator(mode="after")
    def _check(self) -> Long2ragParams:
        for s in self.settings:
            if not LONG2RAG_SETTING_RE.match(s):
                raise ValueError(f"unknown setting {s!r}; use long_context or rag_<budget tokens>")
        _no_repeats(settings=self.settings, models=self.models, judges=self.judges)
        return self


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Params(Strict):
    runtime: Literal["auto", "docker", "local"] = "auto"
    # Extra environment variables a stage's container may see (beyond the API keys named by
    # api_key_env); see README "Containers".
    env_passthrough: list[str] = []
    seed: int = 0
    models: dict[str, ModelSpec]
    judges: dict[str, JudgeSpec]
    summhay: SummhayParams
    long2rag: Long2ragParams | None = None

    @field_validator("env_passthrough")
    @classmethod
    def _check_env_names(cls, names: list[str]) -> list[str]:
        for var in names:
            if not ENV_NAME_RE.match(var):
                raise ValueError(f"{var!r} is not a valid environment variable name")
        return names

    @model_validator(mode="after")
    def _check_names(self) -> Params:
        for kind, names in (("models", self.models), ("judges", self.judges)):
            for name in names:
                if not NAME_RE.match(name):
                    raise ValueError(
                        f"{kind} name {name!r} must match {NAME_RE.pattern} "
                        "(it becomes a DVC stage name and a file name)"
                    )
        for m in self.summhay.models:
            if m not in self.models:
                raise ValueError(f"summhay.models names {m!r}, which is not defined under models")
        for j in self.summhay.judges:
            if j not in self.judges:
                raise ValueError(f"summhay.judges names {j!r}, which is not defined under judges")
        if self.long2rag is not None:
            l2 = self.long2rag
            for m in l2.models:
                if m not in self.models:
                    raise ValueError(
                        f"long2rag.models names {m!r}, which is not defined under models"
                    )
                if self.models[m].provider == "published":
                    raise ValueError(f"long2rag.models: {m!r} replays SummHay outputs")
            for j in l2.judges:
                if j not in self.judges:
                    raise ValueError(
                        f"long2rag.judges names {j!r}, which is not defined under judges"
                    )
                if self.judges[j].provider == "published":
                    raise ValueError(f"long2rag.judges: {j!r} replays SummHay judgements")
            llm = l2.construction.llm
            if llm is not None and (
                llm not in self.judges or self.judges[llm].provider != "openai"
            ):
                raise ValueError(
                    f"long2rag.construction.llm names {llm!r}, which is not an openai judges entry"
                )
        return self


# ---------------------------------------------------------------- loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"duplicate key {key!r} at line {key_node.start_mark.line + 1}"
                f" of {node.start_mark.name}"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: Path) -> Any:
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        with path.open(encoding="utf-8") as f:
            return yaml.load(f, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e


def load_params(path: Path = Path("params.yaml")) -> Params:
    raw = load_yaml(path)
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            lines.append(f"  {format_loc(tuple(err['loc']))}: {err['msg']}")
        raise ConfigError(f"{path} is invalid:\n" + "\n".join(lines)) from e
