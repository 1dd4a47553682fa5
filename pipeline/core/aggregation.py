"""A benchmark's results from its declarations, the same way for every benchmark (pure: the
aggregate stage reads the files and writes what this returns).

From `metrics`, `results` (`pipeline.core.results.Results`) and `item_score`: the typed rows
with their intervals, the metrics file, its summary, the report (the results table), one MLflow
run per row, and the benchmark's part of `lfbench report`. A benchmark with tables or figures
of its paper's own (`Benchmark.paper`) adds them around this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.benchmark import (
    Aggregated,
    AnyBenchmark,
    Context,
    ReportSection,
    Run,
    RunRow,
    Tables,
)
from pipeline.core.markdown import need, results_table
from pipeline.core.results import (
    COUNTERS,
    ItemScore,
    ResultRow,
    RowKey,
    RowName,
    interval,
    item_record,
    score_rows,
)


def score(
    bench: AnyBenchmark, ctx: Context[Any], dataset: Sequence[Any], runs: Sequence[Run]
) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
    """The typed rows, sorted (`results.order`), and per row key the item scores behind it."""
    from pipeline.core import extensions

    if not bench.metrics:
        raise NotImplementedError(f"{bench.name} declares no metrics")
    if bench.metrics[0].higher_is_better is None:  # it ranks the rows
        raise NotImplementedError(f"{bench.name}: the main metric must have a better direction")
    decl = bench.results
    scoring = score_rows(
        bench.name,
        bench.metrics,
        runs,
        extensions.scored_items(bench, dataset),
        lambda item, g, j: bench.item_score(ctx, item, g, j),
        group_keys=decl.group_keys,
        unjudged=decl.unjudged,
        failed_keys=lambda item, g: bench.failed_keys(ctx, item, g),
        failed_outcome=lambda item, g: extensions.failed_outcome(bench, ctx, item, g),
    )
    main = bench.metrics[0]
    for row in scoring.rows:
        low, high = interval(main, scoring.items[row.key], ctx.params.seed)
        row.metrics[f"{main.name}_ci_low"], row.metrics[f"{main.name}_ci_high"] = low, high
        bench.row_extra(ctx, row, scoring.items[row.key])
        cut = getattr(ctx.params.models.get(row.model), "slice", {}).get(bench.name)
        if cut is not None:  # the model's own slice: say which items the row covers
            row.extra["slice"] = cut.describe()
    return sorted(scoring.rows, key=lambda r: order(bench, r)), scoring.items


def order(bench: AnyBenchmark, row: ResultRow) -> tuple[Any, ...]:
    if bench.results.order is not None:
        return bench.results.order(row)
    return (row.system, row.setting, row.judge, row.model, *row.keys.values())


def aggregate(
    bench: AnyBenchmark,
    ctx: Context[Any],
    dataset: Sequence[Any],
    runs: Sequence[Run],
    *,
    tables: bool = True,
) -> Aggregated:
    """Judgements -> rows, the metrics file, its summary, the report and the MLflow runs; with
    the paper's own tables and figures when the benchmark has them. `tables=False` (a model's
    results stage): the rows and their runs only (no report, figures or runs across rows)."""
    paper = bench.paper
    scored = paper.runs(ctx, dataset, runs) if paper is not None else runs
    rows, scores = score(bench, ctx, dataset, scored)
    made = Tables()
    change = None
    if paper is not None:
        rows, scores = paper.rows(ctx, dataset, runs, rows, scores)
        change = paper.run_change(ctx, dataset, runs, rows)
        if tables:
            made = paper.tables(ctx, dataset, runs, rows, scores)
    flat = [r.flat() for r in rows]
    report = ""
    if tables:
        title = bench.title or bench.name
        report = made.report_text or ""
        if made.report_text is None:
            table = results_table(bench.metrics, flat) if made.table else []
            report = "\n".join([f"# {title}", "", *table, *made.report]).rstrip() + "\n"
    out = []
    for row, cells in zip(rows, flat, strict=True):
        run = run_row(bench, ctx, row, scores.get(row.key, ()))
        if change is not None:
            run = change(run, cells)
        out.append(run)
    return Aggregated(
        metrics={"rows": flat, **made.sections},
        summary={**summary(bench, rows), **made.summary} if tables else {},
        report=report,
        runs=out + list(made.runs),
        figures=made.figures,
    )


def _name(spec: RowName, row: Mapping[str, Any]) -> str:
    return spec(row) if callable(spec) else "/".join(str(row[k]) for k in spec)


def summary(bench: AnyBenchmark, rows: Sequence[ResultRow]) -> dict[str, Any]:
    """The rows as `results.summary` declares them, for `dvc metrics show/diff`."""
    decl = bench.results.summary
    main = bench.metrics[0].name
    name = decl.name or ("system", "setting", *bench.results.group_keys)

    def value(v: float | None) -> float | None:
        return v if v is None or decl.digits is None else round(v, decl.digits)

    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        cells = r.flat()
        cell: Any
        if decl.metrics:
            cell = {
                k: value(v)
                for k in decl.metrics
                if (v := r.metrics.get(k)) is not None or decl.keep_none
            }
        else:
            cell = value(r.metrics.get(main))
        out.setdefault(_name(decl.group, cells), {})[_name(name, cells)] = cell
    return out


def _dig(section: Any, path: str) -> Any:
    for part in path.split("."):
        section = getattr(section, part)
    return section


def run_row(
    bench: AnyBenchmark, ctx: Context[Any], row: ResultRow, scores: Sequence[ItemScore]
) -> RunRow:
    """One MLflow run: the metrics and counters as metrics, the row's keys as params, the
    columns `results.runs` names as params, tags and metrics, the item scores (what `lfbench
    compare` pairs) and the row as artifacts."""
    decl = bench.results.runs
    flat = row.flat()
    numbers = {k: float(v) for k, v in row.metrics.items() if v is not None}
    numbers |= {k: float(getattr(row.counts, k)) for k in COUNTERS}
    numbers |= {k: float(v) for k, v in row.spend.model_dump().items()}
    numbers |= {
        k: float(v)
        for k, v in row.extra.items()
        if k.startswith("n_") and isinstance(v, int | float) and not isinstance(v, bool)
    }
    numbers |= {k: float(flat[k]) for k in decl.metrics if flat[k] is not None}
    if row.copy_rate is not None:
        numbers["copy_rate"] = row.copy_rate
    for column in decl.breakdowns:
        part = column.removeprefix("by_")
        for group, cell in flat[column].items():
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)[:80]
            numbers |= {
                f"{m}.{part}.{safe}": float(v)
                for m, v in cell.items()
                if m != "n_scored" and v is not None
            }
    ident = {"system": row.system, "setting": row.setting, "judge": row.judge, **row.keys}
    params = {**ident, "model": row.model}
    params |= {k: str(flat[c]) for k, c in decl.params.items()}
    params |= {k: str(_dig(ctx.section, path)) for k, path in decl.section_params.items()}
    tags = {"setting": row.setting, "model.name": row.system, **row.keys}
    tags |= {k: str(flat[c]) for k, c in decl.tags.items()}
    if row.flags:  # why the row's numbers should not be read as they stand: a tag to filter on
        tags["lfbench.flags"] = "; ".join(row.flags)
    return RunRow(
        key="|".join(row.key),
        name=decl.name(flat) if decl.name is not None else " / ".join(ident.values()),
        metrics=numbers,
        params=params,
        tags=tags,
        artifacts={"items.jsonl": [item_record(s) for s in scores], "row.json": flat},
        model=row.model,
        judge=row.judge,
    )


def report_section(bench: AnyBenchmark, metrics: Mapping[str, Any], where: str) -> ReportSection:
    """The benchmark's part of `lfbench report`, from its metrics file (`where`): the results
    table, or what its paper's own tables make of it."""

    def generic() -> ReportSection:
        rows = metrics["rows"]
        for n, r in enumerate(rows, 1):
            need(r, ("system", "setting", "judge", *(m.name for m in bench.metrics)), where, n)
        return ReportSection([f"From {where}.", "", *results_table(bench.metrics, rows)])

    if bench.paper is not None:
        return bench.paper.report_section(metrics, where, generic)
    return generic()
