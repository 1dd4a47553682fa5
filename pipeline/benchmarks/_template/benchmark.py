"""_template: fact recall of answers over given documents, a small benchmark on the contract.

Replace what this benchmark measures, keep its shape (see README.md in this folder):

- construct: the built-in examples, or a JSONL file of items (`source`), validated;
- generate: an answer per item, from a model (the `generate` prompt) or a no-model baseline;
- judge: per (answer, fact) `yes` / `partial` / `no`, from an LLM (the `judge` prompt, one call
  per fact) or the local judge (the facts as units, the answer's sentences as bullets);
- results: recall per item (yes 1, partial 0.5, no 0; invalid verdicts left out and counted),
  declared once as a `Metric`; the stage layer joins items, generations and judgements, counts,
  pools the mean over items per (system, setting, judge), writes the table, the MLflow runs and
  compares systems (`pipeline/core/results.py`). No row, join, counter or MLflow code here.

Pure: no file is read or written here and no model is called; the stage layer does both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from statistics import fmean

from pipeline.benchmarks._template.params import TemplateParams
from pipeline.benchmarks._template.schema import Item, examples, parse_items
from pipeline.core.benchmark import (
    Asker,
    Benchmark,
    Constructed,
    Context,
    Coverage,
    CoverageCase,
    CoverageVerdictLike,
    JudgePrompts,
    JudgeTask,
    LLMJudge,
    Parser,
    Planned,
    judge_task,
    label_parser,
)
from pipeline.core.config import BaselineModel, ModelSpec, OpenAIModel
from pipeline.core.errors import ConfigError
from pipeline.core.parse import ParseError, load_object
from pipeline.core.records import Generation, Judgement, Verdict, generation_id
from pipeline.core.results import Invalid, ItemScore, Metric, Outcome, Scored
from pipeline.core.types import ChatRequest

SETTING = "documents"  # one context setting: all the item's documents
LABELS = {"yes": 1.0, "partial": 0.5, "no": 0.0}
FROM_COVERAGE = {"FULL_COVERAGE": "yes", "PARTIAL_COVERAGE": "partial", "NO_COVERAGE": "no"}
_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_CITATION = re.compile(r"\s*\[\d+\]")


Ctx = Context[TemplateParams]


def documents_text(item: Item) -> str:
    return "\n\n".join(f"Document {n}:\n{d.text}" for n, d in enumerate(item.documents, start=1))


def answer_sentences(text: str) -> list[str]:
    """The answer's sentences, list markers and citations removed."""
    from pipeline.baselines import split_sentences

    out = []
    for s in split_sentences(text):
        s = _CITATION.sub("", _MARKER.sub("", s)).strip()
        if s:
            out.append(s)
    return out


def parse_verdict(text: str | None) -> str:
    """`{"verdict": "yes" | "partial" | "no"}` (case and brackets ignored)."""
    value = load_object(text).get("verdict")
    label = value.strip().strip("[]").lower() if isinstance(value, str) else None
    if label not in LABELS:
        raise ParseError(f'"verdict" must be one of {", ".join(LABELS)}, got {json.dumps(value)}')
    return label


def item_recall(item: Item, j: Judgement | None) -> tuple[float | None, int]:
    """(recall over the facts with a usable verdict or None if none, invalid verdicts)."""
    if j is None:
        return None, 0
    by_fact = {v.target_id: v for v in j.verdicts}
    scores, invalid = [], 0
    for f in item.facts:
        v = by_fact.get(f.fact_id)
        if v is None or v.status != "ok":
            invalid += 1
            continue
        scores.append(LABELS[v.label])
    return (fmean(scores) if scores else None), invalid


