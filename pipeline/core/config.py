"""The params.yaml schema, validated strictly: the runtime, the models and the judges.

Unknown keys, duplicate keys and wrong types are errors that name the key. Every knob a result
depends on lives in params.yaml (or in a prompt file named there), so DVC sees it.

This module knows no benchmark. Each benchmark's section (`summhay:`, `long2rag:`, ...) is
validated by the params model of its package, found through the registry
(`pipeline.core.registry`); so are the model and judge providers a package defines itself (named
`<benchmark>-<kind>`, e.g. `long2rag-lead`). `load_params(path, benchmarks=[...])` validates the
core and the named benchmarks only, which is what a stage of one benchmark needs (and all that its
DVC dependencies cover); `load_params(path)` validates everything (`lfbench check`).
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.core import packages
from pipeline.core.errors import ConfigError, DataError, format_loc
from pipeline.core.io import read_text
from pipeline.core.types import EndpointConfig

# A models/judges entry name becomes a DVC stage name, a params path (`models.<name>`), a file
# and folder name (generations/<benchmark>/<name>.jsonl, the journal) and an MLflow tag.
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
# 64: a judge stage's journal is named <benchmark>-judge_<model>-<judge>.embeddings.jsonl, and
# with each name at most 64 characters (new-benchmark's limit too) that stays under the 255 bytes
# a file name can have.
NAME_MAX = 64


def name_problem(name: str) -> str | None:
    """Why a models/judges entry name cannot be used (None: it can), in the user's terms."""
    if not name:
        return "is empty"
    if len(name) > NAME_MAX:
        return (
            f"is {len(name)} characters long; at most {NAME_MAX} (it becomes a file name, which"
            " the file system limits)"
        )
    if "." in name:
        return (
            "has a dot, which DVC reads as nesting (models.gpt-4.1 would be key 1 under"
            " models.gpt-4); write it with - or _ (gpt-4-1)"
        )
    if "/" in name or "\\" in name:
        return "has a path separator (it becomes a file name)"
    if any(c.isspace() for c in name):
        return "has whitespace (it becomes a DVC stage name and a file name)"
    if name[0] == "-":
        return "starts with -, which a command line reads as an option"
    if not NAME_RE.match(name):
        return (
            f"must match {NAME_RE.pattern}: letters, digits, _ and - (it becomes a DVC stage"
            " name and a file name)"
        )
    return None


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def no_repeats(**lists: list[str]) -> None:
    """Each list names every entry once (a repeated model, judge or setting is a typo)."""
    for label, names in lists.items():
        if len(set(names)) != len(names):
            raise ValueError(f"{label} lists a name twice: {names}")


