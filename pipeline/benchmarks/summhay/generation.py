"""SummHay generation through an OpenAI-compatible model.

For each subtopic (item) of each haystack, each context setting of the model entry and each
sample: build the context (the whole haystack in an order, or retrieved documents packed into the
token budget), render the domain's prompt and ask the model for a bullet-point summary that cites
documents as `[i]`, i being the document's position in the haystack whatever the order shown.

All calls go through `pipeline.llm` (cache, journal, retries, rate limits); this module only
builds the requests and turns the answers into `Generation` records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.benchmarks.summhay.schema import Haystack, Subtopic
from pipeline.config import BaselineModel, OpenAIModel, Params
from pipeline.llm.client import ChatRequest, ChatResult
from pipeline.prompts import Prompt, load_prompt
from pipeline.records import Generation, Usage, generation_id

if TYPE_CHECKING:
    from pipeline.retrieval.context import Context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """One generation to make: the request and what the record needs besides the answer."""

    request: ChatRequest
    item_id: str
    setting: str
    sample: int
    meta: dict[str, object]


def n_insights(sub: Subtopic) -> int:
    """The number of bullets asked for: the subtopic's insights that some document holds."""
    return sum(1 for i in sub.insights if i.gold_docs) or len(sub.insights)


def contexts(
    params: Params, dataset: Sequence[Haystack], settings: Sequence[str]
) -> Iterator[tuple[Haystack, Subtopic, str, Context]]:
    """Every (haystack, subtopic, setting) context a model sees, in dataset order: the whole
    haystack (`full*`) or retrieved documents packed into the RAG token budget."""
    from pipeline.retrieval.context import build_context  # numpy and tokenizers: load on use

    for hay in dataset:
        for sub in hay.subtopics:
            for setting in settings:
                budget = None if setting.startswith("full") else params.summhay.rag_budget_tokens
                yield (
                    hay,
                    sub,
                    setting,
                    build_context(hay, sub, setting, budget_tokens=budget, seed=params.seed),
                )


def prompts_for(params: Params, root: Path) -> dict[str, Prompt]:
    p = params.summhay.prompts
    return {
        "news": load_prompt(p.generate_news, root),
        "conversation": load_prompt(p.generate_conversation, root),
    }


def plan(
    params: Params,
    model: str,
    spec: OpenAIModel,
    dataset: Sequence[Haystack],
    prompts: dict[str, Prompt],
) -> list[Planned]:
    system = spec.system or model
    out = []
    for hay, sub, setting, ctx in contexts(params, dataset, spec.settings):
        prompt = prompts[hay.domain]
        text = prompt.render(
            n_documents=len(ctx.documents),
            topic=hay.topic,
            participants=", ".join(hay.participants) or "various people",
            documents=ctx.text,
            query=sub.query,
            subtopic=sub.subtopic,
            n_insights=n_insights(sub),
        )
        meta: dict[str, object] = {
            "prompt": prompt.path,
            "prompt_sha": prompt.sha,
            "context_docs": [d.position for d in ctx.documents],
            "context_tokens": ctx.n_tokens,
            "context_truncated": any(d.truncated for d in ctx.documents),
        }
        for sample in range(spec.samples):
            gid = generation_id(sub.item_id, system, setting, sample)
            out.append(
                Planned(
                    ChatRequest(
                        key=gid,
                        messages=[{"role": "user", "content": text}],
                        prompt_sha=prompt.sha,
                        sample=sample,
                    ),
                    sub.item_id,
                    setting,
                    sample,
                    meta,
                )
            )
    return out


def to_record(model: str, spec: OpenAIModel, planned: Planned, result: ChatResult) -> Generation:
    usage = Usage(
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        requests=1,
        cost_usd=round(
            result.input_tokens * spec.price_input_per_1m / 1e6
            + result.output_tokens * spec.price_output_per_1m / 1e6,
            8,
        ),
    )
    meta = dict(planned.meta)
    meta["finish_reason"] = result.finish_reason
    ok = result.status == "ok" and bool((result.text or "").strip())
    return Generation(
        benchmark="summhay",
        item_id=planned.item_id,
        model=model,
        system=spec.system or model,
        setting=planned.setting,
        sample=planned.sample,
        status="ok" if ok else "error",
        text=result.text if ok else None,
        error=None if ok else (result.error or "empty answer"),
        usage=usage,
        meta=meta,
    )


def baseline_generations(
    params: Params, model: str, spec: BaselineModel, dataset: Sequence[Haystack]
) -> list[Generation]:
    """Summaries of a no-model baseline (pipeline/baselines.py) over the same contexts an LLM
    would see; each bullet cites the positions of the documents its sentence comes from."""
    from pipeline.baselines import Doc, extractive, lead
    from pipeline.retrieval.context import retrieval_query

    summarize = lead if spec.kind == "lead" else extractive
    system = spec.system or model
    out = []
    for _hay, sub, setting, ctx in contexts(params, dataset, spec.settings):
        docs = [Doc(d.position, d.text) for d in ctx.documents]
        text = summarize(retrieval_query(sub), docs, spec.bullets or n_insights(sub))
        out.append(
            Generation(
                benchmark="summhay",
                item_id=sub.item_id,
                model=model,
                system=system,
                setting=setting,
                status="ok" if text else "error",
                text=text or None,
                error=None if text else "no sentence to extract",
                meta={
                    "baseline": spec.kind,
                    "prompt_sha": f"baseline-{spec.kind}",
                    "context_docs": [d.position for d in ctx.documents],
                    "context_tokens": ctx.n_tokens,
                },
            )
        )
    return out
