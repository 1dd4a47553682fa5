"""Long²RAG (Key Point Recall): construct, generate, judge, aggregate.

- construct: the dataset. Default (`long2rag.source: summhay`): derived from the SummHay
  haystacks, no model (see derived.py). Or your JSONL file (schema.py); questions without key
  points get them from an LLM (construction.py).
- generate: one answer per (question, setting) per model (generation.py).
- judge: one verdict per (answer, key point) per judge (judging.py).
- aggregate: KPR rows, breakdowns, judge agreement, report, MLflow (aggregate.py, scoring.py).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.benchmarks.long2rag import construction, derived, generation, judging
from pipeline.benchmarks.long2rag.aggregate import ROW_KEYS, Run, agreement_rows, build_rows
from pipeline.benchmarks.long2rag.aggregate import row_key as _row_key
from pipeline.benchmarks.long2rag.report import plot_png, render
from pipeline.benchmarks.long2rag.schema import Question, load_questions
from pipeline.benchmarks.summhay.judging import ParseError
from pipeline.config import Long2ragParams, OpenAIJudge, OpenAIModel, Params
from pipeline.errors import ConfigError, DataError, StageFailed
from pipeline.io import atomic_write_text, file_digest, read_jsonl, write_json, write_jsonl
from pipeline.llm.client import (
    ChatRequest,
    UsageReport,
    clear_journal,
    resolve_api_key,
    run_chat_sync,
    write_usage,
)
from pipeline.prompts import combined_sha, load_prompt
from pipeline.records import Generation, Judgement, Usage, Verdict, generation_id
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

NAME = "long2rag"
# Bump when a prompt, parser or metric of this benchmark changes meaning.
VERSION = "1"
CONSTRUCT_STAGE = "long2rag-construct"
PLOT_NAME = "kpr_by_domain_and_category.png"

log = logging.getLogger(__name__)


def generate_stage(model: str) -> str:
    return f"long2rag-generate@{model}"


def judge_stage(model: str, judge: str) -> str:
    return f"long2rag-judge@{model}-{judge}"


def _l2(params: Params) -> Long2ragParams:
    if params.long2rag is None:
        raise ConfigError("params.yaml has no long2rag section")
    return params.long2rag


def load_dataset(path: Path) -> list[Question]:
    return load_questions(path, n_documents=None)


# ---------------------------------------------------------------- construct


def construct(params: Params, data_dir: Path, out: Path, root: Path | None = None) -> int:
    root = root or Path.cwd()
    l2 = _l2(params)
    report: UsageReport = no_usage(CONSTRUCT_STAGE)
    failures: list[tuple[str, str]] = []
    if l2.source == "summhay":
        d = l2.derived
        qs = derived.derive(data_dir, d.haystacks, d.subtopics, l2.n_documents, d.retriever)
    else:
        path = Path(l2.source)
        qs = load_questions(path if path.is_absolute() else root / path, l2.n_documents)
        need = [q for q in qs if not q.key_points]
        if need or l2.construction.decompose:
            qs, report, failures = _construct_llm(params, l2, qs, root)
        else:
            log.info("%s: every question has key points; nothing to construct", path)
    write_jsonl(out, qs)
    write_usage(usage_path(out), report)
    log.info(
        "wrote %s: %d questions, %d key points, %d questions without key points",
        out,
        len(qs),
        sum(len(q.key_points) for q in qs),
        sum(1 for q in qs if not q.key_points),
    )
    if failures:
        raise StageFailed(
            f"{CONSTRUCT_STAGE}: {len(failures)} question(s) failed (first: {failures[0][0]}:"
            f" {failures[0][1]}); the others are written; their calls are cached"
        )
    clear_journal(llm_paths(root, CONSTRUCT_STAGE)[1])
    return len(qs)


def _construct_llm(
    params: Params, l2: Long2ragParams, qs: list[Question], root: Path
) -> tuple[list[Question], UsageReport, list[tuple[str, str]]]:
    name = l2.construction.llm
    if name is None:
        raise ConfigError(
            f"long2rag.source {l2.source}: some questions have no key points; set"
            " long2rag.construction.llm to an openai judges entry to build them"
        )
    spec = params.judges[name]
    assert isinstance(spec, OpenAIJudge)
    endpoint = spec.endpoint()
    resolve_api_key(endpoint, f"judges.{name}")
    p = l2.prompts
    prompts = construction.Prompts(
        decompose=load_prompt(p.decompose, root),
        extract=load_prompt(p.extract, root),
        aggregate=load_prompt(p.aggregate, root),
        filter=load_prompt(p.filter, root),
        repair=load_prompt(p.repair, root),
    )
    cache, journal = llm_paths(root, CONSTRUCT_STAGE)
    asker = construction.Asker(
        endpoint, prompts.repair, cache, journal, CONSTRUCT_STAGE, json_mode=spec.json_mode
    )
    out, failures = construction.construct_key_points(qs, l2.construction, prompts, asker, name)
    report = asker.report or no_usage(CONSTRUCT_STAGE)
    return out, report.model_copy(update={"label": CONSTRUCT_STAGE}), failures


# ---------------------------------------------------------------- generate


def _system(model: str, spec: Any) -> str:
    return str(getattr(spec, "system", None) or model)


def generate(
    params: Params,
    model: str,
    dataset_path: Path,
    data_dir: Path,
    out: Path,
    root: Path | None = None,
) -> int:
    root = root or Path.cwd()
    l2 = _l2(params)
    spec = params.models[model]
    dataset = load_dataset(dataset_path)
    stage = generate_stage(model)
    contexts = [
        (q, generation.build_context(q, s, l2.generation)) for q in dataset for s in l2.settings
    ]
    system = _system(model, spec)
    if isinstance(spec, OpenAIModel):
        gens, report = _generate_llm(params, l2, model, spec, contexts, root)
    elif spec.provider in generation.LOCAL_PROVIDERS:
        fn = generation.LOCAL_PROVIDERS[spec.provider]
        gens = []
        for q, ctx in contexts:
            text = fn(spec, q.question, [t for _, _, t in ctx.documents], l2.generation)
            ok = bool(text.strip())
            gens.append(
                Generation(
                    benchmark=NAME,
                    item_id=q.item_id,
                    model=model,
                    system=system,
                    setting=ctx.setting,
                    status="ok" if ok else "error",
                    text=text if ok else None,
                    error=None if ok else "empty answer",
                    meta={
                        **generation.context_meta(ctx),
                        "prompt_sha": spec.provider,
                        "max_words": l2.generation.max_words,
                    },
                )
            )
        report = no_usage(stage)
    else:
        raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run long2rag")
    write_jsonl(out, gens)
    write_usage(usage_path(out), report)
    log.info("wrote %s: %d answers", out, len(gens))
    finish_llm_stage(stage, root, report, [g for g in gens if g.status != "ok"])
    return len(gens)


def _generate_llm(
    params: Params,
    l2: Long2ragParams,
    model: str,
    spec: OpenAIModel,
    contexts: Sequence[tuple[Question, generation.Context]],
    root: Path,
) -> tuple[list[Generation], UsageReport]:
    stage = generate_stage(model)
    endpoint = spec.endpoint()
    resolve_api_key(endpoint, f"models.{model}")
    prompt = load_prompt(l2.prompts.generate, root)
    system = _system(model, spec)
    reqs = [
        ChatRequest(
            key=generation_id(q.item_id, system, ctx.setting, 0),
            messages=[{"role": "user", "content": generation.render_prompt(prompt, q, ctx)}],
            prompt_sha=prompt.sha,
            max_tokens=l2.generation.max_tokens,
        )
        for q, ctx in contexts
    ]
    cache, journal = llm_paths(root, stage)
    results, report = run_chat_sync(
        endpoint, reqs, cache_path=cache, journal_path=journal, label=stage
    )
    max_tokens = l2.generation.max_tokens or spec.max_tokens
    gens = []
    for (q, ctx), res in zip(contexts, results, strict=True):
        ok = res.status == "ok" and bool((res.text or "").strip())
        gens.append(
            Generation(
                benchmark=NAME,
                item_id=q.item_id,
                model=model,
                system=system,
                setting=ctx.setting,
                status="ok" if ok else "error",
                text=res.text if ok else None,
                error=None if ok else (res.error or "empty answer"),
                usage=Usage(
                    input_tokens=res.input_tokens,
                    output_tokens=res.output_tokens,
                    requests=1,
                    cost_usd=round(
                        res.input_tokens * spec.price_input_per_1m / 1e6
                        + res.output_tokens * spec.price_output_per_1m / 1e6,
                        8,
                    ),
                ),
                meta={
                    **generation.context_meta(ctx),
                    "prompt": prompt.path,
                    "prompt_sha": prompt.sha,
                    "max_tokens": max_tokens,
                    "finish_reason": res.finish_reason,
                },
            )
        )
    n_len = sum(1 for g in gens if g.meta.get("finish_reason") == "length")
    if n_len:
        log.warning("%s: %d answers stopped at max_tokens (%d)", stage, n_len, max_tokens)
    return gens, report


# ---------------------------------------------------------------- judge


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
    root = root or Path.cwd()
    spec = params.judges[judge_name]
    dataset = {q.item_id: q for q in load_dataset(dataset_path)}
    gens = [g for g in read_jsonl(generations_path, Generation) if g.status == "ok"]
    for g in gens:
        if g.item_id not in dataset:
            raise DataError(
                "answer to a question that is not in the dataset",
                file=str(generations_path),
                item=g.generation_id,
                field="item_id",
            )
    stage = judge_stage(model, judge_name)
    if isinstance(spec, OpenAIJudge):
        js, report = _judge_llm(params, judge_name, spec, dataset, gens, root, stage)
    elif spec.provider in ("long2rag-overlap", "local"):
        cov = _coverage_judge(spec)
        cases = [
            ([(k.kp_id, k.text) for k in dataset[g.item_id].key_points], g.text or "") for g in gens
        ]
        verdicts = judging.entailment_verdicts(cov, cases)
        sha = str(cov.sha)
        js = [
            _judgement(g, judge_name, sha, vs, Usage())
            for g, vs in zip(gens, verdicts, strict=True)
        ]
        report = no_usage(stage)
    else:
        raise ConfigError(f"judges.{judge_name}: provider {spec.provider!r} cannot judge long2rag")
    write_jsonl(out, js)
    write_usage(usage_path(out), report)
    n_invalid = sum(1 for j in js for v in j.verdicts if v.status == "invalid")
    log.info("wrote %s: %d judgements, %d invalid verdicts", out, len(js), n_invalid)
    finish_llm_stage(stage, root, report, [j for j in js if j.status == "error"])
    return len(js)


def _coverage_judge(spec: Any) -> Any:
    if spec.provider == "long2rag-overlap":
        return judging.OverlapCoverage(full=spec.full, partial=spec.partial)
    # provider local: the project's trained judge (pipeline/judges/local.py)
    from pipeline.judges.embeddings import default_cache_path
    from pipeline.judges.local import LocalJudge

    root = Path.cwd()
    cache = default_cache_path(root) if spec.embedding_cache else None
    return LocalJudge.load(root / spec.model_path, cache=cache)


def _judgement(
    g: Generation,
    judge_name: str,
    sha: str,
    verdicts: list[Verdict],
    usage: Usage,
    error: str | None = None,
) -> Judgement:
    if error:
        status = "error"
    elif any(v.status == "invalid" for v in verdicts):
        status = "invalid"
    else:
        status = "ok"
    return Judgement(
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
        verdicts=[] if error else verdicts,
        error=error,
        usage=usage,
    )


def _judge_llm(
    params: Params,
    judge_name: str,
    spec: OpenAIJudge,
    dataset: dict[str, Question],
    gens: list[Generation],
    root: Path,
    stage: str,
) -> tuple[list[Judgement], UsageReport]:
    p = _l2(params).prompts
    prompt = load_prompt(p.judge_batch if spec.mode == "batched" else p.judge_point, root)
    repair = load_prompt(p.repair, root)
    sha = combined_sha(prompt, repair)
    endpoint = spec.endpoint()
    resolve_api_key(endpoint, f"judges.{judge_name}")
    fmt: dict[str, Any] | None = {"type": "json_object"} if spec.json_mode else None
    first: list[tuple[int, str | None, ChatRequest]] = []
    for gi, g in enumerate(gens):
        q = dataset[g.item_id]
        for target, req in judging.first_requests(g, q, spec.mode, prompt, sha, fmt):
            first.append((gi, target, req))
    labels: list[dict[str, str]] = [{} for _ in gens]
    problems: list[dict[str, str]] = [{} for _ in gens]
    raws: list[dict[str, str]] = [{} for _ in gens]
    errors: list[list[str]] = [[] for _ in gens]
    tokens = [[0, 0, 0] for _ in gens]

    def absorb(gi: int, target: str | None, res: Any, only: Sequence[str] | None) -> dict[str, str]:
        tokens[gi][0] += res.input_tokens
        tokens[gi][1] += res.output_tokens
        tokens[gi][2] += 1
        if res.status != "ok":
            errors[gi].append(res.error or "request failed")
            return {}
        ids = [k.kp_id for k in dataset[gens[gi].item_id].key_points]
        if target is None:
            good, bad = judging.parse_batch(res.text, list(only) if only is not None else ids)
        else:
            try:
                good, bad = {target: judging.parse_single(res.text)}, {}
            except ParseError as e:
                good, bad = {}, {target: str(e)}
        labels[gi].update(good)
        for i in good:
            problems[gi].pop(i, None)
            raws[gi][i] = (res.text or "").strip()
        for i, prob in bad.items():
            problems[gi][i] = f"{prob} | answer: {(res.text or '')[:1000]}"
        return bad

    cache, journal = llm_paths(root, stage)
    results, report = run_chat_sync(
        endpoint, [r for _, _, r in first], cache_path=cache, journal_path=journal, label=stage
    )
    repairs: list[tuple[int, str | None, list[str], ChatRequest]] = []
    for (gi, target, req), res in zip(first, results, strict=True):
        bad = absorb(gi, target, res, None)
        if bad and spec.repair:
            problem = "; ".join(bad.values())[:1500]
            messages = [
                *req.messages,
                {"role": "assistant", "content": res.text or ""},
                {"role": "user", "content": repair.render(problem=problem)},
            ]
            repairs.append(
                (
                    gi,
                    target,
                    list(bad),
                    ChatRequest(req.key + "#repair", messages, sha, 0, None, fmt),
                )
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
        for (gi, target, only, _), res in zip(repairs, results2, strict=True):
            absorb(gi, target, res, only)
    js = []
    for gi, g in enumerate(gens):
        vs = []
        for k in dataset[g.item_id].key_points:
            if k.kp_id in labels[gi]:
                vs.append(
                    Verdict(target_id=k.kp_id, label=labels[gi][k.kp_id], raw=raws[gi][k.kp_id])
                )
            else:
                vs.append(
                    Verdict(
                        target_id=k.kp_id,
                        label="INVALID",
                        status="invalid",
                        raw=problems[gi].get(k.kp_id, "no verdict"),
                    )
                )
        tin, tout, calls = tokens[gi]
        usage = Usage(
            input_tokens=tin,
            output_tokens=tout,
            requests=calls,
            cost_usd=round(
                tin * spec.price_input_per_1m / 1e6 + tout * spec.price_output_per_1m / 1e6, 8
            ),
        )
        err = "; ".join(errors[gi][:3]) if errors[gi] else None
        js.append(_judgement(g, judge_name, sha, vs, usage, err))
    return js, report


# ---------------------------------------------------------------- aggregate

ID_KEYS = ("benchmark", "system", "setting", "judge", "model", "neutral")
SECTION_KEYS = ("by_domain", "by_category", "by_length")
METRIC_KEYS = tuple(k for k in ROW_KEYS if k not in ID_KEYS + SECTION_KEYS)


def doc_tokens(dataset: Sequence[Question]) -> dict[str, int]:
    """cl100k_base tokens of each question's documents (the input-length bucket's measure)."""
    from pipeline.retrieval.tokens import count_tokens_batch

    return {q.item_id: sum(count_tokens_batch([d.text for d in q.documents])) for q in dataset}


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
    """Judgements -> rows, report and MLflow runs. `agreement_path` is accepted for the CLI's
    sake and unused: there are no human labels for Long²RAG judges (yet)."""
    l2 = _l2(params)
    dataset = load_dataset(dataset_path)
    runs = []
    for model in l2.models:
        gens = read_jsonl(generations_dir / f"{model}.jsonl", Generation)
        for judge_name in l2.judges:
            js = read_jsonl(judgements_dir / model / f"{judge_name}.jsonl", Judgement)
            runs.append(Run(model, judge_name, gens, js))
    tokens = doc_tokens(dataset)
    rows, details = build_rows(dataset, runs, tokens, l2.scoring.length_buckets, l2.scoring.neutral)
    agreement = agreement_rows(runs, l2.scoring.neutral) if len(l2.judges) > 1 else []
    write_json(metrics_path, {"rows": rows, "agreement": agreement})
    write_json(summary_path, summary(rows))
    derived_note = (
        " DERIVED from SummHay (question = subtopic query, documents = top 5 by"
        f" {l2.derived.retriever}, key points = the planted insights they hold); not the"
        " paper's data."
        if l2.source == "summhay"
        else f" From {l2.source}."
    )
    note = (
        f"Dataset: {len(dataset)} questions, {sum(len(q.key_points) for q in dataset)} key"
        f" points.{derived_note} KPR = mean over questions of the share of key points the answer"
        f" entails; neutral counts as {l2.scoring.neutral.replace('_', ' ')}. Generated by"
        " lfbench; see metrics/long2rag.json."
    )
    atomic_write_text(report_path, render(rows, agreement, note))
    log.info("wrote %s (%d rows) and %s", metrics_path, len(rows), report_path)
    if track:
        usage = collect_usage(l2.models, l2.judges, generations_dir, judgements_dir)
        shas = prompt_shas(runs, generation_default="none")
        rep = log_to_mlflow(params, rows, details, shas, dataset_path, root, usage)
        log.info(
            "mlflow: %d runs created, %d unchanged (skipped), %d superseded",
            rep.created,
            rep.skipped,
            rep.superseded,
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """{judge: {system/setting: kpr}} for `dvc metrics show/diff`."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        out.setdefault(r["judge"], {})[f"{r['system']}/{r['setting']}"] = (
            None if r["kpr"] is None else round(r["kpr"], 4)
        )
    return out


