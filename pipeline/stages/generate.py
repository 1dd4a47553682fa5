"""Stage `<benchmark>-generate@<model>`: the dataset -> one output per item (and setting, sample).

A model behind an OpenAI-compatible endpoint is sent the benchmark's planned requests through the
model layer (cache, journal, retries, rate limits, usage and cost); any other provider (a
baseline, a replayed release, a benchmark's own) answers without a model call.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.core.benchmark import AnyBenchmark, Planned
from pipeline.core.config import OpenAIModel, Params
from pipeline.core.io import write_jsonl
from pipeline.core.records import Generation, Usage
from pipeline.llm.client import cost_usd, resolve_api_key, run_chat_sync, write_usage
from pipeline.llm.types import ChatResult, UsageReport
from pipeline.stages.common import (
    context,
    finish_llm_stage,
    generate_stage,
    llm_paths,
    no_usage,
    read_dataset,
    usage_path,
)

log = logging.getLogger(__name__)


def record(benchmark: str, model: str, spec: OpenAIModel, p: Planned, r: ChatResult) -> Generation:
    """The generation record of one planned request and its result: an empty answer or a request
    that failed after the retries is an error (counted by the aggregate, never scored)."""
    ok = r.status == "ok" and bool((r.text or "").strip())
    return Generation(
        benchmark=benchmark,
        item_id=p.item_id,
        model=model,
        system=p.system,
        setting=p.setting,
        sample=p.sample,
        status="ok" if ok else "error",
        text=r.text if ok else None,
        error=None if ok else (r.error or "empty answer"),
        usage=Usage(
            input_tokens=r.input_tokens,
            output_tokens=r.output_tokens,
            requests=1,
            cost_usd=round(cost_usd(spec, r.input_tokens, r.output_tokens), 8),
        ),
        meta={**p.meta, "finish_reason": r.finish_reason},
    )


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
        gens = [
            record(bench.name, model, spec, p, r) for p, r in zip(planned, results, strict=True)
        ]
        cut = [g for g in gens if g.status == "ok" and g.meta.get("finish_reason") == "length"]
        if cut:
            log.warning(
                "%s: %d outputs stopped at max_tokens and are scored as they are (first: %s);"
                " raise max_tokens to avoid it",
                stage,
                len(cut),
                cut[0].generation_id,
            )
    else:
        gens = bench.offline_generations(ctx, model, spec, dataset)
        report = no_usage(stage)
    write_jsonl(out, gens)
    write_usage(usage_path(out), report)
    log.info("wrote %s: %d generations", out, len(gens))
    finish_llm_stage(stage, root, report, [g for g in gens if g.status != "ok"])
    return len(gens)
