"""_template: fact recall of answers over given documents, a small benchmark on the contract.

Replace what this benchmark measures, keep its shape (see README.md in this folder):

- construct: the built-in examples, or a JSONL file of items (`source`), validated;
- generate: an answer per item, from a model (the `generate` prompt) or a no-model baseline;
- judge: per (answer, fact) `yes` / `partial` / `no`, from an LLM (the `judge` prompt, one call
  per fact) or the local judge (the facts as units, the answer's sentences as bullets);
- aggregate: recall per item (yes 1, partial 0.5, no 0; invalid verdicts left out and counted),
  its mean over items per (system, judge), a markdown table, one MLflow run per row.

Pure: no file is read or written here and no model is called; the stage layer does both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from pipeline.benchmarks._template.params import TemplateParams
from pipeline.benchmarks._template.schema import Item, examples, parse_items
from pipeline.core.benchmark import (
    RESULT_KEYS,
    Aggregated,
    Asker,
    Benchmark,
    Constructed,
    Context,
    CoverageCase,
    CoverageVerdictLike,
    JudgePrompts,
    JudgeTask,
    Parser,
    Planned,
    ReportSection,
    Run,
    RunRow,
    judge_task,
    label_parser,
)
from pipeline.core.config import BaselineModel, ModelSpec, OpenAIModel
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.markdown import fmt, need, table
from pipeline.core.parse import ParseError, load_object
from pipeline.core.records import Generation, Judgement, Verdict, generation_id
from pipeline.core.types import ChatRequest

SETTING = "documents"  # one context setting: all the item's documents
LABELS = {"yes": 1.0, "partial": 0.5, "no": 0.0}
FROM_COVERAGE = {"FULL_COVERAGE": "yes", "PARTIAL_COVERAGE": "partial", "NO_COVERAGE": "no"}
ROW_KEYS = (
    *RESULT_KEYS,
    "recall",
    "n_items",
    "n_scored",
    "n_facts",
    "n_invalid",
    "n_failed_generations",
    "n_failed_judgements",
)
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


class Template(Benchmark[TemplateParams, Item, Item]):
    name = "_template"
    version = "1"
    params_model = TemplateParams
    record = Item
    judge_prompts = ("judge", None, "repair")  # one call per fact: no batched form

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

    # ---- judge

    def judge_task(self, generation: Generation, item: Item, prompts: JudgePrompts) -> JudgeTask:
        return fact_task(generation, item, prompts)

    def coverage_cases(self, ctx: Ctx, item: Item, generation: Generation) -> list[CoverageCase]:
        return [
            CoverageCase(
                [(f.fact_id, f.text) for f in item.facts], answer_sentences(generation.text or "")
            )
        ]

    def coverage_verdict(self, target: str, verdict: CoverageVerdictLike) -> Verdict:
        if verdict.label not in FROM_COVERAGE:
            raise ValueError(f"unknown coverage label {verdict.label!r}")
        return Verdict(
            target_id=target,
            label=FROM_COVERAGE[verdict.label],
            link=verdict.bullet,
            raw=verdict.label,
        )

    # ---- aggregate and report

    def aggregate(self, ctx: Ctx, dataset: Sequence[Item], runs: Sequence[Run]) -> Aggregated:
        items = self.items(dataset)
        rows: list[dict[str, Any]] = []
        details: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            by_gen = {j.generation_id: j for j in run.judgements}
            cells: dict[str, list[Generation]] = {}
            for g in run.generations:
                cells.setdefault(g.system, []).append(g)
            for system, gens in sorted(cells.items()):
                recalls, detail = [], []
                failed_gen = failed_judge = invalid = 0
                for g in gens:
                    if g.item_id not in items:
                        raise DataError("an output of an unknown item", item=g.generation_id)
                    if g.status != "ok":
                        failed_gen += 1
                        continue
                    j = by_gen.get(g.generation_id)
                    if j is None or j.status == "error":
                        failed_judge += 1
                        continue
                    recall, bad = item_recall(items[g.item_id], j)
                    invalid += bad
                    detail.append({"item_id": g.item_id, "recall": recall, "invalid": bad})
                    if recall is not None:
                        recalls.append(recall)
                row = {
                    "benchmark": self.name,
                    "system": system,
                    "setting": SETTING,
                    "judge": run.judge,
                    "model": run.model,
                    "recall": round(fmean(recalls), 6) if recalls else None,
                    "n_items": len(gens),
                    "n_scored": len(recalls),
                    "n_facts": sum(len(items[g.item_id].facts) for g in gens),
                    "n_invalid": invalid,
                    "n_failed_generations": failed_gen,
                    "n_failed_judgements": failed_judge,
                }
                rows.append(row)
                details["|".join((system, SETTING, run.judge, run.model))] = detail
        rows.sort(key=lambda r: (r["system"], r["judge"], r["model"]))
        summary: dict[str, dict[str, float | None]] = {}
        for r in rows:  # {judge: {system/setting: recall}}, what `dvc metrics diff` compares
            summary.setdefault(r["judge"], {})[f"{r['system']}/{r['setting']}"] = r["recall"]
        return Aggregated(
            metrics={"rows": rows},
            summary=summary,
            report="\n".join([f"# {self.name}: fact recall", "", *self._table(rows)]).rstrip()
            + "\n",
            runs=[self._run(r, details) for r in rows],
        )

    def _table(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        head = ["system", "judge", "recall", "items", "scored", "invalid", "failed"]
        body = [
            [
                r["system"],
                r["judge"],
                fmt(r["recall"], 3),
                r["n_items"],
                r["n_scored"],
                r["n_invalid"],
                r["n_failed_generations"] + r["n_failed_judgements"],
            ]
            for r in rows
        ]
        return table(head, body)

    def _run(self, row: dict[str, Any], details: dict[str, list[dict[str, Any]]]) -> RunRow:
        key = "|".join((row["system"], row["setting"], row["judge"], row["model"]))
        numbers = {k: float(row[k]) for k in ROW_KEYS[len(RESULT_KEYS) :] if row[k] is not None}
        return RunRow(
            key=key,
            name=f"{row['system']} / {row['judge']}",
            metrics=numbers,
            params={k: str(row[k]) for k in ("system", "setting", "judge", "model")},
            tags={"setting": row["setting"], "model.name": row["system"]},
            artifacts={"items.jsonl": details[key], "row.json": row},
            model=row["model"],
            judge=row["judge"],
        )

    def report_section(self, metrics: Mapping[str, Any], where: str) -> ReportSection:
        rows = metrics["rows"]
        for n, r in enumerate(rows, 1):
            need(r, ROW_KEYS, where, n)
        return ReportSection([f"Fact recall from {where}.", "", *self._table(rows)])


def fact_task(gen: Generation, item: Item, prompts: JudgePrompts) -> JudgeTask:
    """One call per fact of the item: does the answer state it?"""
    answer = gen.text or ""
    facts = {f.fact_id: f.text for f in item.facts}

    def one(fact_id: str) -> str:
        return prompts.prompt.render(answer=answer, fact=facts[fact_id])

    def parse_one(fact_id: str) -> Parser:
        return label_parser(fact_id, parse_verdict)

    return judge_task(gen, list(facts), prompts, one, parse_one)
