"""Stage `<benchmark>-agreement`: how far each judge agrees with people (and with each other).

The benchmark reads its human labels and computes the statistics (`Benchmark.agreement`); this
stage reads the files, has every judge of the benchmark's section score the labelled outputs
(an LLM judge through the judge loop, with its own journal; a coverage judge; a replayed judge
stands in with the released predictions it names as `agreement_proxy`), reads the pipeline's
judgements for judge vs judge, writes the rows, the report and the plot, and logs one MLflow run
per row (experiment `agreement`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark, Context, HumanAgreement, JudgeInfo
from pipeline.core.config import OpenAIJudge, Params, PublishedJudge, PublishedModel
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import (
    atomic_write_bytes,
    atomic_write_text,
    file_digest,
    read_jsonl,
    write_json,
)
from pipeline.core.judging import judge_kind
from pipeline.core.records import Generation, Judgement
from pipeline.stages.aggregate import log_sync, run_spec
from pipeline.stages.common import (
    agreement_stage,
    common_tags,
    context,
    finish_llm_stage,
    stage_md5_of,
)
from pipeline.stages.judge import coverage_judge, coverage_judgements, llm_judgements
from pipeline.stages.timing import read_throughput, throughput, write_throughput
from pipeline.stages.tracking import sync

log = logging.getLogger(__name__)

EXPERIMENT = "agreement"


def capability(bench: AnyBenchmark) -> HumanAgreement[Any, Any]:
    if bench.agreement is None:
        raise ConfigError(f"benchmark {bench.name} has no human labels to measure judges against")
    return bench.agreement


def llm_labelled(
    bench: AnyBenchmark, ctx: Context[Any], gens: list[Generation]
) -> list[Generation]:
    """The labelled outputs an LLM judge scores: the first N the benchmark's cap allows."""
    cap = capability(bench).llm_samples(ctx.section)
    return gens if cap is None else gens[:cap]


def judge_labelled(
    bench: AnyBenchmark, ctx: Context[Any], labelled: Any, released: dict[str, Any], root: Path
) -> tuple[dict[str, Any], dict[str, JudgeInfo]]:
    """Each judge of the section on the labelled outputs: its labels and where they come from."""
    ag = capability(bench)
    params = ctx.params
    items, gens = ag.to_judge(labelled)
    llm_gens = llm_labelled(bench, ctx, gens)
    judged: dict[str, Any] = {}
    info: dict[str, JudgeInfo] = {}
    for name in ctx.section.judges:
        spec = params.judges[name]
        kind = judge_kind(bench, name, spec)
        if kind == "released":
            assert isinstance(spec, PublishedJudge)  # judge_kind says so
            proxy = spec.agreement_proxy
            if proxy is None:
                continue
            if proxy not in released:
                raise DataError(
                    f"judges.{name}.agreement_proxy names {proxy!r}, which the labels file does"
                    f" not hold (it has: {', '.join(released)})"
                )
            judged[name] = released[proxy]
            info[name] = JudgeInfo(
                f"released predictions of {proxy} (replayed judge)", spec.provider, "published"
            )
        elif kind == "llm":
            assert isinstance(spec, OpenAIJudge)  # judge_kind says so
            stage = agreement_stage(bench.name, name)
            started = time.perf_counter()
            js, report = llm_judgements(bench, ctx, name, spec, items, llm_gens, stage, root)
            wall = time.perf_counter() - started
            finish_llm_stage(stage, root, report, [j for j in js if j.status == "error"])
            sha = ",".join(sorted({j.judge_prompt_sha for j in js})) or "none"
            judged[name] = ag.labels(labelled, js)
            reused = report.cache_hits + report.journal_hits
            info[name] = JudgeInfo(
                "judged by lfbench",
                spec.provider,
                sha,
                float(sum(j.usage.cost_usd for j in js)),
                n_judgements=sum(len(j.verdicts) for j in js),
                wall_s=wall,
                timed=(
                    f"this run's judge calls on {len(llm_gens)} labelled outputs, repairs"
                    f" included; {reused} of {report.items} answers came from the cache or"
                    " journal"
                ),
                usage_missing=report.usage_missing,
                timing_stage=agreement_stage(bench.name),
            )
        else:
            started = time.perf_counter()
            cj = coverage_judge(bench, name, spec, root)
            js = coverage_judgements(bench, ctx, name, cj, items, gens)
            wall = time.perf_counter() - started
            judged[name] = ag.labels(labelled, js)
            info[name] = JudgeInfo(
                "judged by lfbench",
                spec.provider,
                cj.sha,
                n_judgements=sum(len(j.verdicts) for j in js),
                wall_s=wall,
                timed=(
                    f"loading the judge and judging {len(gens)} labelled outputs in this run"
                    " (embeddings read from the cache where it holds them)"
                ),
                free=True,
                timing_stage=agreement_stage(bench.name),
            )
    return judged, info