def known(label: str, names: Iterable[str], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    for n in names:
        if n not in allowed:
            raise ValueError(f"unknown {label} {n!r}; known: {', '.join(allowed)}")


class Strict(BaseModel):
    """The base of every params model: unknown keys refused, no NaN or infinity in a float
    (`.nan`/`.inf` in YAML would reach the wire or a threshold silently), and no conversion of
    a value's type (pydantic's strict mode: `first: "3"` is not 3, `first: true` is not 1,
    `length_study: 1` is not true; an int is still a float). Subclasses that set their own
    model_config keep these (pydantic merges configs). A field that YAML cannot write in its
    type (a tuple: a YAML list) relaxes the container only: `Annotated[tuple[StrictInt,
    StrictInt], pydantic.Strict(False)]`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


# ---------------------------------------------------------------- models under test

# A model entry's `settings`: one list for every benchmark it runs in (each takes the names it
# has), or a list per benchmark. See `settings_for`.
ModelSettings = list[str] | dict[str, Annotated[list[str], Field(min_length=1)]]


def _settings_once(settings: ModelSettings | None) -> ModelSettings | None:
    if isinstance(settings, dict):
        for bench, names in settings.items():
            no_repeats(**{f"settings.{bench}": names})
    else:
        no_repeats(settings=settings or [])
    return settings


def settings_for(spec: object, benchmark: str, names: Sequence[str]) -> list[str] | None:
    """The settings a model entry picks for `benchmark`, whose settings are `names`; None: the
    benchmark's default (the entry names none of them). A list keeps the names `benchmark`
    has (the others belong to its other benchmarks: `pipeline.core.params` refuses a name
    none of them has); a mapping gives `benchmark`'s own list. In the entry's order."""
    settings = getattr(spec, "settings", None)
    if settings is None:
        return None
    if isinstance(settings, dict):
        return list(settings[benchmark]) if benchmark in settings else None
    picked = [s for s in settings if s in names]
    return picked or None


class PublishedModel(Strict):
    """Replays the outputs a paper released (SummHay: 78 systems' summaries, news haystacks)."""

    provider: Literal["published"]
    benchmark: str | None = Field(
        default=None,
        description="the benchmark whose release it replays (default: the one listing it)",
    )
    systems: list[str] | None = Field(
        default=None, description="system names to keep (default: all released)"
    )
    settings: list[str] | None = Field(
        default=None, description="settings to keep, e.g. [oracle, full] (default: all released)"
    )


class Slice(Strict):
    """The items of a benchmark one model runs on (its own slice; the benchmark's other models
    keep their data): `items` names item ids, or the part of an id before a `/` (a SummHay
    haystack: `news1`), then `first` keeps the first N in dataset order. Empty: every item."""

    items: list[str] | None = Field(default=None, min_length=1)
    first: int | None = Field(default=None, ge=1)

    def select(self, ids: Sequence[str]) -> list[str]:
        """The ids of `ids` (in order) this slice keeps."""
        wanted = set(self.items or ())
        kept = [i for i in ids if not wanted or i in wanted or i.split("/", 1)[0] in wanted]
        return kept[: self.first] if self.first is not None else kept

    def unknown(self, ids: Sequence[str]) -> list[str]:
        """The names in `items` that match no id of `ids` (neither an id nor its part before a
        `/`): a typo, or an item of another dataset."""
        known = set(ids) | {i.split("/", 1)[0] for i in ids}
        return [n for n in self.items or () if n not in known]

    def describe(self) -> str:
        parts = [",".join(self.items)] if self.items else []
        if self.first is not None:
            parts.append(f"first {self.first}")
        return " ".join(parts) or "all"


class OpenAIModel(EndpointConfig):
    """Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp, a LiteLLM proxy).

    The key is read from the environment variable named by `api_key_env`, never from here.
    """

    provider: Literal["openai"]
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    settings: ModelSettings | None = Field(
        default=None,
        min_length=1,
        description="the context settings to run, as the benchmarks name them: a list (each"
        " benchmark takes the names it has, its default when none; a name no benchmark of the"
        " model has is refused) or {benchmark: [names]} (default: each benchmark's default)",
    )
    samples: int = Field(default=1, ge=1, description="outputs per item and setting")
    on_truncation: Literal["keep", "retry", "fail"] = Field(
        default="keep",
        description="an answer the server cut (finish_reason: length, or content_filter): keep"
        " it, flagged and counted; retry once with retry_max_tokens (a cut for length only;"
        " kept, flagged, if cut again); or fail the item",
    )
    retry_max_tokens: int | None = Field(
        default=None, ge=1, description="the budget of a retry (default: twice max_tokens)"
    )
    slice: dict[str, Slice] = Field(
        default_factory=dict,
        description="per benchmark, the items this model runs on (default: every item)",
    )
    length_study: bool = Field(
        default=False,
        description="also run on a benchmark's recombined haystacks of other lengths (SummHay's"
        " length study: 8 more haystacks by default); off for a model that costs calls",
    )

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig.model_validate(
            {k: getattr(self, k) for k in EndpointConfig.model_fields}
        )

    @field_validator("settings")
    @classmethod
    def _once(cls, settings: ModelSettings | None) -> ModelSettings | None:
        return _settings_once(settings)


class BaselineModel(Strict):
    """An answer that needs no model (pipeline/baselines.py): `lead` takes the leading sentences
    of the context's documents in context order; `extractive` the sentences most relevant to the
    query (BM25 over sentences, near-duplicates dropped). Every bullet cites the documents its
    sentence comes from."""

    provider: Literal["baseline"]
    kind: Literal["lead", "extractive"]
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    settings: ModelSettings | None = Field(
        default=None,
        min_length=1,
        description="the context settings to run: a list or {benchmark: [names]}, as for an"
        " openai model (default: each benchmark's default)",
    )
    length_study: bool = Field(
        default=True,
        description="also run on a benchmark's recombined haystacks of other lengths (SummHay's"
        " length study; a baseline costs nothing, so on by default)",
    )
    bullets: int | None = Field(
        default=None, ge=1, description="sentences per answer (default: the benchmark decides)"
    )

    @field_validator("settings")
    @classmethod
    def _once(cls, settings: ModelSettings | None) -> ModelSettings | None:
        return _settings_once(settings)


class PythonModel(Strict):
    """A whole RAG system written in Python, run as a model: an entry point
    (`module:callable`) the user writes, given each question with the item's documents (the
    haystack, the corpus), returning the answer and, optionally, the passages it used and its
    citations (`pipeline/stages/systems.py`). Its module is found in `inputs/systems/` (a
    dependency of every generate stage, so an edit re-runs them) or among installed packages."""

    provider: Literal["python"]
    entry: str = Field(description="module:callable, e.g. my_rag:answer (inputs/systems/my_rag.py)")
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments passed to the callable as `options` (part of the"
        " results' provenance)",
    )
    max_concurrency: int = Field(
        default=1, ge=1, description="questions answered at once (threads; 1: one at a time)"
    )
    slice: dict[str, Slice] = Field(
        default_factory=dict,
        description="per benchmark, the items this system runs on (default: every item)",
    )

    @field_validator("entry")
    @classmethod
    def _entry(cls, entry: str) -> str:
        return check_entry_point(entry)


class OutputsModel(Strict):
    """Answers made elsewhere (another framework, another machine), replayed as a model: per
    benchmark, a JSONL file of `{"item_id", "answer", "passages"?, "citations"?}` lines keyed
    by the benchmark's item ids (`lfbench export outputs` writes one from a model's generations).
    An unknown, missing or repeated item id is an error naming the file and line."""

    provider: Literal["outputs"]
    files: dict[str, str] = Field(
        min_length=1,
        description="benchmark -> the JSONL file of its answers (e.g. inputs/systems/mine.jsonl)",
    )
    system: str | None = Field(
        default=None, description="the name reported in results (default: the entry's name)"
    )
    slice: dict[str, Slice] = Field(
        default_factory=dict,
        description="per benchmark, the items the file answers (default: every item)",
    )


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRY_POINT_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}$")


def check_entry_point(entry: str) -> str:
    """`module:callable`, e.g. `my_retriever:score` or `mypkg.rag:answer`."""
    if not ENTRY_POINT_RE.match(entry):
        raise ValueError(
            f"{entry!r} is not an entry point: write module:callable, e.g. my_retriever:score"
            " (a file inputs/retrievers/my_retriever.py defining score) or mypkg.rag:answer"
        )
    return entry


class OwnedModel(Strict):
    """A model provider that a benchmark package defines (`<benchmark>-<kind>`). Until that
    benchmark is loaded its entry is kept as written; loading validates it with the package's
    own class (a subclass of this one)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    provider: str
    system: str | None = None


# ---------------------------------------------------------------- retrievers


class Bm25Retriever(Strict):
    """The project's BM25 (bm25s; `pipeline/retrieval/bm25.py`) as an entry of its own."""

    provider: Literal["bm25"]
    stopwords: bool = Field(default=True, description="drop English stopwords from both sides")


class DenseRetriever(Strict):
    """The project's MiniLM (numpy, offline; `pipeline/retrieval/dense.py`) as an entry of its
    own: a passage scores its best 254-word-piece window."""

    provider: Literal["dense"]


class RetrievalEndpoint(Strict):
    """How an HTTP retrieval endpoint is reached, paced and priced (the key from the variable
    that `api_key_env` names, never from here)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    max_concurrency: int = Field(default=4, ge=1, description="requests in flight")
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=6, ge=0)
    price_input_per_1m: float = Field(
        default=0.0, ge=0, description="USD per 1M input tokens (the server's usage counts)"
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        from pipeline.core.types import check_base_url

        check_base_url(url)
        return url

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not ENV_NAME_RE.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
        return name

    def endpoint(self) -> EndpointConfig:
        """The endpoint as the model client takes it (sampling fields at their defaults)."""
        return EndpointConfig.model_validate(
            {k: getattr(self, k) for k in EndpointConfig.model_fields if hasattr(self, k)}
        )


class EmbeddingsRetriever(RetrievalEndpoint):
    """Any OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, vLLM, TEI, Ollama, llama.cpp's
    server): the cosine similarity of the query's and each passage's embedding. A long passage
    can be cut into windows (`window_tokens`, counted by `tokenizer`): it scores its best
    window. Vectors are kept in the response cache, keyed by the model and the text."""

    provider: Literal["embeddings"]
    batch_size: int = Field(default=64, ge=1, description="texts per request")
    window_tokens: int | None = Field(
        default=None,
        ge=8,
        description="cut each passage into windows of this many tokens and score its best one"
        " (null: the whole passage, as the server takes it; most servers cut or refuse text"
        " past the model's limit)",
    )
    tokenizer: str = Field(
        default="cl100k_base",
        description="what window_tokens counts: cl100k_base, minilm (the word pieces of the"
        " packaged all-MiniLM-L6-v2, as the dense retriever cuts), or a tokenizer.json file",
    )
    query_prefix: str = Field(default="", description="prepended to each query (e.g. 'query: ')")
    passage_prefix: str = Field(default="", description="prepended to each passage window")
    dimensions: int | None = Field(
        default=None, ge=1, description="ask the server for shorter vectors (OpenAI's v3 models)"
    )


class RerankRetriever(RetrievalEndpoint):
    """A Cohere-compatible `/v1/rerank` endpoint (Cohere, Jina, vLLM, TEI, llama.cpp's server)
    re-ordering the top `top_k` passages of another retriever (`over`); the rest keep that
    retriever's order below them."""

    provider: Literal["rerank"]
    over: str = Field(
        default="bm25",
        description="the retriever whose top_k it re-orders: bm25, dense, or a benchmark's"
        " released ranking (e.g. SummHay's vector)",
    )
    top_k: int = Field(default=20, ge=1, description="passages re-ordered per query")
    max_chars: int | None = Field(
        default=None, ge=1, description="cut each passage to this many characters before sending"
    )
    price_per_1k_requests: float = Field(
        default=0.0, ge=0, description="USD per 1,000 rerank requests (Cohere prices searches)"
    )


class PythonRetriever(Strict):
    """A retriever the user writes: an entry point (`module:callable`) given the query and the
    item's passages, returning a score per passage or the passage ids in order. A LangChain or
    LlamaIndex retriever wraps into one in a few lines (README "Your own retriever"). Its
    module is found in `inputs/retrievers/` (a dependency of every retrieval stage) or among
    installed packages."""

    provider: Literal["python"]
    entry: str = Field(description="module:callable, e.g. my_retriever:score")
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments passed to it as `options`"
    )

    @field_validator("entry")
    @classmethod
    def _entry(cls, entry: str) -> str:
        return check_entry_point(entry)