class TemplateCoverage(Coverage[TemplateParams, Item]):
    """The local judge on an answer: the item's facts against its sentences."""

    def cases(self, ctx: Ctx, item: Item, generation: Generation) -> list[CoverageCase]:
        targets = [(f.fact_id, f.text) for f in item.facts]
        return [CoverageCase(targets, answer_sentences(generation.text or ""))]

    def verdict(self, target: str, verdict: CoverageVerdictLike) -> Verdict:
        if verdict.label not in FROM_COVERAGE:
            raise ValueError(f"unknown coverage label {verdict.label!r}")
        return Verdict(
            target_id=target,
            label=FROM_COVERAGE[verdict.label],
            link=verdict.bullet,
            raw=verdict.label,
        )


class Template(Benchmark[TemplateParams, Item, Item]):
    name = "_template"
    version = "1"
    params_model = TemplateParams
    record = Item

    # ---- construct

    def construct(self, ctx: Ctx, ask: Asker | None) -> Constructed[Item]:
        source = ctx.section.source
        items = examples() if source is None else parse_items(ctx.inputs.jsonl(source), source)
        n_facts = sum(len(i.facts) for i in items)
        return Constructed(items, summary=f"{len(items)} items, {n_facts} facts")

    def items(self, dataset: Sequence[Item]) -> dict[str, Item]:
        return {i.item_id: i for i in dataset}

    # ---- generate

    def plan_generations(
        self, ctx: Ctx, model: str, spec: OpenAIModel, dataset: Sequence[Item]
    ) -> list[Planned]:
        prompt = ctx.prompt("generate")
        system = spec.system or model
        out = []
        for item in dataset:
            content = prompt.render(question=item.question, documents=documents_text(item))
            request = ChatRequest(
                key=generation_id(item.item_id, system, SETTING, 0),
                messages=[{"role": "user", "content": content}],
                prompt_sha=prompt.sha,
            )
            meta = {"prompt": prompt.path, "prompt_sha": prompt.sha}
            out.append(Planned(request, item.item_id, system, SETTING, 0, meta))
        return out

    def offline_generations(
        self, ctx: Ctx, model: str, spec: ModelSpec, dataset: Sequence[Item]
    ) -> list[Generation]:
        from pipeline import baselines

        if not isinstance(spec, BaselineModel):
            raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run {self.name}")
        summarize = baselines.lead if spec.kind == "lead" else baselines.extractive
        out = []
        for item in dataset:
            docs = [baselines.Doc(n, d.text) for n, d in enumerate(item.documents, start=1)]
            text = summarize(item.question, docs, spec.bullets or len(item.facts))
            text = " ".join(text.split()[: ctx.section.max_words])
            meta = {"prompt_sha": f"baseline-{spec.kind}"}
            system = spec.system or model
            out.append(
                Generation.offline(self.name, item.item_id, model, system, SETTING, text, meta)
            )
        return out

    # ---- judge: an LLM (one call per fact, prompts `judge` and `repair`) or the local judge

    llm_judge = LLMJudge(task=lambda g, item, prompts: fact_task(g, item, prompts))
    coverage = TemplateCoverage()

    # ---- results: declared once; the stage layer joins, counts, pools, logs and compares

    metrics = (Metric("recall", "fact recall", higher_is_better=True, lo=0.0, hi=1.0),)

    def item_score(
        self, ctx: Ctx, item: Item, generation: Generation, judgement: Judgement
    ) -> Outcome:
        recall, invalid = item_recall(item, judgement)
        if recall is None:
            return Invalid("no usable verdict", invalid_verdicts=invalid)
        score = ItemScore(
            item.item_id, values={"recall": recall}, detail={"facts": len(item.facts)}
        )
        return Scored([score], invalid_verdicts=invalid)


def fact_task(gen: Generation, item: Item, prompts: JudgePrompts) -> JudgeTask:
    """One call per fact of the item: does the answer state it?"""
    answer = gen.text or ""
    facts = {f.fact_id: f.text for f in item.facts}

    def one(fact_id: str) -> str:
        return prompts.prompt.render(answer=answer, fact=facts[fact_id])

    def parse_one(fact_id: str) -> Parser:
        return label_parser(fact_id, parse_verdict)

    return judge_task(gen, list(facts), prompts, one, parse_one)
