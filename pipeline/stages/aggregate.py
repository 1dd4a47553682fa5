"""Stage `<benchmark>-aggregate`: judgements -> the metrics file, its summary, the report, and one
MLflow run per result row, with the lineage that makes it traceable.

The benchmark scores (pure); this stage reads the generations and judgements of every (model,
judge) pair of its section, writes what the benchmark returns, and logs each row with the lineage
every benchmark's runs carry: the model and judge entries (names, providers and `entry_sha`
digests of their settings), their prompt hashes, the dataset digest, the DVC digests of the
construct, generate and judge stages, git, data and runtime, the usage counters of the pair's
stages (as counters: re-logged, not a new run), and the judge's kappa against people (from the
agreement stage's metrics, when given). Its runs are logged as the producer
`<benchmark>-aggregate`: a row it no longer produces is retired (pipeline/stages/tracking.py).

Stage `<benchmark>-results@<model>` (`model_results`) does the same for one model as soon as
that model's generate and judge stages are done: `results/<benchmark>/<model>.json` (its rows)
and its MLflow runs, logged as the aggregate's, so the aggregate, which runs after every model's
and writes the metrics file, the report and the runs across models, finds them unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core import aggregation
from pipeline.core.benchmark import AnyBenchmark, Context, Run, RunRow
from pipeline.core.config import Params, PublishedModel
from pipeline.core.drawing import Plot, digest
from pipeline.core.errors import ConfigError
from pipeline.core.io import (
    atomic_write_bytes,
    atomic_write_text,
    file_digest,
    read_json,
    write_json,
)
from pipeline.core.markdown import flagged_rows
from pipeline.stages.common import (
    STAGE_USAGE_KEYS,
    StageUsage,
    collect_usage,
    common_tags,
    construct_stage,
    context,
    entry_sha,
    generate_stage,
    joined_sha,
    judge_stage,
    not_judged,
    prompt_shas,
    read_dataset,
    read_runs,
    retrieval_lineage_path,
    stage_md5_of,
    usage_metrics,
    usage_path,
)
from pipeline.stages.tracking import DatasetRef, RunSpec, SyncReport, sync

log = logging.getLogger(__name__)


def kappa_vs_human(agreement_path: Path | None) -> dict[str, float]:
    """judge -> Cohen's kappa against people, from an agreement stage's metrics file (its rows
    with `reference: human`)."""
    if agreement_path is None or not agreement_path.exists():
        return {}
    rows = read_json(agreement_path).get("rows", [])
    return {
        str(r["judge"]): float(r["cohen_kappa"])
        for r in rows
        if r.get("reference") == "human" and r.get("cohen_kappa") is not None
    }


SAMPLING = ("model", "temperature", "top_p", "max_tokens", "seed")


def sampling(params: Params, model: str | None, judge: str | None) -> dict[str, str]:
    """The sampling settings of the row's model and judge entries (those behind an endpoint),
    as MLflow params a user can filter and compare on (`model.temperature`, `judge.seed`, ...;
    `none` for a setting left to the server): what `model.entry_sha` digests, readable."""
    out = {}
    for role, entry in (
        ("model", params.models.get(model or "")),
        ("judge", params.judges.get(judge or "")),
    ):
        for field in SAMPLING:
            if entry is not None and field in type(entry).model_fields:
                value = getattr(entry, field)
                out[f"{role}.{'served' if field == 'model' else field}"] = (
                    "none" if value is None else str(value)
                )
    return out


def plots_sha(plots: Mapping[str, bytes | Plot]) -> str:
    """The digest of a run's plots, without drawing them (a `Plot`'s key digests its inputs)."""
    h = hashlib.sha256()
    for name in sorted(plots):
        h.update(name.encode() + b"\0" + bytes.fromhex(digest(plots[name])))
    return h.hexdigest()[:16]


def points_path(report_path: Path, benchmark: str) -> Path:
    return report_path.parent / f"{benchmark}.points.json"


def plot_points(metrics: Sequence[str], runs: Sequence[RunRow]) -> dict[str, Any]:
    """The DVC plots file: one flat point per run that has the first metric (DVC reads the
    first list of a JSON file; the metrics file holds several)."""
    points = [
        {"run": r.name, **{m: r.metrics[m] for m in metrics if m in r.metrics}}
        for r in runs
        if metrics[0] in r.metrics
    ]
    return {"points": points}


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def run_spec(
    bench: AnyBenchmark,
    params: Params,
    row: RunRow,
    *,
    lineage: Mapping[str, str],
    metrics: Mapping[str, float] | None = None,
    dataset: DatasetRef | None = None,
    counters: Mapping[str, float] | None = None,
) -> RunSpec:
    """The MLflow run of one row: its metrics, params, artifacts and plots, the benchmark's tags
    and the given lineage (plus `lfbench.plots_sha` when it has plots)."""
    tags = {"benchmark": bench.name, "benchmark.version": bench.version, **row.tags, **lineage}
    if row.plots:
        tags["lfbench.plots_sha"] = plots_sha(row.plots)
    return RunSpec(
        row_key=row.key,
        name=row.name,
        metrics={**row.metrics, **(metrics or {})},
        params={**row.params, **sampling(params, row.model, row.judge)},
        tags=tags,
        artifacts=row.artifacts,
        plots=row.plots,
        dataset=dataset,
        counters=dict(counters or {}),
    )


def aggregate(
    bench: AnyBenchmark,
    params: Params,
    dataset_path: Path,
    generations_dir: Path,
    judgements_dir: Path,
    metrics_path: Path,
    summary_path: Path,
    report_path: Path,
    root: Path,
    track: bool = True,
    agreement_path: Path | None = None,
    released_path: Path | None = None,
    results_dir: Path | None = None,
) -> list[RunRow]:
    if track:
        from pipeline.stages.mlflow_store import preflight

        preflight(root)  # an MLflow store that is not there fails the stage now, in one line
    ctx = context(bench, params, root)
    section = ctx.section
    dataset = read_dataset(bench, dataset_path)
    runs = read_runs(params, section.models, section.judges, generations_dir, judgements_dir)
    result = aggregation.aggregate(bench, ctx, dataset, runs)
    skipped = unjudged_pairs(params, section.models, section.judges)
    written = {**result.metrics, "not_judged": skipped} if skipped else result.metrics
    write_json(metrics_path, written)
    if released_path is not None:
        # the released systems' rows alone: a stage that compares with them depends on this
        # file, so adding or changing your own model does not re-run it
        released = {m for m in section.models if isinstance(params.models[m], PublishedModel)}
        rows = [r for r in result.metrics.get("rows", []) if r.get("model") in released]
        write_json(released_path, {"rows": rows})
    write_json(summary_path, result.summary)
    flagged = flagged_rows(result.metrics.get("rows", []), FLAG_KEYS)
    atomic_write_text(
        report_path,
        result.report + "".join(f"\n{s}" for s in (*flagged, *not_judged_lines(skipped))),
    )
    if skipped:
        log.info(
            "%s: %d (model, judge) pairs not judged, by choice (%s: not_judged): %s",
            bench.name,
            len(skipped),
            metrics_path,
            ", ".join(f"{p['model']} x {p['judge']}" for p in skipped),
        )
    for name, data in result.figures.items():
        atomic_write_bytes(report_path.parent / name, data)
    plotted = bench.results.plotted or (bench.metrics[0].name,)
    write_json(points_path(report_path, bench.name), plot_points(plotted, result.runs))
    log.info("wrote %s (%d rows) and %s", metrics_path, len(result.runs), report_path)
    usage = collect_usage(section.models, section.judges, generations_dir, judgements_dir)
    per_model = model_summary(bench, result.metrics.get("rows", []), usage, section.judges)
    if per_model:
        log.info("%s per model:\n%s", bench.name, "\n".join(summary_lines(per_model)))
    # the per-model stages' rows: the same as these, unless a benchmark's rows depend on other
    # models (then the early ones were provisional: said here)
    results = early_results(results_dir, section.models)
    for model, mismatch in results_differ(results, result.metrics.get("rows", [])).items():
        log.warning(
            "%s: %s's early rows (%s) differ from the final ones (%s): they depend on other models",
            bench.name,
            model,
            results_path(results_dir or Path(), model),
            mismatch,
        )
    if track:
        specs = run_specs(
            bench, params, ctx, result.runs, runs, usage, dataset_path, generations_dir, root,
            agreement_path,
        )  # fmt: skip
        # the same producer as the per-model stages: a row they logged with the same result is
        # skipped here (one run per row), and this sync retires the rows no model produces now
        report = sync(bench.name, specs, root, producer=f"{bench.name}-aggregate")
        log_sync(bench.name, report)
    return result.runs


def run_specs(
    bench: AnyBenchmark,
    params: Params,
    ctx: Context[Any],
    rows: Sequence[RunRow],
    runs: Sequence[Run],
    usage: StageUsage,
    dataset_path: Path,
    generations_dir: Path,
    root: Path,
    agreement_path: Path | None,
) -> list[RunSpec]:
    """The MLflow runs of `rows` with every benchmark's lineage (see the module's docstring)."""
    shas = prompt_shas(runs, params)
    kappas = kappa_vs_human(agreement_path)
    digest = file_digest(dataset_path)
    common = common_tags(root)
    construct_md5 = stage_md5_of(root, construct_stage(bench.name))
    dataset_ref = DatasetRef(
        name=f"{bench.name}/{dataset_path.name}",
        digest=digest,
        source=_relative(dataset_path, root),
    )
    specs = []
    for row in rows:
        assert row.model is not None and row.judge is not None, row.key
        m, j = row.model, row.judge
        lineage = {
            "model.entry": m,
            "model.provider": params.models[m].provider,
            "model.entry_sha": entry_sha(params.models[m], bench.name),
            "judge.name": j,
            "judge.provider": params.judges[j].provider,
            "judge.entry_sha": entry_sha(params.judges[j], bench.name),
            "judge.prompt_sha": joined_sha(shas, m, j),
            "model.prompt_sha": joined_sha(shas, m),
            "dataset.digest": digest,
            "dvc.stage": judge_stage(bench.name, m, j),
            "dvc.stage_md5": stage_md5_of(root, judge_stage(bench.name, m, j)),
            "dvc.generate_stage_md5": stage_md5_of(root, generate_stage(bench.name, m)),
            "dvc.construct_stage_md5": construct_md5,
            **common,
        }
        lineage |= system_lineage(generations_dir, m)
        lineage |= retriever_lineage(bench, ctx, root, row)
        metrics: dict[str, float] = {}
        if j in kappas:
            metrics["judge.kappa_vs_human"] = kappas[j]
            lineage["judge.kappa_vs_human"] = f"{kappas[j]:.3f}"
        specs.append(
            run_spec(
                bench,
                params,
                row,
                lineage=lineage,
                metrics=metrics,
                dataset=dataset_ref,
                counters=usage_metrics(usage, m, j),
            )
        )
    return specs


def results_path(results_dir: Path, model: str) -> Path:
    """A model's early results (`<benchmark>-results@<model>`): its rows."""
    return results_dir / f"{model}.json"


