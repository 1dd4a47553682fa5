"""The benchmark contract: what a benchmark package provides, and what it must not do.

A benchmark (`pipeline/benchmarks/<name>/`) is pure: it reads no file, calls no model and logs
nothing to MLflow. Its core, as a subclass of `Benchmark`:

- its params model (`params_model`, the `<name>:` section of params.yaml), its dataset record
  (`record`), the model providers it runs (`model_providers`) and those it defines (`providers`);
- how to build and read its items (`construct`, `items`), reading raw files only through the
  `Inputs` it is handed and asking a model only through the `Asker` it is handed;
- how to prompt a model for an item (`plan_generations`) and the outputs that need no model
  (`offline_generations`: baselines, replayed releases, its own providers);
- its metrics, declared (`metrics`, `results`), and how one judged output scores (`item_score`):
  both required.

Everything else is an optional capability, declared once as an attribute (None: it has none):
`llm_judge` (`LLMJudge`), `coverage` (the local judge, or a coverage judge of its own),
`no_model_judge`, `agreement` (judges against human labels), `audit` (people audit a judge on a
run's outputs: a verdict's label scale and what the judge saw), `paper` (a paper's own tables
and figures), `retrieval` (the user's retrievers) and `systems` (whole RAG systems as models).
What one paper alone needs is an extension (`extensions`, pipeline/core/extensions.py: SummHay's
released judgements, the local judge's training cases and haystacks of several items; CRUD-RAG's
`lfbench score` and empty outputs counted as items). The judge providers a benchmark offers
follow from what it declares (`judge_providers`), and how it runs a judge entry is resolved once
(`judge_kind`); both in pipeline/core/judging.py.

The stage layer (`pipeline/stages/`) does everything else, the same way for every benchmark:
file reads and atomic writes, every model call (cache, journal, retries, usage and cost), the one
judge loop (first pass, one repair, invalid verdicts counted), the rows, reports and MLflow runs
with their lineage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, Self, TypeAlias, TypeVar

from pydantic import BaseModel

from pipeline.core.config import (
    BenchmarkParams,
    JudgeSpec,
    ModelSpec,
    OpenAIJudge,
    OpenAIModel,
    OwnedJudge,
    OwnedModel,
    Params,
)
from pipeline.core.drawing import Plot
from pipeline.core.errors import ConfigError
from pipeline.core.prompts import Prompt, combined_sha
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.core.results import (
    ItemScore,
    Metric,
    Outcome,
    ResultRow,
    Results,
    RowKey,
)
from pipeline.core.types import ChatRequest, EndpointConfig

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
# A retriever's ranking of one query: (passage id, score), best first
Ranked: TypeAlias = Sequence[tuple[str, float]]
# retriever entry -> {query id: its ranking}, read from the retrieval stage's output
Rankings: TypeAlias = Callable[[str], Mapping[str, Ranked]]


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
    # The rankings of the user's retrievers (the benchmark's `retrievers` entries), made by its
    # retrieval stages: `rankings(name)[query id]`, best first.
    rankings: Rankings | None = None

    def prompt(self, name: str) -> Prompt:
        try:
            return self.prompts[name]
        except KeyError:
            raise ConfigError(f"no prompt {name!r} in this benchmark's prompts section") from None

    def is_retriever(self, name: str) -> bool:
        """Whether `name` is one of the retrievers entries this benchmark runs."""
        return name in self.section.retrievers

    def preload(self, retriever: str) -> None:
        """Read a retriever's rankings now (before work is forked out, say)."""
        if self.rankings is not None:
            self.rankings(retriever)

    def ranked(self, retriever: str, query: str) -> Ranked:
        """A retrievers entry's ranking of one query (`Retrieval.queries` named it), best first:
        a DataError when the retrieval stage's output lacks it."""
        from pipeline.core.errors import DataError

        if self.rankings is None:
            raise ConfigError(f"retriever {retriever!r}: no retrieval outputs were given")
        ranked = self.rankings(retriever).get(query)
        if ranked is None:
            raise DataError(
                f"no ranking of this query by retriever {retriever!r} (re-run its retrieval stage)",
                item=query,
                field=f"retrievers.{retriever}",
            )
        return ranked


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
    # side files (name -> JSON content), written to datasets/<name>/ when there are any (the
    # folder is then a stage output of the benchmark's construct stage)
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


# ---------------------------------------------------------------- the other kinds of judge


