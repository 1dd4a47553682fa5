"""What one paper needs beyond the contract: extensions.

The contract (`pipeline/core/benchmark.py`) holds what every benchmark has and the optional
capabilities several share. A hook that serves one paper alone is an extension instead: the
benchmark lists an instance in `extensions = (...)` (each kind at most once) and the stage layer
asks for a kind where it needs it (`Kind.of(bench)`), the same way for every benchmark.
A new benchmark needs none of them.

- `ReleasedJudgements`: a paper's judgements, replayed (judge provider `published`): SummHay.
- `JudgeTraining`: labelled cases to train the local judge on: SummHay.
- `ItemsInRecords`: records that hold several items (a model's slice is cut inside them; an item
  score sees its item with its record): SummHay's haystacks of subtopics.
- `Scorer`: `lfbench score`, a user's own outputs scored without the pipeline: CRUD-RAG.
- `FailedOutcome`: a failed generation counted as an invalid or excluded item: CRUD-RAG's empty
  outputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from pipeline.core.benchmark import AnyBenchmark, Context, Extension, Gens
from pipeline.core.config import BenchmarkParams, JudgeSpec, LocalJudge
from pipeline.core.records import Generation, Judgement, LabelledCase
from pipeline.core.results import Excluded, Invalid

P = TypeVar("P", bound=BenchmarkParams)
D = TypeVar("D", bound=BaseModel)
I = TypeVar("I")  # noqa: E741

__all__ = [
    "Extension",
    "FailedOutcome",
    "ItemsInRecords",
    "JudgeTraining",
    "ReleasedJudgements",
    "Scorer",
    "TrainingData",
    "failed_outcome",
    "restrict",
    "scored_items",
]


class ReleasedJudgements(Extension, ABC, Generic[P, D]):
    """A paper's released judgements, replayed (judge provider `published`). They judge the
    released outputs only."""

    @abstractmethod
    def judgements(
        self, ctx: Context[P], judge: str, spec: JudgeSpec, dataset: Sequence[D], gens: Gens
    ) -> list[Judgement]: ...


@dataclass(frozen=True)
class TrainingData:
    """Labelled cases for the local judge: what it is trained on, what is held out entirely
    (measured, never seen), and why groups were excluded."""

    train: list[LabelledCase]
    train_groups: list[str]
    heldout: list[LabelledCase]
    heldout_groups: list[str]
    excluded: dict[str, str]
    reference: str  # who labelled the cases (e.g. "published GPT-4o (SummHay release)")
    reference_key: str  # its short name in the metrics' keys (e.g. "gpt4o")


class JudgeTraining(Extension, ABC, Generic[P]):
    """Released judgements a benchmark offers to train the local judge on."""

    @abstractmethod
    def cases(self, ctx: Context[P], spec: LocalJudge, annotated_path: str) -> TrainingData:
        """Training and held-out cases; never a case from the human-annotated set's groups."""


class ItemsInRecords(Extension, ABC, Generic[D]):
    """Records that hold several items (SummHay's haystacks hold its subtopics). Without it,
    each dataset record is one item with an `item_id`."""

    @abstractmethod
    def restrict(self, dataset: Sequence[D], keep: set[str]) -> list[D]:
        """The dataset cut to the items in `keep` (a model's own slice), inside the records."""

    @abstractmethod
    def scored(self, dataset: Sequence[D]) -> Mapping[str, Any]:
        """What `item_score` and `failed_keys` get for each item id (e.g. a subtopic with its
        haystack)."""


class Scorer(Extension, ABC):
    """Scores a user's own outputs against references without the pipeline (`lfbench score`):
    each line `{"id", "generation", "reference"}` back with `metrics` (or `error` where the
    line cannot be scored). The pipeline's aggregate uses the same functions."""

    @abstractmethod
    def score_line(self, generation: str, reference: str) -> dict[str, float]:
        """The metrics of one output; raises ValueError (the `error` written) when it cannot be
        scored (e.g. an empty output)."""


class FailedOutcome(Extension, ABC, Generic[P, I]):
    """Failed generations the benchmark counts as invalid or excluded items (e.g. an empty
    output its metrics cannot score), with the reason and row keys. Without it, a failed
    generation is counted as failed."""

    @abstractmethod
    def outcome(
        self, ctx: Context[P], item: I, generation: Generation
    ) -> Invalid | Excluded | None:
        """The outcome of one failed generation; None: counted as a failed generation."""


# ---------------------------------------------------------------- what the stage layer calls


def restrict(bench: AnyBenchmark, dataset: Sequence[Any], keep: set[str]) -> list[Any]:
    """The dataset cut to the items in `keep`: by the benchmark's `ItemsInRecords`, else the
    records whose `item_id` is kept."""
    nested: ItemsInRecords[Any] | None = ItemsInRecords.of(bench)
    if nested is not None:
        return nested.restrict(dataset, keep)
    return [r for r in dataset if getattr(r, "item_id", None) in keep]


def scored_items(bench: AnyBenchmark, dataset: Sequence[Any]) -> Mapping[str, Any]:
    """What item scores get for each item id: by the benchmark's `ItemsInRecords`, else its
    items."""
    nested: ItemsInRecords[Any] | None = ItemsInRecords.of(bench)
    return nested.scored(dataset) if nested is not None else bench.items(dataset)


def failed_outcome(
    bench: AnyBenchmark, ctx: Context[Any], item: Any, generation: Generation
) -> Invalid | Excluded | None:
    """How a failed generation counts: by the benchmark's `FailedOutcome`, else as failed."""
    failed: FailedOutcome[Any, Any] | None = FailedOutcome.of(bench)
    return failed.outcome(ctx, item, generation) if failed is not None else None
