"""The params.yaml schema, validated once, strictly.

Unknown keys, duplicate keys and wrong types are errors that name the key. Every knob a result
depends on lives here (or in a prompt file named here), so DVC sees it.
"""

from __future__ import annotations

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
        for s in self.settings:
            if s not in CONTEXT_SETTINGS:
                raise ValueError(f"unknown setting {s!r}; known: {', '.join(CONTEXT_SETTINGS)}")
        if len(set(self.settings)) != len(self.settings):
            raise ValueError(f"settings lists a name twice: {self.settings}")
        return self


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
        for s in self.settings:
            if s not in CONTEXT_SETTINGS:
                raise ValueError(f"unknown setting {s!r}; known: {', '.join(CONTEXT_SETTINGS)}")
        if len(set(self.settings)) != len(self.settings):
            raise ValueError(f"settings lists a name twice: {self.settings}")
        return self


ModelSpec = Annotated[PublishedModel | OpenAIModel | BaselineModel, Field(discriminator="provider")]


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


JudgeSpec = Annotated[PublishedJudge | OpenAIJudge | LocalJudge, Field(discriminator="provider")]


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
        for h in self.haystacks:
            if h not in HAYSTACKS:
                raise ValueError(f"unknown haystack {h!r}; known: {', '.join(HAYSTACKS)}")
        for label, names in (
            ("haystacks", self.haystacks),
            ("models", self.models),
            ("judges", self.judges),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"{label} lists a name twice: {names}")
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