@dataclass(frozen=True)
class LLMJudge(Generic[I]):
    """LLM judging, an optional capability: the judge entries of provider `openai`. `task`
    builds the asks that judge one output (`judge_task()` above); `prompt`, `batched` and
    `repair` name the judge's prompts in the benchmark's prompts section (`batched`: all units
    in one call, for entries with `mode: batched`; None: no batched form), `schemas` the JSON
    schema of each prompt's answer (for entries that ask for structured output with a schema).
    `rates(ctx, item)`: whether an LLM judge rates this item (default: every item; e.g. CRUX
    rates a sample)."""

    task: Callable[[Generation, I, JudgePrompts], JudgeTask]
    prompt: str = "judge"
    batched: str | None = None
    repair: str = "repair"
    schemas: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    rates: Callable[[Context[Any], I], bool] | None = None

    def tasks(
        self,
        ctx: Context[Any],
        spec: OpenAIJudge,
        items: Mapping[str, I],
        gens: Sequence[Generation],
    ) -> list[JudgeTask]:
        """The judge tasks of the (ok) generations this judge rates."""
        prompts = JudgePrompts.of(
            ctx, spec, self.prompt, self.batched, self.repair, schemas=self.schemas
        )
        rates = self.rates
        return [
            self.task(g, items[g.item_id], prompts)
            for g in gens
            if rates is None or rates(ctx, items[g.item_id])
        ]


class NoModelJudge(ABC, Generic[P, I]):
    """A judge of the benchmark's own providers (`providers`) that needs no model and is not
    a coverage judge (e.g. CRUX's labels, CRUD-RAG's text metrics), an optional capability."""

    @abstractmethod
    def judgements(
        self,
        ctx: Context[P],
        judge: str,
        spec: JudgeSpec,
        items: Mapping[str, I],
        gens: Sequence[Generation],
    ) -> list[Judgement]:
        """The judgements of `gens` (ok generations of known items)."""

    def embedding(self, spec: JudgeSpec) -> str | EndpointConfig | None:
        """The embeddings this judge needs: None, EMBED_LOCAL, or an OpenAI-compatible
        endpoint; the stage layer then gives `judgements` a context whose `embed` makes them."""
        return None


SpecT = TypeVar("SpecT", OwnedModel, OwnedJudge)


def own_specs(bench: AnyBenchmark, kind: type[SpecT]) -> tuple[type[SpecT], ...]:
    """The model (kind OwnedModel) or judge (OwnedJudge) providers a benchmark defines."""
    return tuple(c for c in bench.providers if issubclass(c, kind))


def llm_capability(bench: AnyBenchmark) -> LLMJudge[Any]:
    """The benchmark's LLM judging (a ConfigError if it has none)."""
    if bench.llm_judge is None:
        raise ConfigError(f"{bench.name} has no LLM judging (judge provider openai)")
    return bench.llm_judge


# ---------------------------------------------------------------- your retrievers, your system


@dataclass(frozen=True)
class Passage:
    """A retrievable text with the id a ranking (and a TREC run file) names it by."""

    id: str
    text: str


@dataclass(frozen=True)
class RetrievalQuery:
    """What a retriever ranks for one query: the query text, the candidate passages (the item's
    documents, or a shared corpus), how many of the best to keep (None: all), and the rankings
    the benchmark already has for it (released ones, by name: what a reranker may re-order)."""

    id: str
    text: str
    passages: Sequence[Passage]
    depth: int | None = None
    rankings: Mapping[str, Sequence[str]] = field(default_factory=dict)


class Retrieval(ABC, Generic[P, D]):
    """Retrieval by the user's retrievers, an optional capability: the queries a retriever
    ranks (its retrieval stage, `<benchmark>-retrieve@<entry>`, ranks them once for every model);
    the benchmark then reads the rankings through `Context.ranked` where a setting names the
    entry. `reserved` are names the benchmark gives its own settings or rankings: an entry may
    not take one (`oracle`, `full`, ...)."""

    reserved: ClassVar[tuple[str, ...]] = ()

    def retriever_of(self, ctx: Context[P], setting: str) -> str | None:
        """The retrievers entry a result row's setting used, if any (its MLflow run names it;
        `lfbench compare` finds rows by it). Default: the setting is the entry's name."""
        return setting if ctx.is_retriever(setting) else None

    def side_by_side(
        self, params: Params, rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str, str, float]]:
        """(retriever, what was measured, value) of the result rows that used a retriever (a
        RAG system counts as its own): `lfbench report` sets them side by side across
        benchmarks (a context's coverage next to the coverage of the answers made from it)."""
        return []

    @abstractmethod
    def queries(
        self, ctx: Context[P], dataset: Sequence[D], retriever: str
    ) -> list[RetrievalQuery]:
        """What `retriever` (an entry the section lists) ranks: usually every item's query
        over its documents, whatever the retriever; a benchmark whose candidates depend on the
        settings that name it (CRUD-RAG's chunkings) asks for those only."""