class RunRetriever(Strict):
    """A TREC run file made elsewhere (`qid Q0 docid rank score tag` per line): the ranking of
    each query is replayed. Per benchmark, the file of its queries (query and passage ids as the
    benchmark's retrieval names them: `lfbench export queries` lists them)."""

    provider: Literal["run"]
    files: dict[str, str] = Field(
        min_length=1, description="benchmark -> its run file (e.g. inputs/retrievers/x.run)"
    )


RETRIEVER_PROVIDERS: dict[str, type[BaseModel]] = {
    "bm25": Bm25Retriever,
    "dense": DenseRetriever,
    "embeddings": EmbeddingsRetriever,
    "rerank": RerankRetriever,
    "python": PythonRetriever,
    "run": RunRetriever,
}
# The project's own retrievers, by name, wherever a benchmark takes a retrieval setting: an entry
# may not take one of these names.
BUILTIN_RETRIEVERS = ("bm25", "dense")

RetrieverSpec = Annotated[
    Annotated[Bm25Retriever, Tag("bm25")]
    | Annotated[DenseRetriever, Tag("dense")]
    | Annotated[EmbeddingsRetriever, Tag("embeddings")]
    | Annotated[RerankRetriever, Tag("rerank")]
    | Annotated[PythonRetriever, Tag("python")]
    | Annotated[RunRetriever, Tag("run")],
    Discriminator(
        lambda v: (
            (v.get("provider") if isinstance(v, dict) else getattr(v, "provider", None))
            if (v.get("provider") if isinstance(v, dict) else getattr(v, "provider", None))
            in RETRIEVER_PROVIDERS
            else None
        ),
        custom_error_type="provider",
        custom_error_message=(
            f"unknown retriever provider; use one of {', '.join(RETRIEVER_PROVIDERS)}"
        ),
    ),
]


