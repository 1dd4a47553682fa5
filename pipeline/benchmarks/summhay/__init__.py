"""Summary of a Haystack (Laban et al., EMNLP 2024): construct, generate, judge, aggregate."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.benchmarks.summhay import published
from pipeline.benchmarks.summhay.aggregate import ROW_KEYS, Run, build_rows, row_key
from pipeline.benchmarks.summhay.report import render
from pipeline.benchmarks.summhay.schema import (
    Haystack,
    haystack_file,
    load_raw_haystack,
    normalise,
)
from pipeline.config import Params, PublishedJudge, PublishedModel
from pipeline.errors import ConfigError
from pipeline.io import atomic_write_text, file_digest, read_jsonl, write_json, write_jsonl
from pipeline.lineage import (
    dvc_file_md5,
    dvc_lock_entry,
    git_info,
    runtime_tags,
    stage_md5,
)
from pipeline.records import Generation, Judgement
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
        hays.append(normalise(hid, load_raw_haystack(path), source_file=path.name))
    n = write_jsonl(out, hays)
    n_sub = sum(len(h.subtopics) for h in hays)
    n_ins = sum(len(s.insights) for h in hays for s in h.subtopics)
    log.info("wrote %s: %d haystacks, %d subtopics, %d insights", out, n, n_sub, n_ins)
    return n


def load_dataset(path: Path) -> list[Haystack]:
    return read_jsonl(path, Haystack)


# ---------------------------------------------------------------- generate


def generate(params: Params, model: str, dataset_path: Path, data_dir: Path, out: Path) -> int:
    spec = params.models[model]
    dataset = load_dataset(dataset_path)
    if isinstance(spec, PublishedModel):
        gens = list(published.generations(model, spec, data_dir, dataset))
    else:  # pragma: no cover - other providers arrive with the model-layer issue
        raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run summhay")
    write_jsonl(out, gens)
    log.info("wrote %s: %d generations", out, len(gens))
    return len(gens)


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
        return 0
    spec = params.judges[judge_name]
    dataset = load_dataset(dataset_path)
    if isinstance(spec, PublishedJudge):
        js = list(published.judgements(judge_name, data_dir, dataset, gens))
    else:  # pragma: no cover - LLM judges arrive with the model-layer issue
        raise ConfigError(f"judges.{judge_name}: provider {spec.provider!r} cannot judge summhay")
    write_jsonl(out, js)
    log.info("wrote %s: %d judgements", out, len(js))
    return len(js)


# ---------------------------------------------------------------- aggregate


METRIC_KEYS = (
    "coverage",
    "citation",
    "joint",
    "citation_precision",
    "citation_recall",
    "words_per_bullet",
    "n_insights",
    "n_summaries",
    "n_covered",
    "n_invalid",
    "n_bad_links",
    "n_failed_generations",
    "n_failed_judgements",
    "coverage_macro",
    "citation_macro",
    "joint_macro",
)


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
) -> list[dict[str, Any]]:
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
        prompt_shas = {
            (r.model, r.judge): sorted({j.judge_prompt_sha for j in r.judgements}) for r in runs
        }
        report = log_to_mlflow(params, rows, details, prompt_shas, dataset_path, root)
        log.info(
            "mlflow: %d runs created, %d unchanged (skipped), %d superseded",
            report.created,
            report.skipped,
            report.superseded,
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
    params: Params, row: dict[str, Any], prompt_sha: str, dataset_path: Path, root: Path
) -> dict[str, str]:
    git = git_info(root)
    judge_entry = dvc_lock_entry(root, judge_stage(row["model"], row["judge"]))
    gen_entry = dvc_lock_entry(root, generate_stage(row["model"]))
    tags = {
        "benchmark": NAME,
        "benchmark.version": VERSION,
        "lfbench.version": __version__,
        "domain": row["domain"],
        "mode": row["mode"],
        "setting": row["setting"],
        "model.name": row["system"],
        "model.entry": row["model"],
        "model.provider": params.models[row["model"]].provider,
        "judge.name": row["judge"],
        "judge.provider": params.judges[row["judge"]].provider,
        "judge.prompt_sha": prompt_sha,
        "dataset.digest": file_digest(dataset_path),
        "data.digest": dvc_file_md5(root / "data.dvc") or "unknown",
        "dvc.stage": judge_stage(row["model"], row["judge"]),
        "dvc.stage_md5": stage_md5(judge_entry) if judge_entry else "unknown",
        "dvc.generate_stage_md5": stage_md5(gen_entry) if gen_entry else "unknown",
        "git.commit": git.commit,
        "git.dirty": "unknown" if git.dirty is None else str(git.dirty).lower(),
        **runtime_tags(),
    }
    return tags


def log_to_mlflow(
    params: Params,
    rows: list[dict[str, Any]],
    details: dict[tuple[str, ...], list[dict[str, Any]]],
    prompt_shas: dict[tuple[str, str], list[str]],
    dataset_path: Path,
    root: Path,
) -> SyncReport:
    specs = []
    for row in rows:
        key = row_key(row)
        sha = ",".join(prompt_shas.get((row["model"], row["judge"]), [])) or "none"
        metrics = {k: float(row[k]) for k in METRIC_KEYS if row[k] is not None}
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
                tags=lineage_tags(params, row, sha, dataset_path, root),
                artifacts={"judgements.jsonl": details[key], "row.json": row},
            )
        )
    return sync(NAME, specs, root)


__all__ = ["NAME", "ROW_KEYS", "VERSION", "aggregate", "construct", "generate", "judge"]