def lineage_tags(
    params: Params,
    row: dict[str, Any],
    prompt_sha: str,
    dataset_path: Path,
    root: Path,
    model_prompt_sha: str = "none",
) -> dict[str, str]:
    """The same lineage as SummHay's runs (summhay.lineage_tags), for Long²RAG stages."""
    l2 = _l2(params)
    return {
        "benchmark": NAME,
        "benchmark.version": VERSION,
        "setting": row["setting"],
        "model.name": row["system"],
        "model.entry": row["model"],
        "model.provider": params.models[row["model"]].provider,
        "judge.name": row["judge"],
        "judge.provider": params.judges[row["judge"]].provider,
        "judge.prompt_sha": prompt_sha,
        "model.prompt_sha": model_prompt_sha,
        "dataset.source": "derived:summhay" if l2.source == "summhay" else l2.source,
        "dataset.digest": file_digest(dataset_path),
        "dvc.stage": judge_stage(row["model"], row["judge"]),
        "dvc.stage_md5": stage_md5_of(root, judge_stage(row["model"], row["judge"])),
        "dvc.generate_stage_md5": stage_md5_of(root, generate_stage(row["model"])),
        "dvc.construct_stage_md5": stage_md5_of(root, CONSTRUCT_STAGE),
        **common_tags(root),
    }