# ---------------------------------------------------------------- judges


class PublishedJudge(Strict):
    """Replays the judgements a paper released (SummHay: GPT-4o coverage judgements)."""

    provider: Literal["published"]
    benchmark: str | None = Field(
        default=None,
        description="the benchmark whose release it replays (default: the one listing it)",
    )
    agreement_proxy: str | None = Field(
        default=None,
        description="a replayed judge cannot score the human-annotated outputs; its agreement "
        "with people is that of these released predictions (the same judge model and prompt)",
    )


class OpenAIJudge(EndpointConfig):
    """An LLM judge behind an OpenAI-compatible endpoint, with the project's (or your) prompt."""

    provider: Literal["openai"]
    mode: Literal["per_insight", "batched"] = Field(
        default="per_insight",
        description="per_insight: one call per (reference unit, output), as in the papers; "
        "batched: all reference units of an output in one call",
    )
    json_mode: bool = Field(
        default=True, description="ask the server for a JSON object (response_format)"
    )
    structured: Literal["json_object", "json_schema", "json_object_schema"] | None = Field(
        default=None,
        description="how to ask for structured output, as the server supports it: json_object"
        " (OpenAI JSON mode), json_schema (OpenAI structured outputs, vLLM, Ollama, llama.cpp's"
        " llama-server), json_object_schema (json_object with an inline schema:"
        " llama-cpp-python's server); the schema is the benchmark's, for its judge prompt."
        " null: json_mode decides (json_object or nothing)",
    )
    repair: bool = Field(default=True, description="one repair call after an unparseable answer")
    models: list[str] | Literal["all"] | None = Field(
        default=None,
        description="the models entries it judges: a list of names, `all` (every model of the"
        " benchmark: the published systems' released outputs and the baselines too), or null:"
        " the models with calls (provider openai) only. A pair it does not judge costs nothing"
        " and is reported as not judged, by choice",
    )

    @field_validator("models")
    @classmethod
    def _models_once(cls, models: list[str] | str | None) -> list[str] | str | None:
        if isinstance(models, list):
            if not models:
                raise ValueError("an empty list judges nothing: list models, or write all")
            no_repeats(models=models)
        return models

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig.model_validate(
            {k: getattr(self, k) for k in EndpointConfig.model_fields}
        )


