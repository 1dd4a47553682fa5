"""_template: fact recall of answers over given documents (README.md in this folder).

An item is a question, its documents and the facts a good answer states; a model (or a no-model
baseline) answers; a judge says, per fact, yes / partial / no: an LLM (`judge` prompt), a rule
that needs no model (`_template-match`: the fact's words in the answer) or the local judge.
Recall per item: yes 1, partial 0.5, no 0; invalid verdicts left out and counted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from statistics import fmean
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline import blocks
from pipeline.core.benchmark import Benchmark, Constructed, Context, Coverage, LLMJudge, Planned
from pipeline.core.config import BenchmarkParams, ModelSpec, OpenAIModel, OwnedJudge, PromptFiles
from pipeline.core.records import Generation, Judgement, Verdict, validate_lines
from pipeline.core.results import Invalid, ItemScore, Metric, Outcome, Scored

LABELS = {"yes": 1.0, "partial": 0.5, "no": 0.0}
FOLDER = "pipeline/benchmarks/_template"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Document(Strict):
    doc_id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class Fact(Strict):
    fact_id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class Item(Strict):  # one line of the source file, and of datasets/_template.jsonl
    item_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    documents: list[Document] = Field(min_length=1)
    facts: list[Fact] = Field(min_length=1)


class TemplatePrompts(PromptFiles):
    generate: str = f"{FOLDER}/prompts/generate.txt"
    judge: str = f"{FOLDER}/prompts/judge.txt"
    repair: str = f"{FOLDER}/prompts/repair.txt"


class TemplateParams(BenchmarkParams):  # the `_template:` section of params.yaml
    source: str = Field(default=f"{FOLDER}/examples.jsonl", description="a JSONL file of items")
    max_words: int = Field(default=80, ge=1, description="answer length of no-model baselines")
    prompts: TemplatePrompts = TemplatePrompts()


class MatchJudge(OwnedJudge):  # a judges entry `provider: _template-match`
    provider: Literal["_template-match"]


Ctx = Context[TemplateParams]
WORD = re.compile(r"\w{4,}")


class Match(blocks.RuleJudge[TemplateParams, Item]):
    """yes when every word of 4+ letters of the fact is in the answer, partial for half."""

    def verdicts(self, item: Item, generation: Generation) -> list[Verdict]:
        answer = set(WORD.findall((generation.text or "").lower()))
        out = []
        for f in item.facts:
            words = set(WORD.findall(f.text.lower()))
            share = len(words & answer) / len(words) if words else 1.0
            label = "yes" if share == 1 else "partial" if share >= 0.5 else "no"
            out.append(Verdict(target_id=f.fact_id, label=label))
        return out


class TemplateCoverage(Coverage[TemplateParams, Item]):
    """The local judge on an answer: the item's facts against its sentences."""

    def cases(self, ctx: Ctx, item: Item, generation: Generation) -> list[blocks.CoverageCase]:
        return blocks.sentence_case({f.fact_id: f.text for f in item.facts}, generation)

    def verdict(self, target: str, verdict: blocks.CoverageVerdictLike) -> Verdict:
        label = {"FULL_COVERAGE": "yes", "PARTIAL_COVERAGE": "partial"}.get(verdict.label, "no")
        return Verdict(target_id=target, label=label, link=verdict.bullet, raw=verdict.label)


def judge_task(g: Generation, item: Item, prompts: blocks.JudgePrompts) -> blocks.JudgeTask:
    facts = {f.fact_id: {"answer": g.text or "", "fact": f.text} for f in item.facts}
    return blocks.unit_task(g, facts, prompts, blocks.choice("verdict", list(LABELS)))


class Template(Benchmark[TemplateParams, Item, Item]):
    name = "_template"
    version = "1"
    params_model = TemplateParams
    record = Item
    providers = (MatchJudge,)
    metrics = (Metric("recall", "fact recall", lo=0.0, hi=1.0),)
    llm_judge = LLMJudge(task=judge_task)  # prompts `judge` and `repair`
    no_model_judge = Match()
    coverage = TemplateCoverage()

    def construct(self, ctx: Ctx, ask: object) -> Constructed[Item]:
        src = ctx.section.source
        items = [i for _, i in validate_lines(ctx.inputs.jsonl(src), Item, src)]
        return Constructed(items, summary=f"{len(items)} items")

    def items(self, dataset: Sequence[Item]) -> dict[str, Item]:
        return {i.item_id: i for i in dataset}

    def plan_generations(
        self, ctx: Ctx, model: str, spec: OpenAIModel, dataset: Sequence[Item]
    ) -> list[Planned]:
        fields = {i.item_id: {"question": i.question, "documents": docs(i)} for i in dataset}
        return blocks.prompt_each(ctx, model, spec.system, fields)

    def offline_generations(
        self, ctx: Ctx, model: str, spec: ModelSpec, dataset: Sequence[Item]
    ) -> list[Generation]:
        sources = {i.item_id: (i.question, [d.text for d in i.documents]) for i in dataset}
        return blocks.baseline_each(self.name, model, spec, sources, 3, ctx.section.max_words)

    def item_score(self, ctx: Ctx, item: Item, generation: Generation, j: Judgement) -> Outcome:
        labels = {v.target_id: v.label for v in j.verdicts if v.status == "ok"}
        scores = [LABELS[labels[f.fact_id]] for f in item.facts if f.fact_id in labels]
        invalid = len(item.facts) - len(scores)
        if not scores:
            return Invalid("no usable verdict", invalid_verdicts=invalid)
        detail = {"facts": len(item.facts)}
        return Scored([ItemScore(item.item_id, {"recall": fmean(scores)}, detail=detail)], invalid)


def docs(item: Item) -> str:
    return "\n\n".join(f"Document {n}:\n{d.text}" for n, d in enumerate(item.documents, 1))
