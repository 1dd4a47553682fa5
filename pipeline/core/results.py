"""One result model for every benchmark: declared metrics, per-item scores, the join of items,
generations and judgements, one set of counters, pooled typed rows (pure: no I/O).

A benchmark declares its metrics once (`Metric`: name, direction, unit or range, how it pools
over items) and scores one (item, generation, judgement) at a time (`Benchmark.item_score` ->
`Scored` with `ItemScore`s, or `Excluded` / `Invalid` with a reason). Everything after that is
done here, the same way for every benchmark:

- `join`: every generation matched to its item and to exactly the judgement it should have; an
  orphan or duplicate judgement, a duplicate generation or a generation of an unknown item is a
  `DataError` naming file and line; an ok generation without a judgement is an error unless the
  benchmark's policy counts it (`unjudged="count"`).
- `score_rows`: the counters (`COUNTERS`, the same names in every metrics file, MLflow run and
  report), the pooling of each metric (`mean` of item values, or `ratio` of summed parts), typed
  `ResultRow`s, and per row the item scores behind it (for the MLflow artifact and `lfbench
  compare`'s paired bootstrap).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import fsum
from statistics import fmean, median
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from pipeline.core.errors import DataError
from pipeline.core.parallel import fork_map
from pipeline.core.records import Generation, Judgement

Pool: TypeAlias = Literal["mean", "ratio"]


@dataclass(frozen=True)
class Metric:
    """A metric, declared once: its name in rows and runs, direction, unit or range, and how it
    pools over items: `mean` (the mean of the items' values) or `ratio` (sum of the items'
    numerators over the sum of their denominators, e.g. SummHay's citation over the covered
    insights only). `scale` multiplies the pooled value (x100 for a percentage); `digits` rounds
    it in the metrics file. `higher_is_better=None`: a metric with no better direction (e.g. an
    output's length)."""

    name: str
    title: str = ""
    higher_is_better: bool | None = True
    pool: Pool = "mean"
    scale: float = 1.0
    unit: str = ""
    lo: float | None = None
    hi: float | None = None
    digits: int | None = 6  # None: not rounded
    # A mean summed in item order (plain float addition), as a benchmark's earlier results were
    # computed; default: an exactly rounded sum (fmean), the same whatever the order.
    ordered_sum: bool = False

    @property
    def label(self) -> str:
        return self.title or self.name

    @property
    def direction(self) -> str:
        if self.higher_is_better is None:
            return "no better direction"
        return "higher is better" if self.higher_is_better else "lower is better"


@dataclass(frozen=True)
class ItemScore:
    """One item's contribution to a row: the values of `mean` metrics (None: undefined for this
    item, left out of that metric's mean), the (numerator, denominator) of `ratio` metrics, the
    extra group keys that place it in a row (e.g. SummHay's scoring mode, CRUX's cut-off), and a
    detail record for the row's item artifact."""

    item_id: str
    values: Mapping[str, float | None] = field(default_factory=dict)
    parts: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scored:
    scores: Sequence[ItemScore]
    invalid_verdicts: int = 0  # verdicts the judge could not give, left out of the item's score


@dataclass(frozen=True)
class Excluded:
    """An item the benchmark leaves out of a row by its own rule (e.g. no key points), counted
    under `reason`. `keys` place it in a row when the benchmark groups by more than the run."""

    reason: str
    keys: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Invalid:
    """An item left out because the judge's verdicts on it are unusable (counted `n_invalid`)."""

    reason: str
    invalid_verdicts: int = 0
    keys: Mapping[str, str] = field(default_factory=dict)


Outcome: TypeAlias = Scored | Excluded | Invalid


class Counts(BaseModel):
    """What happened to every generation of a row: the same names in every benchmark."""

    model_config = ConfigDict(extra="forbid")

    n_items: int = 0  # generations of the row (one per item, setting and sample)
    n_scored: int = 0
    n_failed_generations: int = 0  # the model call failed (or the output was empty)
    n_failed_judgements: int = 0  # the judge call failed
    n_unjudged: int = 0  # no judgement (a policy that counts it, e.g. a judge's sample)
    n_invalid: int = 0  # left out: unusable (the judge's verdicts, or the benchmark's rule)
    n_invalid_verdicts: int = 0  # verdicts the judge could not give (in scored items too)
    n_truncated: int = 0  # answers the server cut (length, content filter), kept and scored
    # answers whose prompt and answer went past the model's declared context window (a model
    # fed more than it was trained on answers nonsense); none declared: 0
    n_over_context: int = 0
    n_excluded: int = 0  # left out by the benchmark's rule, reasons in `excluded`
    excluded: dict[str, int] = Field(default_factory=dict)
    invalid_reasons: dict[str, int] = Field(default_factory=dict)  # why, for n_invalid


REASONS = ("excluded", "invalid_reasons")  # the counters by reason
# Counters added after metrics files were written without them: a reader takes them as 0.
LATER_COUNTERS = frozenset({"n_over_context"})
COUNTERS = tuple(k for k in Counts.model_fields if k not in REASONS)


class Spend(BaseModel):
    """What a row's generations and judgements cost (failed ones included)."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, *usages: Any) -> None:
        for u in usages:
            self.input_tokens += u.input_tokens
            self.output_tokens += u.output_tokens
            self.cost_usd += u.cost_usd


# A row whose answers' median copy rate reaches this copies its context (a base model echoes
# its documents): its scores say little about summarising (pipeline/core/copying.py).
COPIED_MEDIAN = 0.8


def row_flags(copy_rate: float | None, counts: Counts) -> list[str]:
    """Why a row's numbers should not be read as they stand: the answers copy their context,
    went past the model's context window, or were cut. Shown wherever the row is (metrics file,
    report, MLflow tag `lfbench.flags`, `lfbench compare`)."""
    out = []
    if copy_rate is not None and copy_rate >= COPIED_MEDIAN:
        out.append(
            f"copied: the answers copy their context (median copy rate {copy_rate:.2f}): a base"
            " model echoing its documents, not a summary"
        )
    if counts.n_over_context:
        out.append(
            f"over context: {counts.n_over_context} of {counts.n_items} prompts went past the"
            " model's context window (context_window): its answers to them can be nonsense"
        )
    if counts.n_truncated:
        out.append(
            f"truncated: {counts.n_truncated} of {counts.n_items} answers were cut (length or"
            " content filter)"
        )
    return out


class ResultRow(BaseModel):
    """One result: who (model entry, system, setting, judge and the benchmark's own keys), the
    pooled metrics, the counters and the benchmark's extra columns (e.g. knobs). `copy_rates`
    are its answers' copy rates (answers of a model with calls), kept to pool rows (`combine`):
    the row holds their median, `copy_rate`, and its `flags`."""

    model_config = ConfigDict(extra="forbid")

    benchmark: str
    model: str
    system: str
    setting: str
    judge: str
    keys: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    counts: Counts = Field(default_factory=Counts)
    spend: Spend = Field(default_factory=Spend)
    extra: dict[str, Any] = Field(default_factory=dict)
    copy_rates: list[float] = Field(default_factory=list, exclude=True)

    @property
    def copy_rate(self) -> float | None:
        """The median copy rate of the row's answers (None: no answer of a model with calls)."""
        return round(median(self.copy_rates), 4) if self.copy_rates else None

    @property
    def flags(self) -> list[str]:
        return row_flags(self.copy_rate, self.counts)

    @property
    def key(self) -> tuple[str, ...]:
        return (self.model, self.system, self.setting, self.judge, *self.keys.values())

    def flat(self) -> dict[str, Any]:
        """The row as the metrics file holds it: keys, metrics, counters, extra columns."""
        return {
            "benchmark": self.benchmark,
            **self.keys,
            "system": self.system,
            "setting": self.setting,
            "judge": self.judge,
            "model": self.model,
            **self.metrics,
            **self.counts.model_dump(),
            **self.spend.model_dump() | {"cost_usd": round(self.spend.cost_usd, 6)},
            "copy_rate": self.copy_rate,
            "flags": self.flags,
            **self.extra,
        }


# ---------------------------------------------------------------- declarations

RowName: TypeAlias = tuple[str, ...] | Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Summary:
    """How the rows appear in `metrics/<name>.summary.json` (what `dvc metrics show/diff` read):
    `{group: {name: value}}`, `group` and `name` each the row's fields joined by `/` (or a
    function of the row). The value is the main metric (`metrics=()`) or `{metric: value}` of
    the metrics named; rounded to `digits`; a None value is kept unless `keep_none` is False."""

    group: RowName = ("judge",)
    name: RowName | None = None  # None: system, setting and the group keys
    metrics: tuple[str, ...] = ()
    digits: int | None = None
    keep_none: bool = True


@dataclass(frozen=True)
class RunFields:
    """What a row's MLflow run shows beside its metrics, counters and keys (all from the row's
    columns): `params` and `tags` (MLflow name -> column), `metrics` (number columns, None left
    out), `breakdowns` (columns `by_<part>` = `{group: {metric: value}}`, logged as metrics
    `<metric>.<part>.<group>`), `section_params` (MLflow name -> a dotted path in the benchmark's
    params section) and the run's `name` (default: its keys joined by ` / `)."""

    params: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    breakdowns: tuple[str, ...] = ()
    section_params: Mapping[str, str] = field(default_factory=dict)
    name: Callable[[Mapping[str, Any]], str] | None = None


@dataclass(frozen=True)
class Results:
    """A benchmark's result rows, declared (beside its `metrics`): the row keys it adds to
    (model, system, setting, judge), what an ok generation without a judgement is (an error, or
    counted `n_unjudged`, e.g. a judge that rates a sample), the rows' order, the metrics its DVC
    plots show (`reports/<name>.points.json`, the first on the plot of dvc.yaml; None: the main
    metric), the summary and the MLflow runs."""

    group_keys: tuple[str, ...] = ()
    unjudged: Literal["error", "count"] = "error"
    order: Callable[[ResultRow], tuple[Any, ...]] | None = None
    plotted: tuple[str, ...] | None = None
    summary: Summary = Summary()
    runs: RunFields = RunFields()


# ---------------------------------------------------------------- pooling


def pool(metric: Metric, scores: Iterable[ItemScore]) -> float | None:
    """The metric over items (None when no item defines it), scaled and rounded. Sums are
    exactly rounded (`math.fsum`, `statistics.fmean`), so the order of items does not matter."""
    if metric.pool == "mean":
        values = [v for s in scores if (v := s.values.get(metric.name)) is not None]
        if not values:
            return None
        value = sum(values) / len(values) if metric.ordered_sum else fmean(values)
    else:
        parts = [s.parts[metric.name] for s in scores if metric.name in s.parts]
        den = fsum(d for _, d in parts)
        if not parts or den == 0:
            return None
        value = fsum(n for n, _ in parts) / den
    value = metric.scale * value
    return value if metric.digits is None else round(value, metric.digits)


def breakdown(
    metric: Metric, scores: Sequence[ItemScore], attr: str, order: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The metric pooled over each group of items (`detail[attr]` names an item's group):
    {group: {metric: value, "n_scored": items}}, groups sorted (or in `order`)."""
    groups: dict[str, list[ItemScore]] = {}
    for s in scores:
        groups.setdefault(str(s.detail[attr]), []).append(s)
    names = [g for g in order if g in groups] if order is not None else sorted(groups)
    return {g: {metric.name: pool(metric, groups[g]), "n_scored": len(groups[g])} for g in names}


CI_RESAMPLES = 1000  # resamples of a row's interval (the main metric's, 95%, over items)


def interval(
    metric: Metric, scores: Sequence[ItemScore], seed: int = 0, resamples: int = CI_RESAMPLES
) -> tuple[float | None, float | None]:
    """The 95% percentile bootstrap interval of the metric over the row's items (items drawn
    with replacement by numpy's PCG64 from `seed`; a ratio metric resampled as the ratio of the
    resampled sums). None when fewer than two items define it."""
    import numpy as np

    parts = [p for s in scores if (p := item_parts(metric, s)) is not None]
    if len(parts) < 2:
        return None, None
    num = np.asarray([p[0] for p in parts], dtype=np.float64)
    den = np.asarray([p[1] for p in parts], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(parts), size=(resamples, len(parts)))
    sums = den[idx].sum(axis=1)
    ok = sums > 0
    if not ok.any():
        return None, None
    values = metric.scale * num[idx].sum(axis=1)[ok] / sums[ok]
    low, high = (float(v) for v in np.percentile(values, [2.5, 97.5]))
    digits = metric.digits
    return (low, high) if digits is None else (round(low, digits), round(high, digits))


def item_parts(metric: Metric, score: ItemScore) -> tuple[float, float] | None:
    """(numerator, denominator) of one item for the paired bootstrap: a `mean` metric is the
    ratio of summed values over the count of items defining it."""
    if metric.pool == "mean":
        v = score.values.get(metric.name)
        return None if v is None else (float(v), 1.0)
    return score.parts.get(metric.name)


# ---------------------------------------------------------------- the join


@dataclass(frozen=True)
class Joined:
    """One generation with its item (None for a failed generation's unknown item never happens:
    unknown items are errors) and its judgement (None: not judged)."""

    generation: Generation
    judgement: Judgement | None
    where: str  # the generation's file:line


def _where(lines: Sequence[str], n: int, default: str) -> str:
    return lines[n] if n < len(lines) else f"{default} #{n + 1}"


def join(
    items: Mapping[str, Any],
    generations: Sequence[Generation],
    judgements: Sequence[Judgement],
    *,
    generation_lines: Sequence[str] = (),
    judgement_lines: Sequence[str] = (),
    unjudged: Literal["error", "count"] = "error",
) -> list[Joined]:
    """Every generation matched to its item and to at most one judgement; errors (file:line)
    for a generation of an unknown item, a generation id twice, a judgement of no generation
    (an orphan), two judgements of one generation, a judgement of a failed generation, and an
    ok generation without a judgement unless `unjudged="count"`."""
    by_id: dict[str, int] = {}
    for n, g in enumerate(generations):
        where = _where(generation_lines, n, "generations")
        if g.item_id not in items:
            raise DataError(
                "generation of an item that is not in the dataset",
                file=where,
                item=g.generation_id,
                field="item_id",
            )
        if g.generation_id in by_id:
            first = _where(generation_lines, by_id[g.generation_id], "generations")
            raise DataError(
                f"the same generation twice (first at {first})",
                file=where,
                item=g.generation_id,
                field="generation_id",
            )
        by_id[g.generation_id] = n
    judged: dict[str, tuple[Judgement, str]] = {}
    for n, j in enumerate(judgements):
        where = _where(judgement_lines, n, "judgements")
        if j.generation_id not in by_id:
            raise DataError(
                "judgement of a generation that is not in the generations file (an orphan)",
                file=where,
                item=j.generation_id,
                field="generation_id",
            )
        if j.generation_id in judged:
            raise DataError(
                f"two judgements of one generation by one judge (first at "
                f"{judged[j.generation_id][1]})",
                file=where,
                item=j.generation_id,
                field="generation_id",
            )
        if generations[by_id[j.generation_id]].status != "ok" and j.status != "error":
            raise DataError(
                "judgement of a failed generation (nothing to judge)",
                file=where,
                item=j.generation_id,
                field="generation_id",
            )
        judged[j.generation_id] = (j, where)
    out = []
    for n, g in enumerate(generations):
        where = _where(generation_lines, n, "generations")
        found = judged.get(g.generation_id)
        if found is None and g.status == "ok" and unjudged == "error":
            raise DataError(
                "generation without a judgement (the judge stage did not judge it)",
                file=where,
                item=g.generation_id,
                field="generation_id",
            )
        out.append(Joined(g, None if found is None else found[0], where))
    return out


# ---------------------------------------------------------------- rows

RowKey: TypeAlias = tuple[str, ...]
Score: TypeAlias = Callable[[Any, Generation, Judgement], Outcome]
# What a failed generation is when the benchmark counts it otherwise (None: a failed generation)
FailedOutcome: TypeAlias = Callable[[Any, Generation], Invalid | Excluded | None]


@dataclass
class _Cell:
    counts: Counts = field(default_factory=Counts)
    spend: Spend = field(default_factory=Spend)
    scores: list[ItemScore] = field(default_factory=list)
    copy_rates: list[float] = field(default_factory=list)

    def answered(self, g: Generation) -> None:
        """What a kept answer says about the row beyond its score: its copy rate, and whether
        it went past the model's context window (the generate stage's meta)."""
        rate = g.meta.get("copy_rate")
        if isinstance(rate, int | float) and not isinstance(rate, bool):
            self.copy_rates.append(float(rate))
        self.counts.n_over_context += bool(g.meta.get("over_context"))


@dataclass(frozen=True)
class Scoring:
    """The rows of a benchmark's runs and, per row key, the item scores behind each row."""

    rows: list[ResultRow]
    items: dict[RowKey, list[ItemScore]]


def _cell(
    cells: dict[RowKey, _Cell],
    head: tuple[str, str, str, str],
    keys: Mapping[str, str],
    group_keys: Sequence[str],
) -> _Cell:
    missing = [k for k in group_keys if k not in keys]
    if missing:
        raise ValueError(f"an item score without the row key(s) {missing}")
    return cells.setdefault((*head, *(str(keys[k]) for k in group_keys)), _Cell())


def _unscorable(g: Generation, j: Judgement) -> bool:
    """A failed generation or judgement: counted in its rows, not scored."""
    return g.status != "ok" or j.status == "error"


def check_declared(benchmark: str, metrics: Sequence[Metric], score: ItemScore, where: str) -> None:
    """An item score gives every declared metric and no other: a `mean` metric its value in
    `values` (None: undefined for this item), a `ratio` metric its (numerator, denominator) in
    `parts` (or None in `values`: undefined). Else a DataError naming the benchmark, the
    generation's file and line, the item and the key."""
    declared = {m.name: m for m in metrics}

    def fail(key: str, problem: str) -> DataError:
        return DataError(
            f"{benchmark}: the item score {problem}", file=where, item=score.item_id, field=key
        )

    names = ", ".join(declared)
    for key in (*score.values, *score.parts):
        if key not in declared:
            raise fail(key, f"names the metric {key!r}, which {benchmark} does not declare"
                            f" (it declares: {names})")  # fmt: skip
    for m in metrics:
        if m.pool == "mean":
            if m.name in score.parts:
                raise fail(m.name, f"gives parts of {m.name!r}, a mean metric (give its value)")
            if m.name not in score.values:
                raise fail(m.name, f"has no value of {m.name!r} (None says it is undefined)")
        else:
            if score.values.get(m.name) is not None:
                raise fail(m.name, f"gives a value of {m.name!r}, a ratio metric (give parts)")
            if m.name not in score.parts and m.name not in score.values:
                raise fail(
                    m.name,
                    f"has no parts of {m.name!r} (a None value says it is undefined)",
                )


def score_rows(
    benchmark: str,
    metrics: Sequence[Metric],
    runs: Sequence[Any],  # pipeline.core.benchmark.Run
    items: Mapping[str, Any],
    score: Score,
    *,
    group_keys: Sequence[str] = (),
    unjudged: Literal["error", "count"] = "error",
    failed_keys: Callable[[Any, Generation], Sequence[Mapping[str, str]]] | None = None,
    failed_outcome: FailedOutcome | None = None,
) -> Scoring:
    """Join each run, score every judged generation, count the rest, pool each row.

    A generation that failed or was not judged belongs to the rows its item's keys name
    (`failed_keys(item, generation)`: one mapping of the benchmark's group keys per row it would
    have been scored in; needed when `group_keys` is not empty). `failed_outcome(item,
    generation)` lets a benchmark count a failed generation as an `Invalid` or `Excluded` item
    with its reason (e.g. an empty output, which its metrics cannot score), in the rows its
    `keys` name; None: counted as a failed generation."""
    cells: dict[RowKey, _Cell] = {}
    joined_runs = [
        (
            run,
            join(
                items,
                run.generations,
                run.judgements,
                generation_lines=getattr(run, "generation_lines", ()),
                judgement_lines=getattr(run, "judgement_lines", ()),
                unjudged=unjudged,
            ),
        )
        for run in runs
    ]
    # What each joined generation comes to before scoring (a failure's outcome, or None), then
    # the item scores of the rest on every core (each item is scored on its own).
    early: list[list[Outcome | None]] = []
    to_score: list[tuple[Any, Generation, Judgement]] = []
    for _, joined in joined_runs:
        early.append([])
        for jn in joined:
            g, j = jn.generation, jn.judgement
            item = items[g.item_id]
            outcome: Outcome | None = None
            if g.status != "ok" and failed_outcome is not None:
                outcome = failed_outcome(item, g)
            early[-1].append(outcome)
            if outcome is None and j is not None and not _unscorable(g, j):
                to_score.append((item, g, j))
    scored = iter(fork_map(lambda job: score(*job), to_score, min_items=500))
    for (run, joined), outcomes in zip(joined_runs, early, strict=True):
        for jn, outcome in zip(joined, outcomes, strict=True):
            g, j = jn.generation, jn.judgement
            item = items[g.item_id]
            head = (run.model, g.system, g.setting, run.judge)
            if outcome is None:
                if j is None or _unscorable(g, j):
                    places = [{}] if not group_keys else list((failed_keys or _no_keys)(item, g))
                    for keys in places:
                        cell = _cell(cells, head, keys, group_keys)
                        cell.spend.add(g.usage, *([j.usage] if j is not None else []))
                        c = cell.counts
                        c.n_items += 1
                        if g.status != "ok":
                            c.n_failed_generations += 1
                        elif j is None:
                            c.n_unjudged += 1
                        else:
                            c.n_failed_judgements += 1
                    continue
                outcome = next(scored)
                if isinstance(outcome, Scored):
                    for s in outcome.scores:
                        check_declared(benchmark, metrics, s, jn.where)
            truncated = bool(g.meta.get("truncated"))
            usage = [g.usage, *([j.usage] if j is not None else [])]
            if isinstance(outcome, Scored):
                for s in outcome.scores:
                    cell = _cell(cells, head, s.keys, group_keys)
                    cell.scores.append(s)
                # counted once per row the item reached
                for reached in {_key(head, s.keys, group_keys) for s in outcome.scores}:
                    cells[reached].spend.add(*usage)
                    cells[reached].answered(g)
                    c = cells[reached].counts
                    c.n_items += 1
                    c.n_scored += 1
                    c.n_truncated += truncated
                    c.n_invalid_verdicts += outcome.invalid_verdicts
                continue
            cell = _cell(cells, head, outcome.keys, group_keys)
            cell.spend.add(*usage)
            cell.answered(g)
            c = cell.counts
            c.n_items += 1
            c.n_truncated += truncated
            if isinstance(outcome, Invalid):
                c.n_invalid += 1
                c.n_invalid_verdicts += outcome.invalid_verdicts
                c.invalid_reasons[outcome.reason] = c.invalid_reasons.get(outcome.reason, 0) + 1
            else:
                c.n_excluded += 1
                c.excluded[outcome.reason] = c.excluded.get(outcome.reason, 0) + 1
    rows: list[ResultRow] = []
    by_key: dict[RowKey, list[ItemScore]] = {}
    for key, cell in cells.items():
        model, system, setting, judge = key[:4]
        row = ResultRow(
            benchmark=benchmark,
            model=model,
            system=system,
            setting=setting,
            judge=judge,
            keys=dict(zip(group_keys, key[4:], strict=True)),
            metrics={m.name: pool(m, cell.scores) for m in metrics},
            counts=cell.counts,
            spend=cell.spend,
            copy_rates=cell.copy_rates,
        )
        rows.append(row)
        by_key[key] = cell.scores
    return Scoring(rows, by_key)


def combine(
    metrics: Sequence[Metric],
    rows: Sequence[ResultRow],
    scores: Sequence[Sequence[ItemScore]],
    **keys: str,
) -> tuple[ResultRow, list[ItemScore]]:
    """One row pooling several (e.g. a system's rows of two domains): counters and spend
    added, every metric pooled over all their item scores; `keys` replace the row keys."""
    first = rows[0]
    counts, spend = Counts(), Spend()
    for r in rows:
        for k in COUNTERS:
            setattr(counts, k, getattr(counts, k) + getattr(r.counts, k))
        for reason, n in r.counts.excluded.items():
            counts.excluded[reason] = counts.excluded.get(reason, 0) + n
        for reason, n in r.counts.invalid_reasons.items():
            counts.invalid_reasons[reason] = counts.invalid_reasons.get(reason, 0) + n
        spend.input_tokens += r.spend.input_tokens
        spend.output_tokens += r.spend.output_tokens
        spend.cost_usd += r.spend.cost_usd
    joined = [s for ss in scores for s in ss]
    row = first.model_copy(
        update={
            "keys": {**first.keys, **keys},
            "metrics": {m.name: pool(m, joined) for m in metrics},
            "counts": counts,
            "spend": spend,
            "extra": {},
            "copy_rates": [c for r in rows for c in r.copy_rates],
        }
    )
    return row, joined


def _key(head: tuple[str, ...], keys: Mapping[str, str], group_keys: Sequence[str]) -> RowKey:
    return (*head, *(str(keys[k]) for k in group_keys))


def _no_keys(item: Any, g: Generation) -> Sequence[Mapping[str, str]]:
    raise ValueError("a benchmark with group keys must say where failed generations go")


def count_reasons(counts: Iterable[Counts]) -> Counter[str]:
    out: Counter[str] = Counter()
    for c in counts:
        out.update(c.excluded)
    return out


def item_record(score: ItemScore) -> dict[str, Any]:
    """An item score as one line of a row's `items.jsonl` artifact (what compare reads)."""
    return {
        "item_id": score.item_id,
        **({"keys": dict(score.keys)} if score.keys else {}),
        "values": dict(score.values),
        "parts": {k: list(v) for k, v in score.parts.items()},
        **dict(score.detail),
    }