class LocalJudgeTraining(Strict):
    """How the local judge is trained (stage local-judge-train): on released judgements of these
    groups of the training benchmark's data, minus every group in the human-annotated set."""

    haystacks: list[str] | None = Field(
        default=None,
        min_length=1,
        description="groups whose released judgements may be used (default: every one that has"
        " them; annotated ones are always dropped)",
    )
    c: float = Field(default=1.0, gt=0, description="inverse L2 strength of the logistic model")
    class_weight: Literal["none", "balanced"] = "none"


class LocalJudge(Strict):
    """The offline judge: MiniLM features and a calibrated classifier (pipeline/local_judge)."""

    provider: Literal["local"]
    model_path: str = Field(
        default="models/local-judge/model.json", description="the trained model (a stage output)"
    )
    embedding_cache: bool = Field(
        default=True,
        description="keep MiniLM vectors in .lfbench/cache/embeddings.sqlite (a pure function of"
        " the text, shared by stages)",
    )
    train: LocalJudgeTraining = LocalJudgeTraining()


class OwnedJudge(Strict):
    """A judge provider that a benchmark package defines (see `OwnedModel`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    provider: str


CORE_MODEL_PROVIDERS: dict[str, type[BaseModel]] = {
    "openai": OpenAIModel,
    "published": PublishedModel,
    "baseline": BaselineModel,
    "python": PythonModel,
    "outputs": OutputsModel,
}
# The providers of a whole RAG system (its own retrieval): a benchmark runs them when it says
# what such a system is asked and how its answer becomes an output (`Benchmark.systems`).
SYSTEM_PROVIDERS = frozenset({"python", "outputs"})
CORE_JUDGE_PROVIDERS: dict[str, type[BaseModel]] = {
    "openai": OpenAIJudge,
    "published": PublishedJudge,
    "local": LocalJudge,
}


def owner_of(provider: str) -> str | None:
    """The benchmark that defines a non-core provider (`<benchmark>-<kind>`), if it exists."""
    head, sep, _ = provider.partition("-")
    return head if sep and head in packages.names() else None


# the union's tags, left out of an error's location (models.q.temperature, not models.q.openai...)
_TAGS = {
    "models": {*CORE_MODEL_PROVIDERS, "owned"},
    "judges": {*CORE_JUDGE_PROVIDERS, "owned"},
    "retrievers": set(RETRIEVER_PROVIDERS),
}


def _tagger(core: Mapping[str, type[BaseModel]]) -> Callable[[Any], str | None]:
    def tag(value: Any) -> str | None:
        provider = (
            value.get("provider") if isinstance(value, dict) else getattr(value, "provider", None)
        )
        if not isinstance(provider, str):
            return None
        if provider in core:
            return provider
        return "owned" if owner_of(provider) else None

    return tag


def _provider_error(kind: str, core: Mapping[str, type[BaseModel]]) -> str:
    return (
        f"unknown {kind} provider; use one of {', '.join(core)}, or a provider that a benchmark"
        " package defines (<benchmark>-<kind>, e.g. long2rag-lead)"
    )


ModelSpec = Annotated[
    Annotated[OpenAIModel, Tag("openai")]
    | Annotated[PublishedModel, Tag("published")]
    | Annotated[BaselineModel, Tag("baseline")]
    | Annotated[PythonModel, Tag("python")]
    | Annotated[OutputsModel, Tag("outputs")]
    | Annotated[OwnedModel, Tag("owned")],
    Discriminator(
        _tagger(CORE_MODEL_PROVIDERS),
        custom_error_type="provider",
        custom_error_message=_provider_error("model", CORE_MODEL_PROVIDERS),
    ),
]
JudgeSpec = Annotated[
    Annotated[OpenAIJudge, Tag("openai")]
    | Annotated[PublishedJudge, Tag("published")]
    | Annotated[LocalJudge, Tag("local")]
    | Annotated[OwnedJudge, Tag("owned")],
    Discriminator(
        _tagger(CORE_JUDGE_PROVIDERS),
        custom_error_type="provider",
        custom_error_message=_provider_error("judge", CORE_JUDGE_PROVIDERS),
    ),
]


# ---------------------------------------------------------------- benchmark sections


class PromptFiles(Strict):
    """The base of a benchmark's `prompts` section: one path per prompt (relative to the project).
    Each file's hash is part of every cache key and MLflow run; point one at your own file (e.g.
    a paper's exact wording) to override it."""