def row_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers as MLflow metrics: `kpr`, the counts, and `kpr.<section>.<group>`."""
    m = {k: float(row[k]) for k in METRIC_KEYS if row[k] is not None}
    for section in SECTION_KEYS:
        for group, cell in row[section].items():
            if cell["kpr"] is not None:
                safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)[:80]
                m[f"kpr.{section.removeprefix('by_')}.{safe}"] = float(cell["kpr"])
    return m


def log_to_mlflow(
    params: Params,
    rows: list[dict[str, Any]],
    details: dict[tuple[str, ...], list[dict[str, Any]]],
    prompt_shas: dict[tuple[str, str], list[str]],
    dataset_path: Path,
    root: Path,
    usage: StageUsage | None = None,
) -> SyncReport:
    usage = usage or {}
    with tempfile.TemporaryDirectory() as tmp:
        return sync(
            NAME,
            _run_specs(params, rows, details, prompt_shas, dataset_path, root, usage, Path(tmp)),
            root,
        )


def _run_specs(
    params: Params,
    rows: list[dict[str, Any]],
    details: dict[tuple[str, ...], list[dict[str, Any]]],
    prompt_shas: dict[tuple[str, str], list[str]],
    dataset_path: Path,
    root: Path,
    usage: StageUsage,
    tmp: Path,
) -> list[RunSpec]:
    """One MLflow run per row; each row's plot is written under `tmp` (one folder per row)."""
    specs = []
    for n, row in enumerate(rows):
        key = _row_key(row)
        plot = tmp / str(n) / PLOT_NAME
        plot.parent.mkdir(parents=True)
        plot.write_bytes(plot_png(row))
        metrics = row_metrics(row) | usage_metrics(usage, row)
        specs.append(
            RunSpec(
                row_key="|".join(key),
                name=f"{row['system']} / {row['setting']} / {row['judge']}",
                metrics=metrics,
                params={k: str(row[k]) for k in ("system", "setting", "judge", "model", "neutral")},
                tags=lineage_tags(
                    params,
                    row,
                    joined_sha(prompt_shas, row["model"], row["judge"]),
                    dataset_path,
                    root,
                    joined_sha(prompt_shas, row["model"]),
                ),
                artifacts={"questions.jsonl": details[key], "row.json": row},
                files=[plot],
            )
        )
    return specs


__all__ = ["NAME", "VERSION", "aggregate", "construct", "generate", "judge"]
