"""kwrecall: does the answer contain each keyword? Judged by an LLM or a no-model match (the
keyword in the answer, case ignored). Recall: the share of keywords found, per item."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline import blocks
from pipeline.core.benchmark import Benchmark, Constructed, Context, LLMJudge, Planned
from pipeline.core.config import BenchmarkParams, ModelSpec, OpenAIModel, OwnedJudge, PromptFiles
from pipeline.core.records import Generation, Judgement, Verdict, validate_lines
from pipeline.core.results import Invalid, ItemScore, Metric, Outcome, Scored

FOLDER = "pipeline/benchmarks/kwrecall"


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    item_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    documents: list[str] = Field(min_length=1)
    keywords: list[str] = Field(min_length=1)


class KwrecallPrompts(PromptFiles):
    generate: str = f"{FOLDER}/prompts/generate.txt"
    judge: str = f"{FOLDER}/prompts/judge.txt"
    repair: str = f"{FOLDER}/prompts/repair.txt"


class KwrecallParams(BenchmarkParams):
    source: str = Field(default=f"{FOLDER}/examples.jsonl", description="a JSONL file of items")
    max_words: int = Field(default=80, ge=1, description="answer length of no-model baselines")
    prompts: KwrecallPrompts = KwrecallPrompts()


class MatchJudge(OwnedJudge):
    provider: Literal["kwrecall-match"]


class Match(blocks.RuleJudge[KwrecallParams, Item]):
    def verdicts(self, item: Item, generation: Generation) -> list[Verdict]:
        answer = (generation.text or "").lower()
        return [
            Verdict(target_id=k, label="yes" if k.lower() in answer else "no")
            for k in item.keywords
        ]


def judge_task(g: Generation, item: Item, prompts: blocks.JudgePrompts) -> blocks.JudgeTask:
    units = {k: {"answer": g.text or "", "keyword": k} for k in item.keywords}
    return blocks.unit_task(g, units, prompts, blocks.choice("contains", ["yes", "no"]))


class Kwrecall(Benchmark[KwrecallParams, Item, Item]):
    name = "kwrecall"
    version = "1"
    params_model = KwrecallParams
    record = Item
    providers = (MatchJudge,)
    metrics = (Metric("recall", "keyword recall", lo=0.0, hi=1.0),)
    llm_judge = LLMJudge(task=judge_task)
    no_model_judge = Match()

    def construct(self, ctx: Context[KwrecallParams], ask: object) -> Constructed[Item]:
        src = ctx.section.source
        return Constructed([i for _, i in validate_lines(ctx.inputs.jsonl(src), Item, src)])

    def items(self, dataset: Sequence[Item]) -> dict[str, Item]:
        return {i.item_id: i for i in dataset}

    def plan_generations(
        self, ctx: Context[KwrecallParams], model: str, spec: OpenAIModel, dataset: Sequence[Item]
    ) -> list[Planned]:
        docs = {i.item_id: "\n\n".join(i.documents) for i in dataset}
        fields = {
            i: {"question": q.question, "documents": docs[i]}
            for i, q in self.items(dataset).items()
        }
        return blocks.prompt_each(ctx, model, spec.system, fields)

    def offline_generations(
        self, ctx: Context[KwrecallParams], model: str, spec: ModelSpec, dataset: Sequence[Item]
    ) -> list[Generation]:
        sources = {i.item_id: (i.question, i.documents) for i in dataset}
        return blocks.baseline_each(self.name, model, spec, sources, 3, ctx.section.max_words)

    def item_score(self, ctx: object, item: Item, generation: Generation, j: Judgement) -> Outcome:
        found = [v.label == "yes" for v in j.verdicts if v.status == "ok"]
        if not found:
            return Invalid("no usable verdict", invalid_verdicts=len(item.keywords))
        score = ItemScore(item.item_id, {"recall": fmean(found)})
        return Scored([score], invalid_verdicts=len(item.keywords) - len(found))
