"""Summary of a Haystack (Laban et al., EMNLP 2024): construct, generate, judge, aggregate."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from pipeline import plots
from pipeline.benchmarks.summhay import generation, judging, published
from pipeline.benchmarks.summhay.aggregate import ROW_KEYS, Run, build_rows, row_key
from pipeline.benchmarks.summhay.report import render
from pipeline.benchmarks.summhay.schema import (
    Haystack,
    Subtopic,
    haystack_file,
    load_raw_haystack,
    normalise,
)
from pipeline.config import (
    BaselineModel,
    LocalJudge,
    OpenAIJudge,
    OpenAIModel,
    Params,
    PublishedJudge,
    PublishedModel,
)
from pipeline.errors import ConfigError, DataError
from pipeline.io import (
    atomic_write_text,
    file_digest,
    read_jsonl,
    write_json,
    write_jsonl,
)
from pipeline.llm.client import (
    ChatRequest,
    UsageReport,
    resolve_api_key,
    run_chat_sync,
    write_usage,
)
from pipeline.prompts import combined_sha, load_prompt
from pipeline.records import Generation, Judgement, Usage
from pipeline.stages import (
    StageUsage,
    collect_usage,
    common_tags,
    finish_llm_stage,
    joined_sha,
    llm_paths,
    no_usage,
    prompt_shas,
    stage_md5_of,
    usage_metrics,
    usage_path,
)
from pipeline.tracking import RunSpec, SyncReport, sync

NAME = "summhay"
# Bump when a prompt, parser or metric of this benchmark changes meaning.
VERSION = "1"

log = logging.getLogger(__name__)


def generate_stage(model: str) -> str:
    return f"summhay-generate@{model}"


def judge_stage(model: str, judge: str) -> str:
    return f"summhay-judge@{model}-{judge}"


# ---------------------------------------------------------------- construct


def construct(params: Params, data_dir: Path, out: Path) -> int:
    hays = []
    for hid in params.summhay.haystacks:
        path = data_dir / haystack_file(hid)
        hay = normalise(hid, load_raw_haystack(path), source_file=path.name)
        if params.summhay.subtopics is not None:
            hay = hay.model_copy(update={"subtopics": hay.subtopics[: params.summhay.subtopics]})
        hays.append(hay)
    n = write_jsonl(out, hays)
    n_sub = sum(len(h.subtopics) for h in hays)
    n_ins = sum(len(s.insights) for h in hays for s in h.subtopics)
    log.info("wrote %s: %d haystacks, %d subtopics, %d insights", out, n, n_sub, n_ins)
    return n


def load_dataset(path: Path) -> list[Haystack]:
    return read_jsonl(path, Haystack)


# ---------------------------------------------------------------- generate


def generate(
    params: Params,
    model: str,
    dataset_path: Path,
    data_dir: Path,
    out: Path,
    root: Path | None = None,
) -> int:
    root = root or Path.cwd()
    spec = params.models[model]
    dataset = load_dataset(dataset_path)
    if isinstance(spec, PublishedModel):
        gens = list(published.generations(model, spec, data_dir, dataset))
        report = no_usage(generate_stage(model))
    elif isinstance(spec, OpenAIModel):
        gens, report = _generate_llm(params, model, spec, dataset, root)
    elif isinstance(spec, BaselineModel):
        gens = generation.baseline_generations(params, model, spec, dataset)
        report = no_usage(generate_stage(model))
    else:  # pragma: no cover - exhaustive over ModelSpec
        raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run summhay")
    write_jsonl(out, gens)
    write_usage(usage_path(out), report)
    log.info("wrote %s: %d generations", out, len(gens))
    finish_llm_stage(generate_stage(model), root, report, [g for g in gens if g.status != "ok"])
    return len(gens)


def _generate_llm(
    params: Params, model: str, spec: OpenAIModel, dataset: list[Haystack], root: Path
) -> tuple[list[Generation], UsageReport]:
    stage = generate_stage(model)
    endpoint = spec.endpoint()
    resolve_api_key(endpoint, f"models.{model}")
    planned = generation.plan(params, model, spec, dataset, generation.prompts_for(params, root))
    cache, journal = llm_paths(root, stage)
    results, report = run_chat_sync(
        endpoint,
        [p.request for p in planned],
        cache_path=cache,
        journal_path=journal,
        label=stage,
    )
    truncated = [r.key for r in results if r.status == "ok" and r.finish_reason == "length"]
    if truncated:
        log.warning(
            "%s: %d summaries stopped at max_tokens (%d) and are scored as they are (first: %s);"
            " raise max_tokens to avoid it",
            stage,
            len(truncated),
            spec.max_tokens,
            truncated[0],
        )
    return [
        generation.to_record(model, spec, p, r) for p, r in zip(planned, results, strict=True)
    ], report


# ---------------------------------------------------------------- judge


def judge_applies(params: Params, model: str, judge: str) -> bool:
    """The published judge only knows the released summaries."""
    return not (
        isinstance(params.judges[judge], PublishedJudge)
        and not isinstance(params.models[model], PublishedModel)
    )


def judge(
    params: Params,
    model: str,
    judge_name: str,
    dataset_path: Path,
    generations_path: Path,
    data_dir: Path,
    out: Path,
    root: Path | None = None,
) -> int:
    gens = read_jsonl(generations_path, Generation)
    if not judge_applies(params, model, judge_name):
        log.warning(
            "judge %s replays released judgements and does not apply to model %s (provider %s);"
            " writing no judgements",
            judge_name,
            model,
            params.models[model].provider,
        )
        write_jsonl(out, [])
        write_usage(usage_path(out), no_usage(judge_stage(model, judge_name)))
        return 0
    spec = params.judges[judge_name]
    dataset = load_dataset(dataset_path)
    stage = judge_stage(model, judge_name)
    if isinstance(spec, PublishedJudge):
        js = list(published.judgements(judge_name, data_dir, dataset, gens))
        report = no_usage(stage)
    elif isinstance(spec, OpenAIJudge):
        js, report = _judge_llm(params, model, judge_name, spec, dataset, gens, root or Path.cwd())
    elif isinstance(spec, LocalJudge):
        from pipeline.benchmarks.summhay.local_judge import judge_generations

        started = time.perf_counter()
        js = judge_generations(judge_name, spec, dataset, gens, root or Path.cwd())
        # The usage file is a DVC output: a stage that calls no model records its counts only,
        # so a re-run anywhere writes the same bytes (and dvc.lock stays the same); its time is
        # in the log (and benchmarks/local_judge.py measures its speed).
        report = no_usage(stage).model_copy(update={"items": len(js), "ok": len(js)})
        log.info("%s: %d judgements in %.1f s", stage, len(js), time.perf_counter() - started)
    else:  # pragma: no cover - exhaustive over JudgeSpec
        raise ConfigError(f"judges.{judge_name}: provider {spec.provider!r} cannot judge summhay")
    write_jsonl(out, js)
    write_usage(usage_path(out), report)
    n_invalid = sum(1 for j in js for v in j.verdicts if v.status == "invalid")
    log.info("wrote %s: %d judgements, %d invalid verdicts", out, len(js), n_invalid)
    if n_invalid:
        log.warning(
            "%s: %d verdicts were unusable after a repair attempt; they are counted as"
            " invalid_judgements and left out of the scores",
            stage,
            n_invalid,
        )
    finish_llm_stage(stage, root or Path.cwd(), report, [j for j in js if j.status == "error"])
    return len(js)


def _judge_llm(
    params: Params,
    model: str,
    judge_name: str,
    spec: OpenAIJudge,
    dataset: list[Haystack],
    gens: list[Generation],
    root: Path,
    *,
    subs: dict[str, Subtopic] | None = None,
    stage: str | None = None,
) -> tuple[list[Judgement], UsageReport]:
    """Judge `gens` with an LLM. `subs` (item id -> subtopic) replaces the dataset's subtopics
    and `stage` the journal's stage name, for judging outside the judge stage (agreement)."""
    p = params.summhay.prompts
    prompt = load_prompt(p.judge_batch if spec.mode == "batched" else p.judge_insight, root)
    repair = load_prompt(p.judge_repair, root)
    sha = combined_sha(prompt, repair)
    endpoint = spec.endpoint()
    resolve_api_key(endpoint, f"judges.{judge_name}")
    if subs is None:
        subs = {s.item_id: s for h in dataset for s in h.subtopics}
    fmt: dict[str, Any] | None = {"type": "json_object"} if spec.json_mode else None

    tasks: list[judging.Task] = []
    first: list[tuple[int, str | None, ChatRequest]] = []
    for gen in gens:
        if gen.status != "ok":
            continue  # nothing to judge; aggregate counts it as a failed generation
        if gen.item_id not in subs:
            raise DataError(
                "generation of an item that is not in the dataset",
                item=gen.generation_id,
                field="item_id",
            )
        sub = subs[gen.item_id]
        tasks.append(judging.make_task(gen, sub))
        for target, req in judging.first_requests(tasks[-1], sub, spec.mode, prompt, sha, fmt):
            first.append((len(tasks) - 1, target, req))

    stage = stage or judge_stage(model, judge_name)
    cache, journal = llm_paths(root, stage)
    results, report = run_chat_sync(
        endpoint, [r for _, _, r in first], cache_path=cache, journal_path=journal, label=stage
    )
    repairs: list[tuple[int, str | None, list[str], ChatRequest]] = []
    for (ti, target, req), res in zip(first, results, strict=True):
        bad = judging.absorb(tasks[ti], target, res, final=not spec.repair)
        if bad:
            problem = "; ".join(bad.values())[:1500]
            repairs.append(
                (ti, target, list(bad), judging.repair_request(req, res.text, problem, repair))
            )
    if repairs:
        log.info("%s: %d answers unusable, sending one repair request each", stage, len(repairs))
        results2, report2 = run_chat_sync(
            endpoint,
            [r for *_, r in repairs],
            cache_path=cache,
            journal_path=journal,
            label=stage + " (repair)",
        )
        report = report.merged(report2)
        for (ti, target, only, _), res in zip(repairs, results2, strict=True):
            judging.absorb(tasks[ti], target, res, final=True, only=only)

    js = []
    for t in tasks:
        g = t.generation
        verdicts = [t.verdicts[i] for i in t.insight_ids if i in t.verdicts]
        if t.errors:
            status = "error"
        elif any(v.status == "invalid" for v in verdicts):
            status = "invalid"
        else:
            status = "ok"
        js.append(
            Judgement(
                benchmark=NAME,
                generation_id=g.generation_id,
                item_id=g.item_id,
                model=g.model,
                system=g.system,
                setting=g.setting,
                sample=g.sample,
                judge=judge_name,
                judge_prompt_sha=sha,
                status=status,
                verdicts=[] if t.errors else verdicts,
                error="; ".join(t.errors[:3]) if t.errors else None,
                usage=Usage(
                    input_tokens=t.input_tokens,
                    output_tokens=t.output_tokens,
                    requests=t.calls,
                    cost_usd=round(
                        t.input_tokens * spec.price_input_per_1m / 1e6
                        + t.output_tokens * spec.price_output_per_1m / 1e6,
                        8,
                    ),
                ),
            )
        )
    return js, report


