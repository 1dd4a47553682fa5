"""The benchmark contract: what a benchmark package provides, and what it must not do.

A benchmark (`pipeline/benchmarks/<name>/`) is pure: it reads no file, calls no model and logs
nothing to MLflow. It provides, as a subclass of `Benchmark`:

- its params model (`params_model`, the `<name>:` section of params.yaml) and the model and judge
  providers it runs (`model_providers`, `judge_providers`), including any it defines itself
  (`model_specs`, `judge_specs`, named `<name>-<kind>`);
- dataset construction and validation (`construct`, `record`, `items`), reading raw files only
  through the `Inputs` it is handed and asking a model only through the `Asker` it is handed;
- the requests of generation (`plan_generations`) and judging (`judge_task`: the asks for one
  output, each request with the parser of its answer, built with `judge_task()` below;
  `judge_prompts` names its prompts), answers that need no model (`offline_generations`:
  baselines and replayed releases; `offline_judgements`);
- scoring into rows, its report and its MLflow runs (`aggregate` -> `Aggregated`), and its section
  of `lfbench report` (`report_section`);
- optionally, coverage judging (`coverage`: how the local judge, or a no-model judge of its own,
  sees an output), agreement with human labels (`agreement`), training data for the local
  judge (`judge_training`) and an audit of a judge by people on a run's outputs (`audit`: a
  verdict's label scale and what the judge saw).

The stage layer (`pipeline/stages/`) does everything else, the same way for every benchmark:
file reads and atomic writes, every model call (cache, journal, retries, usage and cost), the one
judge loop (first pass, one repair, invalid verdicts counted), MLflow runs with their lineage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeAlias, TypeVar

from pydantic import BaseModel

from pipeline.core.config import (
    BenchmarkParams,
    JudgeSpec,
    LocalJudge,
    ModelSpec,
    OpenAIJudge,
    OpenAIModel,
    OwnedJudge,
    OwnedModel,
    Params,
)
from pipeline.core.errors import ConfigError
from pipeline.core.prompts import Prompt, combined_sha
from pipeline.core.records import Generation, Judgement, LabelledCase, Verdict
from pipeline.core.results import (
    COUNTERS,
    Excluded,
    Invalid,
    ItemScore,
    Metric,
    Outcome,
    ResultRow,
    RowKey,
    interval,
    item_record,
    score_rows,
)
from pipeline.core.types import ChatRequest, EndpointConfig

# The columns that identify a result row (a benchmark may add its own, e.g. SummHay's domain).
RESULT_KEYS = ("benchmark", "system", "setting", "judge", "model")

P = TypeVar("P", bound=BenchmarkParams)  # the benchmark's params section
D = TypeVar("D", bound=BaseModel)  # one line of datasets/<name>.jsonl
I = TypeVar("I")  # one item: what one generation answers  # noqa: E741


# ---------------------------------------------------------------- what the stage layer hands in


class Inputs(Protocol):
    """Read access to the project's files (paths relative to the project, as in params.yaml and
    dvc.yaml). Errors name the file (and line)."""

    def json(self, path: str) -> Any: ...

    def jsonl(self, path: str) -> list[tuple[str, Any]]:
        """Each non-empty line parsed, with where it is (`<path>:<line>`)."""
        ...

    def exists(self, path: str) -> bool: ...

    def text(self, path: str) -> str: ...

    def glob(self, folder: str, pattern: str) -> list[str]:
        """The files of a folder that match a glob pattern, sorted (as paths like `folder`)."""
        ...


Embed: TypeAlias = Callable[[Sequence[str]], Any]  # texts -> array (len(texts), dim)
EMBED_LOCAL = "local"  # Benchmark.embedding: the local MiniLM (pipeline.llm.embeddings)


@dataclass(frozen=True)
class Context(Generic[P]):
    """What a benchmark method gets: the params (the core and its own section), its prompt files
    loaded, read access to inputs and the raw-data folder the stage was given (`--data`)."""

    params: Params
    section: P
    prompts: Mapping[str, Prompt]
    inputs: Inputs
    data_dir: str
    # Unit-length vectors of texts (one row per text), when the judge being run asked for
    # embeddings (Benchmark.embedding): the stage layer makes the calls, journaled.
    embed: Embed | None = None

    def prompt(self, name: str) -> Prompt:
        try:
            return self.prompts[name]
        except KeyError:
            raise ConfigError(f"no prompt {name!r} in this benchmark's prompts section") from None


# ---------------------------------------------------------------- model requests


WHOLE = ""  # the target of an ask whose answer is one value (not one per reference unit)
Parsed: TypeAlias = tuple[dict[str, Any], dict[str, str]]
# (answer text, targets still wanted) -> (value by target, problem by target)
Parser: TypeAlias = Callable[[str | None, Sequence[str]], Parsed]


@dataclass(frozen=True)
class Ask:
    """One request and the parser of its answer. A parser raises nothing: it returns the values
    it could read and a problem (shown to the model in the repair) for every target it could not.
    `targets` are what the answer must give a value for (one per reference unit for a batched
    judge prompt; `(WHOLE,)` for a single value). `repair` is the prompt of the one repair request
    (filled with `${problem}`); None: no repair, an unreadable target is invalid at once."""

    request: ChatRequest
    parse: Parser
    targets: tuple[str, ...] = (WHOLE,)
    repair: Prompt | None = None


def single(parse: Callable[[str | None], Any]) -> Parser:
    """A parser for an ask with one target, from a function that returns the value or raises
    `pipeline.core.parse.ParseError`."""
    from pipeline.core.parse import ParseError

    def parser(text: str | None, targets: Sequence[str]) -> Parsed:
        (target,) = targets
        try:
            return {target: parse(text)}, {}
        except ParseError as e:
            return {}, {target: str(e)}

    return parser


@dataclass
class Answer:
    """What the judge loop made of one ask: a value per target it could read (after at most one
    repair), the problem (with the raw answer) of every target it could not, and the request
    failures (after the model layer's retries)."""

    ask: Ask
    values: dict[str, Any] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors and not self.invalid

    @property
    def value(self) -> Any:
        return self.values[WHOLE]

    @property
    def failure(self) -> str:
        """Why a single-value ask has no value."""
        if self.errors:
            return "request failed: " + "; ".join(self.errors[:3])
        return "; ".join(self.invalid.values()) or "no value"


class Asker(Protocol):
    """Sends asks through the model layer and the judge loop (the stage layer's), in one batch."""

    def __call__(self, asks: Sequence[Ask], step: str) -> list[Answer]: ...


@dataclass(frozen=True)
class Constructed(Generic[D]):
    """A constructed dataset: its records, the items that failed (written without them; the stage
    then fails, exit 3), and a line for the log."""

    records: list[D]
    failures: list[tuple[str, str]] = field(default_factory=list)
    summary: str = ""
    # side files (name -> JSON content) written to datasets/<name>/ when the benchmark declares
    # `construct_files` (the folder is then a stage output)
    files: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Planned:
    """One generation to make: the request, and what its record holds besides the answer."""

    request: ChatRequest
    item_id: str
    system: str
    setting: str
    sample: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JudgeTask:
    """The judging of one generation: its reference units (`targets`, in the verdicts' order) and
    the asks that answer them (one per unit, or one for all)."""

    generation: Generation
    targets: tuple[str, ...]
    asks: tuple[Ask, ...]
    prompt_sha: str  # the judge's prompts (what its verdicts' `judge_prompt_sha` records)


@dataclass(frozen=True)
class JudgePrompts:
    """An LLM judge entry's prompts: the one its `mode` uses, the repair prompt, and whether it
    asks for a JSON object."""

    prompt: Prompt
    repair: Prompt
    mode: str
    response_format: dict[str, Any] | None

    @property
    def sha(self) -> str:
        return combined_sha(self.prompt, self.repair)

    @classmethod
    def of(
        cls,
        ctx: Context[Any],
        spec: OpenAIJudge,
        per_unit: str,
        batched: str | None,
        repair: str,
        schemas: Mapping[str, dict[str, Any]] | None = None,
    ) -> JudgePrompts:
        """The entry's prompts, named as the benchmark's prompts section names them, and the
        structured-output request for the one it uses (`schemas`: prompt name -> JSON schema of
        its answer)."""
        mode = spec.mode if batched is not None else "per_insight"
        name = batched if mode == "batched" and batched else per_unit
        return cls(
            ctx.prompt(name),
            ctx.prompt(repair),
            mode,
            response_format(spec, (schemas or {}).get(name), name),
        )


def response_format(
    spec: OpenAIJudge, schema: dict[str, Any] | None, name: str
) -> dict[str, Any] | None:
    """The `response_format` an entry asks for (see `OpenAIJudge.structured`). Without a schema
    for the prompt, a schema form falls back to a plain JSON object."""
    kind = spec.structured or ("json_object" if spec.json_mode else None)
    if kind is None:
        return None
    if schema is None or kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": False}}


def label_parser(unit: str, parse: Callable[[str | None], str]) -> Parser:
    """The parser of a one-unit answer whose verdict is a label (`parse` raises ParseError):
    the label, with the answer as the verdict's raw text."""

    def verdict(text: str | None) -> Verdict:
        return Verdict(target_id=unit, label=parse(text), raw=(text or "").strip())

    return single(verdict)


def judge_task(
    generation: Generation,
    units: Sequence[str],
    prompts: JudgePrompts,
    one: Callable[[str], str],
    parse_one: Callable[[str], Parser],
    every: Callable[[], str] | None = None,
    parse_every: Parser | None = None,
    *,
    key: Callable[[str], str] | None = None,
) -> JudgeTask:
    """The asks that judge one output: one per reference unit (`per_insight` mode: request key
    `<generation id>#<unit>`, content `one(unit)`, parser `parse_one(unit)`), or one for all of
    them (`batched`, when the benchmark has a batched prompt: key `<generation id>`, content
    `every()`, parser `parse_every`). `key(unit)` names a unit's request when it does not depend
    on the output (the judge loop then sends a key once, however many outputs share it)."""
    gid = generation.generation_id
    unit_key = key or (lambda u: f"{gid}#{u}")

    def request(key: str, content: str) -> ChatRequest:
        messages = [{"role": "user", "content": content}]
        return ChatRequest(key, messages, prompts.sha, 0, None, prompts.response_format)

    if prompts.mode == "batched" and every is not None and parse_every is not None:
        asks: tuple[Ask, ...] = (
            Ask(request(gid, every()), parse_every, tuple(units), prompts.repair),
        )
    else:
        asks = tuple(
            Ask(request(unit_key(u), one(u)), parse_one(u), (u,), prompts.repair) for u in units
        )
    return JudgeTask(generation, tuple(units), asks, prompts.sha)


# ---------------------------------------------------------------- coverage judges


@dataclass(frozen=True)
class CoverageCase:
    """How a coverage judge sees one output: the reference units (id, text) to look for and the
    output cut into bullets (summary bullets, answer sentences)."""

    targets: list[tuple[str, str]]
    bullets: list[str]


class CoverageVerdictLike(Protocol):
    @property
    def label(self) -> str: ...  # FULL_COVERAGE | PARTIAL_COVERAGE | NO_COVERAGE

    @property
    def bullet(self) -> int | None: ...  # 1-based

    @property
    def proba(self) -> tuple[float, float, float]: ...


class CoverageJudge(Protocol):
    """A judge that says, per reference unit, whether a list of bullets covers it (the local
    judge, or a benchmark's own no-model judge)."""

    @property
    def sha(self) -> str: ...

    def judge_many(
        self, cases: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> Sequence[Sequence[CoverageVerdictLike]]: ...


class Coverage(ABC, Generic[P, I]):
    """Coverage judging, an optional capability (like `agreement`): how a coverage judge (the
    local judge, or a no-model judge the benchmark defines) sees one output."""

    @abstractmethod
    def cases(self, ctx: Context[P], item: I, generation: Generation) -> list[CoverageCase]:
        """What the judge looks at: usually one case (the reference units against the output's
        bullets); several when units must be judged against parts of the output apart (their
        target ids unique across the cases)."""

    @abstractmethod
    def verdict(self, target: str, verdict: CoverageVerdictLike) -> Verdict:
        """A coverage judge's verdict on one reference unit, in this benchmark's labels."""

    def judge(self, spec: JudgeSpec) -> CoverageJudge | None:
        """A no-model coverage judge of a provider this benchmark defines, if `spec` is one."""
        return None


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Run:
    """The generations of one model entry and one judge's judgements of them, with where each
    record was read (`<file>:<line>`, parallel to the lists; empty when built in memory)."""

    model: str
    judge: str
    generations: Sequence[Generation]
    judgements: Sequence[Judgement]
    generation_lines: Sequence[str] = ()
    judgement_lines: Sequence[str] = ()


@dataclass(frozen=True)
class RunRow:
    """One MLflow run: what the benchmark knows of it. The stage layer adds the lineage (the
    model and judge entries, providers and prompt hashes, dataset digest, DVC stage digests, git,
    runtime), the usage counters of the pair's stages and the judge's kappa against people.
    `plots` are PNG files (their digest is the run's `lfbench.plots_sha`)."""

    key: str
    name: str
    metrics: dict[str, float]
    params: dict[str, str]
    tags: dict[str, str]
    artifacts: Mapping[str, list[dict[str, Any]] | dict[str, Any] | bytes] = field(
        default_factory=dict
    )
    plots: Mapping[str, bytes] = field(default_factory=dict)
    model: str | None = None  # result rows: the model and judge entries whose stages made it
    judge: str | None = None


@dataclass(frozen=True)
class Aggregated:
    """A benchmark's results: the metrics file (`{"rows": [...], ...}`), its summary for `dvc
    metrics diff`, the report (markdown), one MLflow run per row, and the report's figures
    (file name -> PNG, written beside the report; the report links them by name)."""

    metrics: dict[str, Any]
    summary: dict[str, Any]
    report: str
    runs: list[RunRow]
    figures: Mapping[str, bytes] = field(default_factory=dict)  # PNG files beside the report


@dataclass(frozen=True)
class ReportSection:
    """A benchmark's part of `lfbench report`: markdown lines and (caption, PNG) figures."""

    lines: list[str]
    figures: list[tuple[str, bytes]] = field(default_factory=list)


# ---------------------------------------------------------------- optional capabilities


@dataclass(frozen=True)
class JudgeInfo:
    """Where one judge's labels on the human-annotated set come from."""

    source: str
    provider: str
    sha: str
    cost_usd: float | None = None
    # For the judge card (pipeline/core/cards.py): the verdicts this judge made here; whether
    # it calls no paid model (its cost is 0); answers that came without token usage (its cost
    # is unknown); the measured wall time of its judging, what the clock covered and the stage
    # that records it as run state (None: not timed, e.g. replayed from a release).
    n_judgements: int = 0
    free: bool = False
    usage_missing: int = 0
    wall_s: float | None = None
    timed: str = ""
    timing_stage: str | None = None


@dataclass(frozen=True)
class AgreementResult:
    rows: list[dict[str, Any]]
    report: str
    plot: bytes | None


class HumanAgreement(ABC, Generic[P, I]):
    """How far each judge agrees with human labels (the agreement stage). The labelled set is
    opaque to the stage layer: it only passes it back."""

    @abstractmethod
    def load(self, ctx: Context[P], raw: Any, file: str) -> Any:
        """The labelled set from the labels file (validated; errors name file, item, field)."""

    @abstractmethod
    def released(self, labelled: Any) -> dict[str, Any]:
        """The labels of the judges released with the labelled set, by judge name."""

    @abstractmethod
    def to_judge(self, labelled: Any) -> tuple[dict[str, I], list[Generation]]:
        """The labelled outputs as items and generations, for the project's judges to score."""

    @abstractmethod
    def labels(self, labelled: Any, judgements: Sequence[Judgement]) -> Any:
        """A project judge's labels on the labelled set, from its judgements of `to_judge`."""

    @abstractmethod
    def units(self, judgements: Sequence[Judgement]) -> Any:
        """A judge's labels on the pipeline's outputs (for judge vs judge)."""

    @abstractmethod
    def judge_vs_judge(self, section: P) -> bool: ...

    def llm_samples(self, section: P) -> int | None:
        """How many of the labelled outputs (the first N) an LLM judge scores; None: all."""
        return None

    @abstractmethod
    def evaluate(
        self,
        ctx: Context[P],
        labelled: Any,
        judged: Mapping[str, Any],
        info: Mapping[str, JudgeInfo],
        pipeline: Mapping[str, Any],
        labels_digest: str,
    ) -> AgreementResult:
        """Rows (one per judge against people, one per two judges on the pipeline's outputs),
        the report and its plot."""

    @abstractmethod
    def run_rows(self, ctx: Context[P], rows: Sequence[Mapping[str, Any]]) -> list[RunRow]:
        """One MLflow run per agreement row."""


@dataclass(frozen=True)
class AuditScale:
    """The labels a person gives one verdict in an audit (the judge's own labels, in order), the
    value each is worth in the row metric they average to (`metric`: the mean of the values
    over the row's units, or over its items of their units' mean, is that metric), and one line
    saying what they mean."""

    name: str  # the assessment's name in MLflow (e.g. "coverage")
    labels: tuple[str, ...]
    values: Mapping[str, float]
    metric: str | None  # None: the verdicts average to none of the row's metrics (kappa only)
    meaning: str
    # The metric is a mean over items of each item's mean over its units (a macro average, e.g.
    # Long²RAG's KPR), not a mean over all units pooled (SummHay's Coverage).
    per_item: bool = False


class Audit(ABC, Generic[P, I]):
    """People audit a judge's verdicts on a run's own outputs (`lfbench audit`), an optional
    capability: the benchmark says what a verdict's scale is and how to show what the judge saw;
    the sampling, the labels (MLflow traces, CSV), kappa and the corrected score are the tool's,
    the same for every benchmark."""

    @abstractmethod
    def scale(self, ctx: Context[P]) -> AuditScale: ...

    @abstractmethod
    def view(self, ctx: Context[P], item: I, generation: Generation, target: str) -> dict[str, str]:
        """What the judge saw when it gave its verdict on reference unit `target` of
        `generation`: named texts, shown to the person as they are."""

    def in_row(
        self, ctx: Context[P], setting: str, item: I, generation: Generation, target: str
    ) -> bool:
        """Whether the verdict on `target` of `generation` counts in the result row of this
        `setting` (of the generation's system and the row's items). Default: the generation's
        setting is the row's (a benchmark that scores one output under several settings, e.g.
        CRUX's cut-offs of a ranking, says which units each one holds)."""
        return generation.setting == setting

    def released(
        self, ctx: Context[P], labelled: Any, judged: Mapping[str, Any]
    ) -> list[PriorLabel]:
        """Labels people already made on released outputs (the `agreement` capability's labelled
        set, and each judge's labels on it, as the agreement stage has them): an audit of the
        released systems. None by default."""
        return []


@dataclass(frozen=True)
class PriorLabel:
    """A person's label on one unit of a released output, with one judge's on the same unit
    (None: the judge's verdict was unusable), and the row that output's system belongs to."""

    judge: str
    system: str
    setting: str
    keys: Mapping[str, str]  # the row keys the output fixes (e.g. SummHay's domain)
    unit: str
    judge_label: str | None
    human_label: str


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


class JudgeTraining(ABC, Generic[P]):
    """Released judgements a benchmark offers to train the local judge on."""

    @abstractmethod
    def cases(self, ctx: Context[P], spec: LocalJudge, annotated_path: str) -> TrainingData:
        """Training and held-out cases; never a case from the human-annotated set's groups."""


class Scorer(ABC):
    """Scores a user's own outputs against references without the pipeline (`lfbench score`):
    each line `{"id", "generation", "reference"}` back with `metrics` (or `error` where the
    line cannot be scored). The pipeline's aggregate uses the same functions."""

    @abstractmethod
    def score_line(self, generation: str, reference: str) -> dict[str, float]:
        """The metrics of one output; raises ValueError (the `error` written) when it cannot be
        scored (e.g. an empty output)."""


# ---------------------------------------------------------------- the contract


class Benchmark(ABC, Generic[P, D, I]):
    """One benchmark (see the module docstring). Subclasses set the class attributes and
    implement the abstract methods; mypy checks them against these signatures."""

    name: ClassVar[str]
    title: ClassVar[str] = ""  # for reports (default: the name)
    # Bump when a prompt, parser or metric of the benchmark changes meaning.
    version: ClassVar[str]
    params_model: ClassVar[type[BenchmarkParams]]
    record: ClassVar[type[BaseModel]]  # one line of datasets/<name>.jsonl
    # The core providers it can generate with and be judged by (plus its own, below).
    model_providers: ClassVar[frozenset[str]] = frozenset({"openai", "baseline"})
    judge_providers: ClassVar[frozenset[str]] = frozenset({"openai", "local"})
    model_specs: ClassVar[tuple[type[OwnedModel], ...]] = ()  # providers it defines
    judge_specs: ClassVar[tuple[type[OwnedJudge], ...]] = ()
    agreement: HumanAgreement[Any, Any] | None = None
    coverage: Coverage[Any, Any] | None = None  # coverage judging (the local judge, ...)
    judge_training: JudgeTraining[Any] | None = None
    scorer: Scorer | None = None
    audit: Audit[Any, Any] | None = None  # people audit a judge on a run (`lfbench audit`)
    construct_files: ClassVar[bool] = False  # construct writes side files (Constructed.files)
    # Headline metrics of its result rows, for DVC plots: the aggregate stage writes
    # reports/<name>.points.json (one point per run: its name and these metrics); () writes none.
    plotted: ClassVar[tuple[str, ...]] = ()

    def check_params(self, section: P, params: Params) -> None:
        """Cross-checks between the section and the model/judge entries (raise ValueError)."""

    def construction_llm(self, section: P) -> str | None:
        """The judges entry (provider openai) that construction asks, if it needs a model."""
        return None

    # ---- construct

    @abstractmethod
    def construct(self, ctx: Context[P], ask: Asker | None) -> Constructed[D]:
        """Raw data -> the dataset records, validated. `ask` is None unless
        `construction_llm` names a model."""

    @abstractmethod
    def items(self, dataset: Sequence[D]) -> dict[str, I]:
        """The dataset's items by item id (what generations answer and judges check)."""

    def restrict(self, dataset: Sequence[D], keep: set[str]) -> list[D]:
        """The dataset cut to the items in `keep` (a model's own slice). By default the records
        are the items (each with an `item_id`); a benchmark whose records hold several items
        (SummHay's haystacks, CRUX's collections) cuts inside them."""
        return [r for r in dataset if getattr(r, "item_id", None) in keep]

    # ---- generate

    @abstractmethod
    def plan_generations(
        self, ctx: Context[P], model: str, spec: OpenAIModel, dataset: Sequence[D]
    ) -> list[Planned]:
        """The requests a model behind an OpenAI-compatible endpoint is sent."""

    @abstractmethod
    def offline_generations(
        self, ctx: Context[P], model: str, spec: ModelSpec, dataset: Sequence[D]
    ) -> list[Generation]:
        """Outputs that need no model call: baselines, a replayed release, own providers."""

    # ---- judge

    # The prompts of an LLM judge in the benchmark's prompts section: per reference unit, for all
    # units at once (None: no batched form; `mode: batched` then judges per unit), the repair.
    judge_prompts: ClassVar[tuple[str, str | None, str]]
    # The JSON schema of each judge prompt's answer, for entries that ask for structured output
    # with a schema (`OpenAIJudge.structured`); a prompt without one gets a plain JSON object.
    judge_schemas: ClassVar[Mapping[str, dict[str, Any]]] = {}

    def judge_tasks(
        self,
        ctx: Context[P],
        judge: str,
        spec: OpenAIJudge,
        items: Mapping[str, I],
        gens: Sequence[Generation],
    ) -> list[JudgeTask]:
        """The requests an LLM judge is sent for each (ok) generation, with their parsers."""
        prompts = JudgePrompts.of(ctx, spec, *self.judge_prompts, schemas=self.judge_schemas)
        return [self.judge_task(g, items[g.item_id], prompts) for g in gens]

    @abstractmethod
    def judge_task(self, generation: Generation, item: I, prompts: JudgePrompts) -> JudgeTask:
        """The asks that judge one generation (`judge_task` below builds them)."""

    def embedding(self, spec: JudgeSpec) -> str | EndpointConfig | None:
        """The embeddings a no-model judge of this benchmark needs: None, EMBED_LOCAL, or an
        OpenAI-compatible endpoint; the stage layer then gives `offline_judgements` a context
        whose `embed` makes them."""
        return None

    def offline_judgements(
        self,
        ctx: Context[P],
        judge: str,
        spec: JudgeSpec,
        dataset: Sequence[D],
        gens: Sequence[Generation],
    ) -> list[Judgement]:
        """Judgements that need no model: a replayed release (provider published)."""
        raise ConfigError(f"judges.{judge}: {self.name} has no released judgements to replay")

    # ---- aggregate and report

    # The result model (pipeline/core/results.py): the metrics, declared once (the first is the
    # main one: headlines, plots, rankings), the row keys the benchmark adds to (model, system,
    # setting, judge), and what an ok generation without a judgement is: an error, or counted
    # (`n_unjudged`, e.g. a judge that rates a sample).
    metrics: ClassVar[tuple[Metric, ...]] = ()
    group_keys: ClassVar[tuple[str, ...]] = ()
    unjudged: ClassVar[Literal["error", "count"]] = "error"

    def item_score(
        self, ctx: Context[P], item: Any, generation: Generation, judgement: Judgement
    ) -> Outcome:
        """One judged generation's score (`Scored`), or why it is left out (`Excluded`,
        `Invalid`). Benchmarks that declare `metrics` implement it."""
        raise NotImplementedError(f"{self.name} declares no item scores")

    def scored_items(self, dataset: Sequence[D]) -> Mapping[str, Any]:
        """What `item_score` and `failed_keys` get for each item id (default: `items`; e.g.
        SummHay's subtopic with its haystack)."""
        return self.items(dataset)

    def failed_keys(
        self, ctx: Context[P], item: Any, generation: Generation
    ) -> Sequence[Mapping[str, str]]:
        """The `group_keys` of each row a failed or unjudged generation counts in."""
        return [{}]

    def failed_outcome(
        self, ctx: Context[P], item: I, generation: Generation
    ) -> Invalid | Excluded | None:
        """A failed generation the benchmark counts as an invalid or excluded item, with its
        reason and row keys (e.g. an empty output its metrics cannot score); None (default):
        counted as a failed generation."""
        return None

    def row_extra(self, ctx: Context[P], row: ResultRow, scores: Sequence[ItemScore]) -> None:
        """Add the benchmark's own columns to a row (`row.extra`), e.g. its knobs."""

    def row_order(self, row: ResultRow) -> tuple[Any, ...]:
        return (row.system, row.setting, row.judge, row.model, *row.keys.values())

    def aggregate(self, ctx: Context[P], dataset: Sequence[D], runs: Sequence[Run]) -> Aggregated:
        """Judgements -> rows, the metrics file, its summary, the report and the MLflow runs.
        By default all of it from the declared `metrics` and `item_score`; a benchmark with
        paper-specific tables adds them around `score`."""
        rows, scores = self.score(ctx, dataset, runs)
        return self.aggregated(rows, scores)

    def score(
        self, ctx: Context[P], dataset: Sequence[D], runs: Sequence[Run]
    ) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
        """The typed rows, sorted (`row_order`), and per row key the item scores behind it."""
        if not self.metrics:
            raise NotImplementedError(f"{self.name} declares no metrics")
        if self.metrics[0].higher_is_better is None:  # it ranks the rows
            raise NotImplementedError(f"{self.name}: the main metric must have a better direction")
        scoring = score_rows(
            self.name,
            self.metrics,
            runs,
            self.scored_items(dataset),
            lambda item, g, j: self.item_score(ctx, item, g, j),
            group_keys=self.group_keys,
            unjudged=self.unjudged,
            failed_keys=lambda item, g: self.failed_keys(ctx, item, g),
            failed_outcome=lambda item, g: self.failed_outcome(ctx, item, g),
        )
        models = getattr(getattr(ctx, "params", None), "models", {})
        seed = getattr(getattr(ctx, "params", None), "seed", 0)
        main = self.metrics[0]
        for row in scoring.rows:
            low, high = interval(main, scoring.items[row.key], seed)
            row.metrics[f"{main.name}_ci_low"], row.metrics[f"{main.name}_ci_high"] = low, high
            self.row_extra(ctx, row, scoring.items[row.key])
            cut = getattr(models.get(row.model), "slice", {}).get(self.name)
            if cut is not None:  # the model's own slice: say which items the row covers
                row.extra["slice"] = cut.describe()
        return sorted(scoring.rows, key=self.row_order), scoring.items

    def aggregated(
        self,
        rows: Sequence[ResultRow],
        scores: Mapping[RowKey, Sequence[ItemScore]],
        *,
        metrics: Mapping[str, Any] | None = None,
        report: Sequence[str] = (),
        figures: Mapping[str, bytes] | None = None,
        table: bool = True,
    ) -> Aggregated:
        """The metrics file (`rows` plus the benchmark's other sections), its summary, the
        report (the generic table unless `table` is False, then `report` lines) and one MLflow
        run per row."""
        from pipeline.core.markdown import results_table

        flat = [r.flat() for r in rows]
        title = self.title or self.name
        return Aggregated(
            metrics={"rows": flat, **(metrics or {})},
            summary=self.summary(rows),
            report="\n".join(
                [f"# {title}", "", *(results_table(self.metrics, flat) if table else []), *report]
            ).rstrip()
            + "\n",
            runs=[self.run_row(r, scores.get(r.key, ())) for r in rows],
            figures=figures or {},
        )

    def summary(self, rows: Sequence[ResultRow]) -> dict[str, Any]:
        """{judge: {system/setting[/keys]: main metric}} for `dvc metrics show/diff`."""
        main = self.metrics[0].name
        out: dict[str, dict[str, float | None]] = {}
        for r in rows:
            name = "/".join([r.system, r.setting, *r.keys.values()])
            out.setdefault(r.judge, {})[name] = r.metrics.get(main)
        return out

    def run_row(self, row: ResultRow, scores: Sequence[ItemScore]) -> RunRow:
        """One MLflow run: the metrics and counters as metrics, the row's keys as params, the
        item scores (what `lfbench compare` pairs) and the row as artifacts."""
        numbers = {k: float(v) for k, v in row.metrics.items() if v is not None}
        numbers |= {k: float(getattr(row.counts, k)) for k in COUNTERS}
        numbers |= {k: float(v) for k, v in row.spend.model_dump().items()}
        numbers |= {
            k: float(v)
            for k, v in row.extra.items()
            if k.startswith("n_") and isinstance(v, int | float) and not isinstance(v, bool)
        }
        ident = {"system": row.system, "setting": row.setting, "judge": row.judge, **row.keys}
        return RunRow(
            key="|".join(row.key),
            name=" / ".join(ident.values()),
            metrics=numbers,
            params={**ident, "model": row.model},
            tags={"setting": row.setting, "model.name": row.system, **row.keys},
            artifacts={"items.jsonl": [item_record(s) for s in scores], "row.json": row.flat()},
            model=row.model,
            judge=row.judge,
        )

    def report_section(self, metrics: Mapping[str, Any], where: str) -> ReportSection:
        """This benchmark's part of `lfbench report`, from its metrics file (`where`)."""
        from pipeline.core.markdown import need, results_table

        rows = metrics["rows"]
        for n, r in enumerate(rows, 1):
            need(r, ("system", "setting", "judge", *(m.name for m in self.metrics)), where, n)
        return ReportSection([f"From {where}.", "", *results_table(self.metrics, rows)])


AnyBenchmark: TypeAlias = Benchmark[Any, Any, Any]
# Short names for the signatures of the benchmark packages.
Gens: TypeAlias = Sequence[Generation]
Rows: TypeAlias = list[dict[str, Any]]  # a metrics file's rows
Details: TypeAlias = dict[tuple[str, ...], list[dict[str, Any]]]  # item-level detail per row