def model_results(
    bench: AnyBenchmark,
    params: Params,
    model: str,
    dataset_path: Path,
    generations_dir: Path,
    judgements_dir: Path,
    out: Path,
    root: Path,
    track: bool = True,
    agreement_path: Path | None = None,
) -> list[RunRow]:
    """Stage `<benchmark>-results@<model>`: one model's rows and MLflow runs, as soon as its own
    generate and judge stages are done (the aggregate waits for every model's).

    Its rows are scored as the aggregate scores them, from this model's generations and
    judgements alone: the same rows, the same runs (the aggregate's sync then finds them
    unchanged and skips them, and draws none of their plots), except what a benchmark draws
    across models (CRUX's tau runs, a figure of every model's rows), which only the aggregate
    makes: no paper tables, report or figures here (`aggregation.aggregate(tables=False)`).
    Its runs are logged as the aggregate's (producer `<benchmark>-aggregate`), retiring
    nothing: a row no model produces any more is retired by the aggregate, which sees them
    all."""
    if track:
        from pipeline.stages.mlflow_store import preflight

        preflight(root)
    ctx = context(bench, params, root)
    section = ctx.section
    if model not in section.models:
        raise ConfigError(f"{bench.name}.models does not list {model}")
    dataset = read_dataset(bench, dataset_path)
    runs = read_runs(params, [model], section.judges, generations_dir, judgements_dir)
    result = aggregation.aggregate(bench, ctx, dataset, runs, tables=False)
    flat = result.metrics.get("rows", [])
    rows = [r for r in flat if r.get("model") == model]
    # the rows' own runs: `aggregation.aggregate` lists them first, in the rows' order, then
    # the benchmark's runs across rows (CRUX's tau), which are the aggregate's to log
    own = [r for r in result.runs[: len(flat)] if r.model == model]
    write_json(out, {"benchmark": bench.name, "model": model, "rows": rows})
    log.info("wrote %s (%d rows of %s)", out, len(rows), model)
    if track:
        usage = collect_usage([model], section.judges, generations_dir, judgements_dir)
        specs = run_specs(
            bench, params, ctx, own, runs, usage, dataset_path, generations_dir, root,
            agreement_path,
        )  # fmt: skip
        report = sync(bench.name, specs, root, producer=f"{bench.name}-aggregate", retire=False)
        log_sync(f"{bench.name} ({model})", report)
    return own