# ---------------------------------------------------------------- local judge training


def train_local_judge(
    params: Params,
    judge_name: str,
    data_dir: Path,
    eval_path: Path,
    out: Path,
    metrics_path: Path,
    root: Path | None = None,
) -> dict[str, Any]:
    from pipeline.benchmarks.summhay.local_judge import train

    return train(params, judge_name, data_dir, eval_path, out, metrics_path, root or Path.cwd())


# ---------------------------------------------------------------- aggregate


# Every numeric column of a row is an MLflow metric; the others identify the row.
ID_KEYS = ("benchmark", "domain", "system", "setting", "judge", "mode", "model")
METRIC_KEYS = tuple(k for k in ROW_KEYS if k not in ID_KEYS)


def aggregate(
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
) -> list[dict[str, Any]]:
    """Judgements -> rows, report and MLflow runs. `agreement_path` (the agreement stage's
    metrics) adds each judge's kappa against people to its runs (`judge.kappa_vs_human`)."""
    dataset = load_dataset(dataset_path)
    runs = []
    for model in params.summhay.models:
        gens = read_jsonl(generations_dir / f"{model}.jsonl", Generation)
        for judge_name in params.summhay.judges:
            if not judge_applies(params, model, judge_name):
                continue
            js = read_jsonl(judgements_dir / model / f"{judge_name}.jsonl", Judgement)
            runs.append(Run(model, judge_name, gens, js))
    scoring = params.summhay.scoring
    rows, details = build_rows(dataset, runs, scoring.modes, scoring.partial_credit / 100.0)
    write_json(metrics_path, {"rows": rows})
    write_json(summary_path, summary(rows))
    domains = sorted({h.domain for h in dataset})
    note = (
        f"Dataset: {len(dataset)} haystacks ({', '.join(domains)}), "
        f"{sum(len(h.subtopics) for h in dataset)} subtopics. Scores on 0-100; Citation is the "
        "mean citation F1 over covered insights. Generated by lfbench; see metrics/summhay.json."
    )
    atomic_write_text(report_path, render(rows, note))
    log.info("wrote %s (%d rows) and %s", metrics_path, len(rows), report_path)
    if track:
        shas = prompt_shas(runs, generation_default="published")
        usage = collect_usage(
            params.summhay.models, params.summhay.judges, generations_dir, judgements_dir
        )
        kappas = {}
        if agreement_path is not None:
            from pipeline.benchmarks.summhay.agreement import human_rows

            kappas = {
                j: float(r["cohen_kappa"])
                for j, r in human_rows(agreement_path).items()
                if r.get("cohen_kappa") is not None
            }
        report = log_to_mlflow(params, rows, details, shas, dataset_path, root, usage, kappas)
        log.info(
            "mlflow: %d runs created, %d unchanged (skipped), %d superseded, "
            "%d with plots re-logged",
            report.created,
            report.skipped,
            report.superseded,
            report.refreshed,
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """The headline scores nested for `dvc metrics show/diff`: {domain/judge/mode: {system/
    setting: {coverage, citation, joint}}} (DVC cannot read the row list)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for r in rows:
        section = out.setdefault(f"{r['domain']}/{r['judge']}/{r['mode']}", {})
        section[f"{r['system']}/{r['setting']}"] = {
            k: None if r[k] is None else round(r[k], 2) for k in ("coverage", "citation", "joint")
        }
    return out


def lineage_tags(
    params: Params,
    row: dict[str, Any],
    prompt_sha: str,
    dataset_path: Path,
    root: Path,
    model_prompt_sha: str = "none",
) -> dict[str, str]:
    return {
        "benchmark": NAME,
        "benchmark.version": VERSION,
        "domain": row["domain"],
        "mode": row["mode"],
        "setting": row["setting"],
        "model.name": row["system"],
        "model.entry": row["model"],
        "model.provider": params.models[row["model"]].provider,
        "judge.name": row["judge"],
        "judge.provider": params.judges[row["judge"]].provider,
        "judge.prompt_sha": prompt_sha,
        "model.prompt_sha": model_prompt_sha,
        "dataset.digest": file_digest(dataset_path),
        "dvc.stage": judge_stage(row["model"], row["judge"]),
        "dvc.stage_md5": stage_md5_of(root, judge_stage(row["model"], row["judge"])),
        "dvc.generate_stage_md5": stage_md5_of(root, generate_stage(row["model"])),
        **common_tags(root),
    }


def _plot_group(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(row[k]) for k in ("domain", "judge", "mode", "model", "system"))


def _plots_sha(plots: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(plots):
        h.update(name.encode() + b"\0" + hashlib.sha256(plots[name]).digest())
    return h.hexdigest()[:16]


def summhay_plots(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, bytes]]:
    """The plots logged with each run, per (domain, judge, mode, model entry, system):
    `plots/joint_by_setting.png` (the system's scores in each context setting) and, when the
    system has whole-haystack orderings, `plots/position_sensitivity.png` (Joint with the
    relevant documents at the top / middle / bottom of the context vs the default order, for
    every system of that domain, judge and mode that has them)."""
    by_group: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    by_view: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(_plot_group(r), []).append(r)
        by_view.setdefault(_plot_group(r)[:3], []).append(r)
    position: dict[tuple[str, ...], tuple[set[str], bytes | None]] = {}
    for view, vrows in by_view.items():
        domain, judge_name, mode = view
        systems = {t["system"] for t in plots.position_table(vrows)}
        title = f"SummHay position sensitivity ({domain}, {judge_name}, {mode})"
        position[view] = (systems, plots.position_sensitivity(vrows, title) if systems else None)
    out: dict[tuple[str, ...], dict[str, bytes]] = {}
    for group, grows in sorted(by_group.items()):
        domain, judge_name, mode, _, system = group
        title = f"SummHay {system} ({domain}, judge {judge_name}, {mode})"
        files = {"plots/joint_by_setting.png": plots.joint_by_setting(grows, title)}
        systems, png = position[group[:3]]
        if png is not None and system in systems:
            files["plots/position_sensitivity.png"] = png
        out[group] = files
    return out


def log_to_mlflow(
    params: Params,
    rows: list[dict[str, Any]],
    details: dict[tuple[str, ...], list[dict[str, Any]]],
    prompt_shas: dict[tuple[str, str], list[str]],
    dataset_path: Path,
    root: Path,
    usage: StageUsage | None = None,
    kappa_vs_human: dict[str, float] | None = None,
) -> SyncReport:
    specs = []
    usage = usage or {}
    kappa_vs_human = kappa_vs_human or {}
    plot_files = summhay_plots(rows)
    for row in rows:
        key = row_key(row)
        row_plots = plot_files.get(_plot_group(row), {})
        metrics = {k: float(row[k]) for k in METRIC_KEYS if row[k] is not None}
        metrics |= usage_metrics(usage, row)
        tags = lineage_tags(
            params,
            row,
            joined_sha(prompt_shas, row["model"], row["judge"]),
            dataset_path,
            root,
            joined_sha(prompt_shas, row["model"]),
        )
        kappa = kappa_vs_human.get(row["judge"])
        if kappa is not None:
            metrics["judge.kappa_vs_human"] = kappa
            tags["judge.kappa_vs_human"] = f"{kappa:.3f}"
        specs.append(
            RunSpec(
                row_key="|".join(key),
                name=f"{row['system']} / {row['setting']} / {row['judge']} / {row['mode']}"
                f" / {row['domain']}",
                metrics=metrics,
                params={
                    k: str(row[k])
                    for k in ("domain", "system", "setting", "judge", "mode", "model")
                }
                | {"partial_credit": str(params.summhay.scoring.partial_credit)},
                tags=tags | {"lfbench.plots_sha": _plots_sha(row_plots)},
                artifacts={"judgements.jsonl": details[key], "row.json": row, **row_plots},
            )
        )
    return sync(NAME, specs, root)


__all__ = ["NAME", "ROW_KEYS", "VERSION", "aggregate", "construct", "generate", "judge"]
