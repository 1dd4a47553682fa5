"""Stage `<benchmark>-generate@<model>`: the dataset -> one output per item (and setting, sample).

A model behind an OpenAI-compatible endpoint is sent the benchmark's planned requests through the
model layer (cache, journal, retries, rate limits, usage and cost); any other provider (a
baseline, a replayed release, a benchmark's own) answers without a model call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.core import extensions
from pipeline.core.benchmark import AnyBenchmark, Planned
from pipeline.core.config import OpenAIModel, OutputsModel, Params, PythonModel, Slice
from pipeline.core.errors import ConfigError
from pipeline.core.io import write_jsonl
from pipeline.core.records import Generation, Usage
from pipeline.core.types import ChatResult, UsageReport
from pipeline.llm.client import (
    CUT_REASONS,
    cost_usd,
    resolve_api_key,
    run_chat_sync,
    write_usage,
)
from pipeline.stages.common import (
    context,
    entry_sha,
    finish_llm_stage,
    generate_stage,
    llm_paths,
    no_usage,
    read_dataset,
    usage_path,
)

log = logging.getLogger(__name__)


def truncation_cause(r: ChatResult, max_tokens: int) -> str:
    """Why the server cut an answer, in words: its content filter, `max_tokens`, or (an answer
    cut for length shorter than that) the server's context window, which the prompt and the
    answer filled."""
    if r.finish_reason == "content_filter":
        if not (r.text or "").strip():
            return "stopped by the server's content filter before any text"
        return f"cut by the server's content filter after {r.output_tokens} output tokens"
    if r.output_tokens and r.output_tokens < max_tokens:
        return (
            f"cut for length after {r.output_tokens} output tokens, below max_tokens"
            f" ({max_tokens}): the prompt ({r.input_tokens} tokens) and the answer filled the"
            " server's context window (raise it, e.g. llama.cpp --n_ctx or vLLM"
            " --max-model-len, or give the model a shorter context)"
        )
    return f"stopped at max_tokens ({max_tokens}) after {r.output_tokens} output tokens"


def record(
    benchmark: str,
    model: str,
    spec: OpenAIModel,
    p: Planned,
    r: ChatResult,
    first: ChatResult | None = None,
) -> Generation:
    """The generation record of one planned request and its result: an empty answer or a request
    that failed after the retries is an error (counted by the aggregate, never scored); an answer
    the server cut (`finish_reason` length or content_filter) is kept and flagged
    (`meta.truncated`, the cause in `meta.truncation`), or an error (`on_truncation: fail`, or
    nothing left of it). `first`: the cut answer a retry replaced (its tokens and cost count
    too)."""
    retried = first is not None
    ok = r.status == "ok" and bool((r.text or "").strip())
    max_tokens = (spec.retry_max_tokens or 2 * spec.max_tokens) if retried else spec.max_tokens
    cut = r.status == "ok" and r.finish_reason in CUT_REASONS
    cause = truncation_cause(r, max_tokens) if cut else ""
    error = None if ok else (r.error or (f"truncated: {cause}" if cut else "empty answer"))
    if ok and cut and spec.on_truncation == "fail":
        ok, error = False, f"truncated: {cause}"
    meta = {**p.meta, "finish_reason": r.finish_reason}
    if cut:
        meta |= {"truncated": True, "truncation": cause}
    if retried:
        meta["retried_max_tokens"] = max_tokens
    window = spec.context_window
    if ok and window is not None and r.input_tokens and r.input_tokens + r.output_tokens > window:
        # the server counted more tokens than the model's declared window (it was started with
        # a larger one): such an answer can be nonsense; flagged, counted in the row
        meta |= {"over_context": True, "context_tokens_used": r.input_tokens + r.output_tokens}
    tin = r.input_tokens + (first.input_tokens if first else 0)
    tout = r.output_tokens + (first.output_tokens if first else 0)
    return Generation(
        benchmark=benchmark,
        item_id=p.item_id,
        model=model,
        system=p.system,
        setting=p.setting,
        sample=p.sample,
        status="ok" if ok else "error",
        text=r.text if ok else None,
        error=error,
        usage=Usage(
            input_tokens=tin,
            output_tokens=tout,
            requests=1 + retried,
            cost_usd=round(cost_usd(spec, tin, tout), 8),
        ),
        meta=meta,
    )


def warn_local_model_traps(stage: str, planned: Sequence[Planned], gens: list[Generation]) -> None:
    """Record each answer's copy rate (`meta.copy_rate`: the share of it copied word for word
    from its prompt) and warn once when the answers are mostly empty or mostly copied."""
    from pipeline.core.copying import copy_rate, local_model_traps

    rates = []
    for i, (p, g) in enumerate(zip(planned, gens, strict=True)):
        if g.status != "ok" or not g.text:
            continue
        prompt = "\n".join(str(m.get("content", "")) for m in p.request.messages)
        rate = copy_rate(g.text, prompt)
        if rate is not None:
            rates.append(rate)
            gens[i] = g.model_copy(update={"meta": {**g.meta, "copy_rate": round(rate, 4)}})
    empty = sum(1 for g in gens if g.status != "ok" and g.error == "empty answer")
    for warning in local_model_traps(len(gens), empty, rates):
        log.warning("%s: %s", stage, warning)


def sliced(
    bench: AnyBenchmark, dataset: Sequence[Any], cut: Slice, model: str, where: str
) -> list[Any]:
    """The dataset cut to a model's own slice (`models.<model>.slice.<benchmark>`)."""
    ids = list(bench.items(dataset))
    unknown = cut.unknown(ids)
    if unknown:
        raise ConfigError(
            f"models.{model}.slice.{bench.name}.items names no item of {where}: "
            + ", ".join(map(repr, unknown))
            + f" ({len(ids)} items, e.g. {', '.join(ids[:3])}; a name before a / takes its group)"
        )
    keep = set(cut.select(ids))
    if not keep:
        raise ConfigError(
            f"models.{model}.slice.{bench.name} ({cut.describe()}) selects no item of {where}"
            f" ({len(ids)} items, e.g. {', '.join(ids[:3])})"
        )
    out = extensions.restrict(bench, dataset, keep)
    log.info(
        "%s: %s's slice (%s): %d of %d items",
        bench.name,
        model,
        cut.describe(),
        len(keep),
        len(ids),
    )
    return out


