"""SummHay generation: the contexts, the requests to a model, and the no-model baselines.

For each subtopic (item) of each haystack, each context setting of the model entry and each
sample: build the context (the whole haystack in an order, or retrieved documents packed into the
token budget), render the domain's prompt and ask for a bullet-point summary that cites documents
as `[i]`, i being the document's position in the haystack whatever the order shown. The stage
layer sends the requests through the model layer and turns the answers into records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


# A retriever of the user's: its ranking of a subtopic's documents (positions, best first), as
# its retrieval stage made it; None for the project's own settings.
RankOf = Callable[[str, Subtopic], "list[int] | None"]


def no_ranking(setting: str, sub: Subtopic) -> list[int] | None:
    return None


def context_of(
    section: SummhayParams,
    seed: int,
    hay: Haystack,
    sub: Subtopic,
    setting: str,
    budget: int | None = None,
    rank_of: RankOf = no_ranking,
) -> Context:
    """The context of one (haystack, subtopic, setting): it depends on nothing else. A RAG
    context holds `rag_budget_tokens` of documents, or `budget` when given (a model whose
    context window cannot hold that: `fitted_budget`); a setting that names a retriever of the
    user's packs its ranking (`rank_of`)."""
    from pipeline.retrieval.context import build_context  # numpy and tokenizers: load on use

    ranking = rank_of(setting, sub)
    if setting.startswith("full") and ranking is None:
        budget = None
    elif budget is None:
        budget = section.rag_budget_tokens
    return build_context(hay, sub, setting, budget_tokens=budget, seed=seed, ranking=ranking)


# A model's own tokenizer counts more tokens than cl100k_base (the budget's unit) on the same
# text: SmolLM2-135M's llama.cpp server counted 16,671 for a 15,173-token SummHay prompt and
# 7,301 for a fitted one (about 10% more); on the news documents alone SmolLM2 4.8% and Gemma 3
# 3.5% more. The fit leaves 15%. The chat template adds a few tokens per message.
TOKENIZER_SLACK = 1.15
CHAT_TEMPLATE_TOKENS = 32
# Fewer documents than this is no longer a RAG context worth the name: such a model's prompts
# are left as they are and named by `lfbench check` / `plan` as not fitting.
MIN_FITTED_BUDGET = 1000


def fitted_budget(section: SummhayParams, spec: OpenAIModel, prompt_tokens: int) -> int | None:
    """The RAG budget (cl100k_base tokens of documents) for a model entry that declares a
    `context_window` too small for `rag_budget_tokens`: what is left of the window after the
    answer (`max_tokens`), the chat template, the prompt's own words (`prompt_tokens`) and the
    tokenizer slack. None: the section's budget (it fits, no window declared, or too little is
    left to fit)."""
    window = spec.context_window
    if window is None:
        return None
    room = int((window - spec.max_tokens - CHAT_TEMPLATE_TOKENS) / TOKENIZER_SLACK) - prompt_tokens
    if room >= section.rag_budget_tokens or room < MIN_FITTED_BUDGET:
        return None
    return room


def plan(
    section: SummhayParams,
    seed: int,
    model: str,
    spec: OpenAIModel,
    dataset: Sequence[Haystack],
    prompts: Mapping[str, Prompt],
    rank_of: RankOf = no_ranking,
) -> list[Planned]:
    """One request per (subtopic, setting, sample), with the domain's prompt. A model entry
    whose `context_window` cannot hold the section's RAG budget gets its RAG contexts packed to
    fit it (`fitted_budget`; the budget is in each generation's meta, `context_budget`)."""
    from pipeline.retrieval.tokens import count_tokens

    system = spec.system or model
    by_domain = {"news": prompts["generate_news"], "conversation": prompts["generate_conversation"]}
    out = []
    for hay in dataset:
        prompt = by_domain[hay.domain]
        for sub in hay.subtopics:
            fitted = fitted_budget(section, spec, count_tokens(_render(prompt, hay, sub, "", 0)))
            for setting in settings_of(spec, section.retrievers):
                ctx = context_of(section, seed, hay, sub, setting, fitted, rank_of)
                text = _render(prompt, hay, sub, ctx.text, len(ctx.documents))
                meta: dict[str, object] = {
                    "prompt": prompt.path,
                    "prompt_sha": prompt.sha,
                    "context_docs": [d.position for d in ctx.documents],
                    "context_tokens": ctx.n_tokens,
                    "context_truncated": any(d.truncated for d in ctx.documents),
                }
                if fitted is not None and not setting.startswith("full"):
                    meta["context_budget"] = fitted  # smaller than the section's: the window
                for sample in range(spec.samples):
                    request = ChatRequest(
                        key=generation_id(sub.item_id, system, setting, sample),
                        messages=[{"role": "user", "content": text}],
                        prompt_sha=prompt.sha,
                        sample=sample,
                    )
                    out.append(Planned(request, sub.item_id, system, setting, sample, dict(meta)))
    return out


def _render(prompt: Prompt, hay: Haystack, sub: Subtopic, documents: str, n_documents: int) -> str:
    return prompt.render(
        n_documents=n_documents,
        topic=hay.topic,
        participants=", ".join(hay.participants) or "various people",
        documents=documents,
        query=sub.query,
        subtopic=sub.subtopic,
        n_insights=n_insights(sub),
    )


def baseline_generations(
    section: SummhayParams,
    seed: int,
    model: str,
    spec: BaselineModel,
    dataset: Sequence[Haystack],
    rank_of: RankOf = no_ranking,
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
        ctx = context_of(section, seed, hay, sub, setting, rank_of=rank_of)
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
    jobs = [
        (h, s, setting)
        for h in dataset
        for s in h.subtopics
        for setting in settings_of(spec, section.retrievers)
    ]
    return fork_map(one, jobs)