class BenchmarkParams(Strict):
    """The base of every benchmark's params section: the models it runs, the judges that score
    them, and its prompt files."""

    models: list[str] = Field(min_length=1)
    judges: list[str] = Field(min_length=1)
    prompts: PromptFiles = PromptFiles()
    retrievers: list[str] = Field(
        default_factory=list,
        description="the retrievers entries this benchmark runs (a retrieval stage each:"
        " `<benchmark>-retrieve@<name>`); its settings then name them like its own",
    )

    @model_validator(mode="after")
    def _once(self) -> BenchmarkParams:
        no_repeats(models=self.models, judges=self.judges, retrievers=self.retrievers)
        return self

    def construction_llm(self) -> str | None:
        """The judges entry (provider openai) that construction asks, if it needs a model."""
        return None


S = TypeVar("S", bound=BenchmarkParams)


# ---------------------------------------------------------------- the whole file


class Params(Strict):
    # Benchmark sections are extra keys: each is validated by its own package (see load_params).
    model_config = ConfigDict(extra="allow", frozen=True)

    runtime: Literal["auto", "docker", "local"] = "auto"
    # The image's base (None: the Dockerfile's digest-pinned `ARG BASE_IMAGE`); part of the
    # image recipe, so every stage re-runs when it changes.
    image_base: str | None = None
    # Extra environment variables a stage's container may see (beyond the API keys named by
    # api_key_env); see README "Containers".
    env_passthrough: list[str] = []
    seed: int = 0
    models: dict[str, ModelSpec]
    judges: dict[str, JudgeSpec]
    # Retrievers by name (`pipeline/retrieval/providers.py`): listed in a benchmark's
    # `retrievers`, each runs as that benchmark's retrieval stage.
    retrievers: dict[str, RetrieverSpec] = {}

    _sections: dict[str, BenchmarkParams] = PrivateAttr(default_factory=dict)

    @field_validator("env_passthrough")
    @classmethod
    def _check_env_names(cls, names: list[str]) -> list[str]:
        for var in names:
            if not ENV_NAME_RE.match(var):
                raise ValueError(f"{var!r} is not a valid environment variable name")
        return names

    @field_validator("models", "judges", "retrievers", mode="before")
    @classmethod
    def _check_entry_names(cls, entries: Any, info: ValidationInfo) -> Any:
        for name in entries if isinstance(entries, dict) else ():
            problem = name_problem(name) if isinstance(name, str) else "is not a string"
            if problem is None and info.field_name == "retrievers" and name in BUILTIN_RETRIEVERS:
                problem = (
                    f"is the name of the project's own {name} retriever (usable as it is); give"
                    " the entry another name"
                )
            if problem is not None:
                shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
                raise ValueError(f"entry name {shown!r} {problem}")
        return entries

    @model_validator(mode="after")
    def _check_names(self) -> Params:
        for key in self.model_extra or {}:
            if key not in packages.names():
                raise ValueError(
                    f"unknown section {key!r}: not a benchmark (benchmarks:"
                    f" {', '.join(packages.names())})"
                )
        return self

    def benchmarks(self) -> list[str]:
        """The benchmark sections params.yaml has (validated or not)."""
        return sorted(self.model_extra or {})

    def raw_section(self, name: str) -> Any:
        return (self.model_extra or {}).get(name)

    def section(self, name: str, model: type[S]) -> S:
        """A benchmark's validated section (load_params must have been asked for it)."""
        sec = self._sections.get(name)
        if sec is None:
            if name not in (self.model_extra or {}):
                raise ConfigError(f"params.yaml has no {name} section")
            raise ConfigError(f"the {name} section was not loaded (load_params(..., [{name!r}]))")
        if not isinstance(sec, model):
            raise ConfigError(f"the {name} section is a {type(sec).__name__}, not {model.__name__}")
        return sec


