"""SummHay generation: the contexts, the requests to a model, and the no-model baselines.

For each subtopic (item) of each haystack, each context setting of the model entry and each
sample: build the context (the whole haystack in an order, or retrieved documents packed into the
token budget), render the domain's prompt and ask for a bullet-point summary that cites documents
as `[i]`, i being the document's position in the haystack whatever the order shown. The stage
layer sends the requests through the model layer and turns the answers into records.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pipeline.benchmarks.summhay.params import SummhayParams, settings_of
from pipeline.core.benchmark import Planned
from pipeline.core.config import BaselineModel, OpenAIModel
from pipeline.core.prompts import Prompt
from pipeline.core.records import Generation, generation_id
from pipeline.core.types import ChatRequest
from pipeline.data.haystacks import Haystack, Subtopic

if TYPE_CHECKING:
    from pipeline.retrieval.context import Context


def n_insights(sub: Subtopic) -> int:
    """The number of bullets asked for: the subtopic's insights that some document holds."""
    return sum(1 for i in sub.insights if i.gold_docs) or len(sub.insights)


def contexts(
    section: SummhayParams, seed: int, dataset: Sequence[Haystack], settings: Sequence[str]
) -> Iterator[tuple[Haystack, Subtopic, str, Context]]:
    """Every (haystack, subtopic, setting) context a model sees, in dataset order: the whole
    haystack (`full*`) or retrieved documents packed into the RAG token budget."""
    for hay in dataset:
        for sub in hay.subtopics:
            for setting in settings:
                yield hay, sub, setting, context_of(section, seed, hay, sub, setting)


def context_of(
    section: SummhayParams, seed: int, hay: Haystack, sub: Subtopic, setting: str
) -> Context:
    """The context of one (haystack, subtopic, setting): it depends on nothing else."""
    from pipeline.retrieval.context import build_context  # numpy and tokenizers: load on use

    budget = None if setting.startswith("full") else section.rag_budget_tokens
    return build_context(hay, sub, setting, budget_tokens=budget, seed=seed)


def plan(
    section: SummhayParams,
    seed: int,
    model: str,
    spec: OpenAIModel,
    dataset: Sequence[Haystack],
    prompts: Mapping[str, Prompt],
) -> list[Planned]:
    """One request per (subtopic, setting, sample), with the domain's prompt."""
    system = spec.system or model
    by_domain = {"news": prompts["generate_news"], "conversation": prompts["generate_conversation"]}
    out = []
    for hay, sub, setting, ctx in contexts(section, seed, dataset, settings_of(spec)):
        prompt = by_domain[hay.domain]
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
            request = ChatRequest(
                key=generation_id(sub.item_id, system, setting, sample),
                messages=[{"role": "user", "content": text}],
                prompt_sha=prompt.sha,
                sample=sample,
            )
            out.append(Planned(request, sub.item_id, system, setting, sample, dict(meta)))
    return out


def baseline_generations(
    section: SummhayParams, seed: int, model: str, spec: BaselineModel, dataset: Sequence[Haystack]
) -> list[Generation]:
    """Summaries of a no-model baseline (pipeline/baselines.py) over the same contexts an LLM
    would see; each bullet cites the positions of the documents its sentence comes from."""
    from pipeline.baselines import Doc, extractive, lead
    from pipeline.core.parallel import fork_map
    from pipeline.retrieval.context import retrieval_query

    summarize = lead if spec.kind == "lead" else extractive
    system = spec.system or model

    def one(job: tuple[Haystack, Subtopic, str]) -> Generation:
        hay, sub, setting = job
        ctx = context_of(section, seed, hay, sub, setting)
        docs = [Doc(d.position, d.text) for d in ctx.documents]
        text = summarize(retrieval_query(sub), docs, spec.bullets or n_insights(sub))
        meta = {
            "baseline": spec.kind,
            "prompt_sha": f"baseline-{spec.kind}",
            "context_docs": [d.position for d in ctx.documents],
            "context_tokens": ctx.n_tokens,
        }
        return Generation.offline(
            "summhay", sub.item_id, model, system, setting, text, meta,
            empty="no sentence to extract",
        )  # fmt: skip

    # every context and summary on its own: on every core, in dataset order
    jobs = [(h, s, setting) for h in dataset for s in h.subtopics for setting in settings_of(spec)]
    return fork_map(one, jobs)