def model_dataset(
    bench: AnyBenchmark, dataset: list[Any], spec: object, model: str, where: str
) -> list[Any]:
    """The items a model runs on: its own slice of the dataset when it has one for this
    benchmark (what `generate` sends and `lfbench plan` counts), else the whole dataset."""
    cuts = getattr(spec, "slice", None)
    if isinstance(cuts, dict) and bench.name in cuts:
        return sliced(bench, dataset, cuts[bench.name], model, where)
    return dataset


def generate(
    bench: AnyBenchmark,
    params: Params,
    model: str,
    dataset_path: Path,
    data_dir: Path,
    out: Path,
    root: Path,
) -> int:
    stage = generate_stage(bench.name, model)
    spec = params.models[model]
    ctx = context(bench, params, root, data_dir)
    dataset = read_dataset(bench, dataset_path)
    report: UsageReport
    lineage: dict[str, str] = {}
    dataset = model_dataset(bench, dataset, spec, model, str(dataset_path))
    if isinstance(spec, OpenAIModel):
        endpoint = spec.endpoint()
        resolve_api_key(endpoint, f"models.{model}")
        planned = bench.plan_generations(ctx, model, spec, dataset)
        cache, journal = llm_paths(root, stage)
        results, report = run_chat_sync(
            endpoint,
            [p.request for p in planned],
            cache_path=cache,
            journal_path=journal,
            label=stage,
        )
        firsts: dict[int, ChatResult] = {}
        cut = [i for i, r in enumerate(results) if r.status == "ok" and r.finish_reason == "length"]
        if cut and spec.on_truncation == "retry":
            # once more with the larger budget (its own cache key: max_tokens is part of it)
            budget = spec.retry_max_tokens or 2 * spec.max_tokens
            again = [replace(planned[i].request, max_tokens=budget) for i in cut]
            redone, more = run_chat_sync(
                endpoint, again, cache_path=cache, journal_path=journal, label=f"{stage} (retry)"
            )
            report = report.merged(more)
            for i, r in zip(cut, redone, strict=True):
                if r.status == "ok":
                    firsts[i] = results[i]
                    results[i] = r
            log.info(
                "%s: %d answers cut for length retried with max_tokens %d", stage, len(cut), budget
            )
        gens = [
            record(bench.name, model, spec, p, r, firsts.get(i))
            for i, (p, r) in enumerate(zip(planned, results, strict=True))
        ]
        warn_local_model_traps(stage, planned, gens)
        over = [g for g in gens if g.meta.get("over_context")]
        if over:
            log.warning(
                "%s: %d of %d answers came from a prompt and answer past the model's context"
                " window (%d tokens; up to %d): a model fed more than it was trained on answers"
                " nonsense. Their rows are flagged (over context); give the model a shorter"
                " context, or serve it with at most its window",
                stage,
                len(over),
                len(gens),
                spec.context_window,
                max(int(g.meta["context_tokens_used"]) for g in over),
            )
        truncated = [g for g in gens if g.meta.get("truncated")]
        report = report.model_copy(update={"truncated": len(truncated)})
        if truncated:
            filtered = sum(g.meta.get("finish_reason") == "content_filter" for g in truncated)
            why = ", ".join(
                f"{n} {what}"
                for n, what in (
                    (len(truncated) - filtered, "for length"),
                    (filtered, "by the server's content filter"),
                )
                if n
            )
            kept = sum(g.status == "ok" for g in truncated)
            log.warning(
                "%s: %d of %d answers were cut (%s): %d kept, flagged, %d failed%s; first, %s: %s",
                stage,
                len(truncated),
                len(gens),
                why,
                kept,
                len(truncated) - kept,
                " (on_truncation: fail, or nothing left)" if kept < len(truncated) else "",
                truncated[0].generation_id,
                truncated[0].meta["truncation"],
            )
    elif isinstance(spec, PythonModel | OutputsModel):
        from pipeline.stages.systems import system_generations

        gens, report, lineage = system_generations(bench, ctx, model, spec, dataset, root, stage)
    else:
        gens = bench.offline_generations(ctx, model, spec, dataset)
        report = no_usage(stage)
    write_jsonl(out, gens)
    extra = {"system": lineage} if lineage else None
    write_usage(usage_path(out), report, entry_sha(spec, bench.name), extra)
    log.info("wrote %s: %d generations", out, len(gens))
    finish_llm_stage(stage, root, report, [g for g in gens if g.status != "ok"])
    return len(gens)