# ---------------------------------------------------------------- loading


# libyaml's parser where PyYAML was built with it (ten times faster: every stage reads
# params.yaml, and a project's grows with its models); the same documents and marks
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):  # type: ignore[misc]
    """A YAML loader that refuses duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            raise ConfigError(
                f"{node.start_mark.name}: line {key_node.start_mark.line + 1}: a key that is a"
                f" {kind} (YAML's complex keys: `? ...`, `[a, b]: ...`); a key must be a name"
            )
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
        text = read_text(path)
    except DataError as e:
        raise ConfigError(str(e)) from e
    stream = io.StringIO(text)
    stream.name = str(path)  # named in the loader's marks (a duplicate key's line)
    try:
        _refuse_aliases(text, path)
        return yaml.load(stream, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e


def _refuse_aliases(text: str, path: Path) -> None:
    """YAML anchors and aliases (`&name`, `*name`) are refused, before the document is built:
    each alias repeats a whole subtree, so a few lines can stand for billions of nodes (an
    "alias bomb": DVC's own parser, which reads params.yaml on every `dvc status`, expands it for
    minutes or runs out of memory), and a value written once and used in several places hides
    from DVC which keys a stage really depends on. Write each value out."""
    for token in yaml.scan(text, Loader=_SafeLoader):
        if isinstance(token, yaml.AnchorToken | yaml.AliasToken):
            what = "an anchor" if isinstance(token, yaml.AnchorToken) else "an alias"
            sign = "&" if isinstance(token, yaml.AnchorToken) else "*"
            raise ConfigError(
                f"{path}: line {token.start_mark.line + 1}: {what} ({sign}{token.value}):"
                " YAML anchors and aliases are refused (DVC expands every alias when it reads"
                " the file, and a few nested ones stall `dvc status` for minutes: an alias"
                " bomb); write the value out where it is used"
            )


def invalid(
    path: Path | str, e: ValidationError, prefix: tuple[int | str, ...] = ()
) -> ConfigError:
    lines = []
    for err in e.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = prefix + tuple(err["loc"])
        if len(loc) > 2 and loc[0] in _TAGS and loc[2] in _TAGS[str(loc[0])]:
            loc = loc[:2] + loc[3:]  # models.q.temperature, not the union's models.q.openai...
        lines.append(f"  {format_loc(loc)}: {msg}")
    return ConfigError(f"{path} is invalid:\n" + "\n".join(lines))


def problem(path: Path | str, where: str, message: str) -> ConfigError:
    return ConfigError(f"{path} is invalid:\n  {where}: {message}")