def early_results(results_dir: Path | None, models: Sequence[str]) -> dict[str, list[Any]]:
    """model -> its rows in the per-model results folder (those of the section's models)."""
    if results_dir is None:
        return {}
    out = {}
    for model in models:
        path = results_path(results_dir, model)
        if path.is_file():
            out[model] = list(read_json(path).get("rows", []))
    return out


def results_differ(
    results: Mapping[str, Sequence[Any]], rows: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """model -> how its early rows differ from the aggregate's (none: not listed)."""
    out = {}
    for model, early in results.items():
        # as the metrics file holds them (JSON: tuples are lists)
        final = json.loads(json.dumps([r for r in rows if r.get("model") == model]))
        if len(early) != len(final):
            out[model] = f"{len(early)} rows, {len(final)} now"
        elif early != final:
            n = sum(1 for a, b in zip(early, final, strict=True) if a != b)
            out[model] = f"{n} of {len(final)} rows"
    return out


def retriever_lineage(
    bench: AnyBenchmark, ctx: Context[Any], root: Path, row: RunRow
) -> dict[str, str]:
    """The `retriever.*` tags of a row whose setting used one of the user's retrievers: its
    name, provider, model, entry digest and code or file digest (from its retrieval stage's
    lineage file)."""
    if bench.retrieval is None:
        return {}
    name = bench.retrieval.retriever_of(ctx, str(row.tags.get("setting", "")))
    if name is None:
        return {}
    path = retrieval_lineage_path(root, bench.name, name)
    info = read_json(path) if path.is_file() else {}
    tags = {"retriever.name": name}
    for k in ("provider", "model", "entry_sha", "code_sha", "file_sha", "over", "entry", "file"):
        if isinstance(info, dict) and info.get(k) is not None:
            tags[f"retriever.{k}"] = str(info[k])
    return tags


def system_lineage(generations_dir: Path, model: str) -> dict[str, str]:
    """`model.entry_point` and `model.code_sha`, or `model.file` and `model.file_sha`, of a
    whole RAG system of the user's (from its generate stage's usage file)."""
    path = usage_path(generations_dir / f"{model}.jsonl")
    info = read_json(path).get("system") if path.is_file() else None
    if not isinstance(info, dict):
        return {}
    return {f"model.{k}": str(v) for k, v in info.items() if v is not None}


# The row keys that name a flagged row in a report, beside system / setting / judge.
FLAG_KEYS = ("task", "domain", "collection", "mode", "cutoff")


def unjudged_pairs(
    params: Params, models: Sequence[str], judges: Sequence[str]
) -> list[dict[str, str]]:
    """The (model, judge) pairs of a section that are not judged, by design or by choice, with
    why (`not_judged`): no row comes from them, and the metrics file says so."""
    out = []
    for model in models:
        for judge in judges:
            why = not_judged(params, model, judge)
            if why is not None:
                out.append({"model": model, "judge": judge, "reason": why})
    return out


def not_judged_lines(pairs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pairs not judged, as a report section (none: no section)."""
    from pipeline.core.markdown import table

    if not pairs:
        return []
    body = [[str(p.get("model")), str(p.get("judge")), str(p.get("reason"))] for p in pairs]
    return [
        "### Not judged, by choice",
        "",
        "These (model, judge) pairs have no rows: their judge stage sent nothing (params.yaml"
        " decides; an LLM judge judges the models its `models` lists, by default the models"
        " with calls).",
        "",
        *table(["model", "judge", "why"], body),
    ]


def model_summary(
    bench: AnyBenchmark,
    rows: Sequence[Mapping[str, Any]],
    usage: StageUsage,
    judges: Sequence[str],
) -> list[dict[str, Any]]:
    """Per model entry: its best row by the main metric (with its interval), its items, and
    what its generate and judge stages spent (tokens, dollars, wall time, seconds per request,
    from their usage files). Wall time is run state: this goes to the log and the report, never
    into a metrics file."""
    if not bench.metrics:
        return []
    main = bench.metrics[0]
    out = []
    for model in dict.fromkeys(str(r["model"]) for r in rows):
        mine = [r for r in rows if r["model"] == model and r.get(main.name) is not None]
        best = (max if main.higher_is_better else min)(
            mine, key=lambda r: r[main.name], default=None
        )
        stages = [usage.get(("generate", model, ""), {})]
        stages += [usage.get(("judge", model, j), {}) for j in judges]
        total = {k: sum(u.get(k, 0.0) for u in stages) for k in STAGE_USAGE_KEYS}
        out.append(
            {
                "model": model,
                "metric": main.name,
                "best": None if best is None else best[main.name],
                "ci_low": None if best is None else best.get(f"{main.name}_ci_low"),
                "ci_high": None if best is None else best.get(f"{main.name}_ci_high"),
                "best_row": None
                if best is None
                else " / ".join(str(best[k]) for k in ("system", "setting", "judge")),
                "rows": sum(1 for r in rows if r["model"] == model),
                "items": sum(int(r.get("n_items", 0)) for r in rows if r["model"] == model),
                "requests": int(total["requests_sent"]),
                "input_tokens": int(total["input_tokens"]),
                "output_tokens": int(total["output_tokens"]),
                # a stage whose answers came without usage: its cost is unknown, not $0
                "cost_usd": None
                if any(u.get("cost_unknown") for u in stages)
                else round(total["cost_usd"], 4),
                "wall_s": round(total["wall_s"], 1),
                "s_per_request": round(total["wall_s"] / total["requests_sent"], 2)
                if total["requests_sent"]
                else None,
            }
        )
    return out


def summary_lines(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-model summary as a markdown table."""
    from pipeline.core.markdown import fmt, table

    body = [
        [
            s["model"],
            f"{s['metric']} {fmt(s['best'], 3)}"
            + (
                f" [{fmt(s['ci_low'], 3)}, {fmt(s['ci_high'], 3)}]"
                if s["ci_low"] is not None
                else ""
            ),
            s["best_row"] or "-",
            s["rows"],
            s["items"],
            s["requests"],
            f"{s['input_tokens']:,} / {s['output_tokens']:,}",
            "unknown" if s["cost_usd"] is None else f"{s['cost_usd']:.4f}",
            fmt(s["wall_s"], 1),
            fmt(s["s_per_request"], 2),
        ]
        for s in summary
    ]
    head = ["model", "best (95% CI)", "best row", "rows", "items", "requests",
            "tokens in / out", "USD", "wall s", "s / request"]  # fmt: skip
    return table(head, body)


def log_sync(experiment: str, report: SyncReport) -> None:
    log.info(
        "mlflow %s: %d runs created, %d unchanged (skipped), %d superseded, %d with plots"
        " re-logged, %d retired (rows no longer produced), %d revived, %d healed (a stopped"
        " sync's duplicates)",
        experiment,
        report.created,
        report.skipped,
        report.superseded,
        report.refreshed,
        report.retired,
        report.revived,
        report.healed + report.deduplicated,
    )