@dataclass(frozen=True)
class Question:
    """What a whole RAG system is asked for one item: the question, the item's documents (it
    retrieves from them itself), and in words what the answer should be (`task`)."""

    id: str  # the item id
    question: str
    documents: Sequence[Passage]
    task: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SystemAnswer:
    """A RAG system's answer to one question: the text, and optionally the ids of the documents
    it used (its context: judged by CRUX) and, per sentence or bullet, the ids it cites."""

    answer: str
    passages: tuple[str, ...] | None = None
    citations: tuple[tuple[str, ...], ...] | None = None


class Systems(ABC, Generic[P, D]):
    """Whole RAG systems as models (providers `python` and `outputs`), an optional capability:
    what such a system is asked for each item, and how its answer becomes this benchmark's
    output. The stage layer calls the system (or reads its answers), journaled."""

    @abstractmethod
    def questions(self, ctx: Context[P], dataset: Sequence[D]) -> list[Question]: ...

    @abstractmethod
    def generation(
        self, ctx: Context[P], model: str, system: str, question: Question, answer: SystemAnswer
    ) -> Generation:
        """The output of a system's answer (an error generation when it cannot be one)."""

    def setting(self, model: str, system: str) -> str:
        """The setting of a system's outputs (default `own`: its own retrieval)."""
        return "own"


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
    `plots` are PNG files, as bytes or as a `Plot` drawn only when the run is logged (their
    digest is the run's `lfbench.plots_sha`; a `Plot`'s is its key, known without drawing)."""

    key: str
    name: str
    metrics: dict[str, float]
    params: dict[str, str]
    tags: dict[str, str]
    artifacts: Mapping[str, list[dict[str, Any]] | dict[str, Any] | bytes] = field(
        default_factory=dict
    )
    plots: Mapping[str, bytes | Plot] = field(default_factory=dict)
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


@dataclass(frozen=True)
class Tables:
    """What a paper's own tables and figures add to the results: sections of the metrics file
    beside `rows`, report lines after the results table (`table=False`: the paper's layouts
    show every row instead; `report_text`: the whole report, in the paper's order), figures
    beside the report, runs of its own, and summary entries. Made by the aggregate stage only
    (a model's results stage makes its rows and their runs, `Paper.run_change`, not these)."""

    sections: Mapping[str, Any] = field(default_factory=dict)
    report: Sequence[str] = ()
    table: bool = True
    report_text: str | None = None
    figures: Mapping[str, bytes] = field(default_factory=dict)
    runs: Sequence[RunRow] = ()
    summary: Mapping[str, Any] = field(default_factory=dict)


class Paper(Generic[P, D]):
    """A paper's own tables and figures, an optional capability: what only this benchmark's
    paper has (SummHay's Table 2 layout, CRUX's Kendall tau, Long²RAG's judge agreement, ...).
    Each hook does nothing by default."""

    def runs(self, ctx: Context[P], dataset: Sequence[D], runs: Sequence[Run]) -> Sequence[Run]:
        """The runs as the paper scores them (e.g. CRUX: each context at every cut-off)."""
        return runs

    def rows(
        self,
        ctx: Context[P],
        dataset: Sequence[D],
        runs: Sequence[Run],
        rows: list[ResultRow],
        scores: dict[RowKey, list[ItemScore]],
    ) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
        """The rows with the paper's own (e.g. SummHay's rows pooling both domains), ordered."""
        return rows, scores

    def run_change(
        self,
        ctx: Context[P],
        dataset: Sequence[D],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
    ) -> Callable[[RunRow, Mapping[str, Any]], RunRow] | None:
        """A change to each row's run, `change(run, row)` (row: the metrics file's): its plots
        (a `Plot`, drawn only when the run is logged), a statistic of the paper's. Applied by the
        aggregate and by each model's results stage, so keep it cheap: `tables` is for what
        only the aggregate makes."""
        return None

    def tables(
        self,
        ctx: Context[P],
        dataset: Sequence[D],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
        scores: Mapping[RowKey, Sequence[ItemScore]],
    ) -> Tables:
        return Tables()

    def report_section(
        self, metrics: Mapping[str, Any], where: str, table: Callable[[], ReportSection]
    ) -> ReportSection:
        """The benchmark's part of `lfbench report` (`table()`: the results table, its rows
        checked)."""
        return table()


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


# ---------------------------------------------------------------- the contract


class Extension:
    """The base of what one paper needs beyond the contract (pipeline/core/extensions.py): a
    benchmark lists its extensions in `Benchmark.extensions`, the stage layer asks for a kind
    with `Kind.of(bench)`."""

    @classmethod
    def of(cls, bench: Benchmark[Any, Any, Any]) -> Self | None:
        """The benchmark's extension of this kind, if it declares one."""
        found = [e for e in bench.extensions if isinstance(e, cls)]
        if len(found) > 1:
            raise ConfigError(f"{bench.name} declares {len(found)} extensions {cls.__name__}")
        return found[0] if found else None


class Benchmark(ABC, Generic[P, D, I]):
    """One benchmark (see the module docstring). Subclasses set the class attributes and
    implement the abstract members (`metrics`, and the methods marked abstract); mypy checks
    them against these signatures."""

    name: ClassVar[str]
    title: ClassVar[str] = ""  # for reports (default: the name)
    # Bump when a prompt, parser or metric of the benchmark changes meaning.
    version: ClassVar[str]
    params_model: ClassVar[type[BenchmarkParams]]
    record: ClassVar[type[BaseModel]]  # one line of datasets/<name>.jsonl
    # The core providers it can generate with (plus its own, below). The judge providers it
    # offers follow from the judging it declares (`judge_providers`).
    model_providers: ClassVar[frozenset[str]] = frozenset({"openai", "baseline"})
    # The model and judge providers it defines (`<name>-<kind>`: subclasses of OwnedModel or
    # OwnedJudge).
    providers: ClassVar[tuple[type[OwnedModel] | type[OwnedJudge], ...]] = ()

    # ---- optional capabilities (None: the benchmark has no such thing)
    llm_judge: LLMJudge[Any] | None = None  # judging by an LLM (provider openai)
    coverage: Coverage[Any, Any] | None = None  # the local judge, or a coverage judge of its own
    no_model_judge: NoModelJudge[Any, Any] | None = None  # a judge of its own that needs no model
    agreement: HumanAgreement[Any, Any] | None = None  # judges against human labels
    audit: Audit[Any, Any] | None = None  # people audit a judge on a run (`lfbench audit`)
    paper: Paper[Any, Any] | None = None  # a paper's own tables and figures
    retrieval: Retrieval[Any, Any] | None = None  # the user's retrievers (retrieval stages)
    systems: Systems[Any, Any] | None = None  # whole RAG systems as models (python, outputs)
    # What one paper needs beyond these (pipeline/core/extensions.py: released judgements,
    # the local judge's training cases, records of several items, `lfbench score`, failed
    # outputs counted as items), each kind at most once.
    extensions: tuple[Extension, ...] = ()

    def check_params(self, section: P, params: Params) -> None:
        """Cross-checks between the section and the model/judge entries (raise ValueError)."""

    def setting_names(self, section: P) -> Sequence[str] | None:
        """The settings a model entry's `settings` picks from here (None: the benchmark has
        none; a name of a model's list that no benchmark of the model has is refused, see
        `pipeline.core.config.settings_for`)."""
        return None

    # ---- construct

    @abstractmethod
    def construct(self, ctx: Context[P], ask: Asker | None) -> Constructed[D]:
        """Raw data -> the dataset records, validated. `ask` is None unless
        its params section's `construction_llm()` names a model."""

    @abstractmethod
    def items(self, dataset: Sequence[D]) -> dict[str, I]:
        """The dataset's items by item id (what generations answer and judges check)."""

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

    # ---- results: the metrics and rows, declared once (pipeline/core/results.py); the first
    # metric is the main one (headlines, plots, rankings). The stage layer does the rest
    # (pipeline/core/aggregation.py).

    @property
    @abstractmethod
    def metrics(self) -> tuple[Metric, ...]:
        """Its metrics, the main one first: a subclass declares them as a class attribute,
        `metrics = (Metric("recall", ...),)` (at least one)."""

    results: ClassVar[Results] = Results()

    @abstractmethod
    def item_score(
        self, ctx: Context[P], item: Any, generation: Generation, judgement: Judgement
    ) -> Outcome:
        """One judged generation's score (`Scored`), or why it is left out (`Excluded`,
        `Invalid`)."""

    def failed_keys(
        self, ctx: Context[P], item: Any, generation: Generation
    ) -> Sequence[Mapping[str, str]]:
        """The `group_keys` of each row a failed or unjudged generation counts in."""
        return [{}]

    def row_extra(self, ctx: Context[P], row: ResultRow, scores: Sequence[ItemScore]) -> None:
        """Add the benchmark's own columns to a row (`row.extra`), e.g. its knobs."""


AnyBenchmark: TypeAlias = Benchmark[Any, Any, Any]
# Short names for the signatures of the benchmark packages.
Gens: TypeAlias = Sequence[Generation]
