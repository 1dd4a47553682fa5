"""The `crud_rag:` section of params.yaml, and the judge CRUD-RAG defines itself."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
from pydantic import ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from pipeline.core.config import BenchmarkParams, OwnedJudge, PromptFiles, Strict, no_repeats
from pipeline.core.types import EndpointConfig

PROMPTS = "pipeline/benchmarks/crud_rag/prompts"
RELEASED = "released"
# The authors' task families (their benchmark file's top-level keys), in the paper's CRUD order.
TASKS = (
    "continuing_writing",
    "questanswer_1doc",
    "questanswer_2docs",
    "questanswer_3docs",
    "hallu_modified",
    "event_summary",
)
Task = Literal[
    "continuing_writing",
    "questanswer_1doc",
    "questanswer_2docs",
    "questanswer_3docs",
    "hallu_modified",
    "event_summary",
]
RETRIEVERS = ("bm25", "dense", "hybrid")
# bm25, dense, hybrid, or a retrievers entry of yours that crud_rag.retrievers lists
Retriever = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")]


class TextJudge(OwnedJudge):
    """The reference-based text metrics, no generative model: BLEU (jieba tokens, with and
    without the brevity penalty), BLEU-1..4, ROUGE-L and the length, per output (metrics.py);
    and the embedding similarity of output and reference when `embedding` says whose."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["crud_rag-text"]
    embedding: Literal["local"] | EndpointConfig | None = Field(
        default=None,
        description="local (MiniLM, offline: not the paper's model), an OpenAI-compatible "
        "/v1/embeddings endpoint (base_url, model, api_key_env, ...), or null (none)",
    )


class CrudPrompts(PromptFiles):
    event_summary: str = f"{PROMPTS}/event_summary.txt"
    continuing_writing: str = f"{PROMPTS}/continuing_writing.txt"
    questanswer: str = f"{PROMPTS}/questanswer.txt"
    hallu_modified: str = f"{PROMPTS}/hallu_modified.txt"
    quest_generate: str = f"{PROMPTS}/quest_generate.txt"
    quest_answer: str = f"{PROMPTS}/quest_answer.txt"
    repair: str = f"{PROMPTS}/repair.txt"


class Knobs(Strict):
    """One retrieval setting: how the corpus is chunked and what is retrieved."""

    chunk_size: int = Field(ge=8, description="cl100k_base tokens per chunk")
    chunk_overlap: int = Field(ge=0, lt=100, description="percent of a chunk shared with the next")
    retriever: Retriever
    top_k: int = Field(ge=1)

    @property
    def name(self) -> str:
        return f"{self.retriever}-c{self.chunk_size}-o{self.chunk_overlap}-k{self.top_k}"

    @property
    def overlap_tokens(self) -> int:
        return self.chunk_size * self.chunk_overlap // 100


def _vary(base: Knobs, entry: str, **update: object) -> Knobs:
    """The base with some knobs changed, validated (model_copy would skip the checks)."""
    try:
        return Knobs.model_validate({**base.model_dump(), **update})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"grid {entry} gives an invalid setting: {problems}") from None


class Grid(Strict):
    """The knob study: one factor at a time around `base` (the paper's Tables 3-7)."""

    base: Knobs = Knobs(chunk_size=128, chunk_overlap=0, retriever="bm25", top_k=8)
    # YAML writes a pair as a list: the pair's container is lax, its numbers strict
    chunk: list[Annotated[tuple[StrictInt, StrictInt], pydantic.Strict(False)]] = Field(
        default_factory=lambda: [(64, 16), (128, 8), (256, 4), (512, 2)],
        description="(chunk size, top-k) pairs, co-varied as in the paper's Table 3",
    )
    chunk_overlap: list[int] = Field(default_factory=lambda: [0, 10, 30, 50, 70])
    retriever: list[Retriever] = Field(default_factory=lambda: ["bm25"])
    top_k: list[int] = Field(default_factory=lambda: [2, 4, 6, 8, 10])
    oracle: bool = Field(
        default=True, description="also the record's own news text (when it has one)"
    )

    def settings(self) -> list[tuple[str, Knobs]]:
        """(the knob that varies, its setting) for every distinct setting, the base first.

        Each setting is validated as a `Knobs` (top_k >= 1, chunk_size >= 8, overlap < 100):
        a bad value raises ValueError naming the grid entry (checked at load, see _settings)."""
        b = self.base
        out: list[tuple[str, Knobs]] = [("base", b)]
        seen = {b}
        variants: list[tuple[str, Knobs]] = []
        for size, k in self.chunk:
            variants.append(
                ("chunk_size", _vary(b, f"chunk: [{size}, {k}]", chunk_size=size, top_k=k))
            )
        for ov in self.chunk_overlap:
            variants.append(("chunk_overlap", _vary(b, f"chunk_overlap: {ov}", chunk_overlap=ov)))
        for r in self.retriever:
            variants.append(("retriever", _vary(b, f"retriever: {r}", retriever=r)))
        for k in self.top_k:
            variants.append(("top_k", _vary(b, f"top_k: {k}", top_k=k)))
        for knob, s in variants:
            if s not in seen:
                seen.add(s)
                out.append((knob, s))
        return out

    @model_validator(mode="after")
    def _settings(self) -> Grid:
        self.settings()  # every derived setting must be a valid Knobs
        return self

    @field_validator("chunk_overlap", "top_k")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        if len(set(values)) != len(values):
            raise ValueError(f"a value is listed twice: {values}")
        return values


class Generation(Strict):
    max_chars: int = Field(
        default=200,
        ge=1,
        description="no-model baselines: characters per answer (about the"
        " released references' mean length)",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="LLM answers (null: the model entry's max_tokens)"
    )


class QuestEval(Strict):
    """RAGQuestEval's questions: from the authors' released caches (their file layout), else
    written by an LLM at construct time and answered from the reference."""

    caches: str | None = Field(
        default="data/crud_rag",
        description="a folder of <Task>_quest_gt_save.json files in the authors' layout",
    )
    llm: str | None = Field(
        default=None,
        description="a judges entry (provider openai) that writes the questions of records no "
        "cache holds; null: those records get no questions",
    )


class CrudParams(BenchmarkParams):
    # released = the 1,328 released event-summarisation records (data/crud_rag); or the path of
    # the authors' benchmark file (their JSON: task -> records), e.g. inputs/crud_rag/crud.json.
    source: str = RELEASED
    tasks: list[Task] = Field(default_factory=lambda: list[Task](["event_summary"]), min_length=1)
    records: int | None = Field(default=100, ge=1, description="the first N records of each task")
    corpus: str = Field(
        default="records",
        description="records (the news texts the source's records carry) or a folder of the "
        "authors' corpus files (one news item per line)",
    )
    grid: Grid = Grid()
    generation: Generation = Generation()
    quest_eval: QuestEval = QuestEval()
    prompts: CrudPrompts = CrudPrompts()

    @field_validator("tasks")
    @classmethod
    def _tasks_once(cls, tasks: list[str]) -> list[str]:
        no_repeats(tasks=tasks)
        return tasks

    @model_validator(mode="after")
    def _released(self) -> CrudParams:
        if self.source == RELEASED and self.tasks != ["event_summary"]:
            raise ValueError(
                "the released records are event summarisation only: set tasks:"
                " [event_summary], or source to the authors' benchmark file"
            )
        return self

    def construction_llm(self) -> str | None:
        """The judges entry (provider openai) that construction asks, if it needs a model."""
        return self.quest_eval.llm