def pipeline_units(bench: AnyBenchmark, ctx: Context[Any], judgements_dir: Path) -> dict[str, Any]:
    """Each judge's labels on the released systems' outputs (the section's models with provider
    `published`), where judges are compared with each other. Your own models' judgements are
    not read: adding or changing one does not change agreement (and dvc.yaml makes the stage
    depend on the released systems' judgements alone)."""
    ag = capability(bench)
    released = [m for m in ctx.section.models if isinstance(ctx.params.models[m], PublishedModel)]
    out = {}
    for judge in ctx.section.judges:
        js: list[Judgement] = []
        for model in released:
            path = judgements_dir / model / f"{judge}.jsonl"
            if path.exists():
                js += read_jsonl(path, Judgement)
        out[judge] = ag.units(js)
    return out


def agreement(
    bench: AnyBenchmark,
    params: Params,
    labels: Path,
    out: Path,
    *,
    judgements_dir: Path | None = None,
    report_path: Path | None = None,
    plot_path: Path | None = None,
    root: Path,
    track: bool = True,
    project_judges: bool = True,
) -> list[dict[str, Any]]:
    if track:
        from pipeline.stages.mlflow_store import preflight

        preflight(root)  # an MLflow store that is not there fails the stage now, in one line
    ag = capability(bench)
    ctx = context(bench, params, root)
    labelled = ag.load(ctx, ctx.inputs.json(str(labels)), str(labels))
    released = ag.released(labelled)
    judged: dict[str, Any] = dict(released)
    info = {n: JudgeInfo("released predictions", "released", "released") for n in released}
    if project_judges:
        mine, mine_info = judge_labelled(bench, ctx, labelled, released, root)
        judged |= mine
        info |= mine_info
    units: dict[str, Any] = {}
    if judgements_dir is not None and ag.judge_vs_judge(ctx.section):
        units = pipeline_units(bench, ctx, judgements_dir)
    result = ag.evaluate(ctx, labelled, judged, info, units, file_digest(labels))
    speeds = [
        throughput(name, i.timing_stage, i.n_judgements, i.wall_s, i.timed)
        for name, i in info.items()
        if i.timing_stage is not None and i.wall_s is not None
    ]
    for t in speeds:
        log.info(
            "judge %s: %d verdicts in %.1f s (%s judgements/s; %s)",
            t.judge,
            t.n_judgements,
            t.wall_s,
            "-" if t.judgements_per_second is None else f"{t.judgements_per_second:.1f}",
            t.measures,
        )
    if project_judges:  # run state, never in the metrics file: the report joins it to the cards
        write_throughput(root, agreement_stage(bench.name), speeds)
    write_json(out, {"rows": result.rows})
    log.info("wrote %s: %d agreement rows", out, len(result.rows))
    if report_path is not None:
        atomic_write_text(report_path, result.report)
    if plot_path is not None and result.plot is not None:
        atomic_write_bytes(plot_path, result.plot)
    if track:
        log_runs(bench, ctx, result.rows, labels, plot_path, root)
    return result.rows


def refuse_unlisted(bench: AnyBenchmark, params: Params, root: Path) -> None:
    """The judges this stage scores are each a DVC parameter of it (dvc.yaml lists them: a
    change to one re-runs it). A judge added to the section but not listed would be scored
    without being a dependency: refused, naming the fix, before any judge is called."""
    dvc_file = root / "dvc.yaml"
    if not dvc_file.exists():
        return
    from pipeline.stages.entries import unlisted

    stage = agreement_stage(bench.name)
    missing = [m for m in unlisted(params, dvc_file, bench.name) if m.startswith(f"{stage}: ")]
    if missing:
        raise ConfigError(
            f"{dvc_file}: stage {stage} scores judges its params do not list: "
            f"{'; '.join(missing)} (run `lfbench check --fix`, or add them to its params)"
        )


def log_runs(
    bench: AnyBenchmark,
    ctx: Context[Any],
    rows: Sequence[dict[str, Any]],
    labels: Path,
    plot_path: Path | None,
    root: Path,
) -> None:
    """One MLflow run per agreement row, with the labels' digest and the stage's lineage."""
    stage = agreement_stage(bench.name)
    lineage = common_tags(root) | {
        "labels.digest": file_digest(labels),
        "dvc.stage": stage,
        "dvc.stage_md5": stage_md5_of(root, stage),
    }
    plot = {plot_path.name: plot_path.read_bytes()} if plot_path and plot_path.exists() else {}
    speeds = read_throughput(root, stage)
    specs = []
    for row in capability(bench).run_rows(ctx, rows):
        judge = row.params.get("judge", "")
        # the judge's speed this time: logged as counters (re-logged in place), not part of
        # what the row is, so a re-run that judged as well does not make a new run
        timing: dict[str, float] = {}
        if row.tags.get("agreement.reference") == "human" and judge in speeds:
            t = speeds[judge]
            timing["card.wall_s"] = t.wall_s
            if t.judgements_per_second is not None:
                timing["card.judgements_per_second"] = t.judgements_per_second
        specs.append(
            run_spec(
                bench,
                ctx.params,
                dataclasses.replace(row, plots=plot),
                lineage=lineage,
                counters=timing,
            )
        )
    log_sync(EXPERIMENT, sync(EXPERIMENT, specs, root, producer=stage))
