"""Long²RAG (Key Point Recall) on the benchmark contract.

- construct: the dataset. Default (`long2rag.source: summhay`): derived from the SummHay
  haystacks, no model (derived.py). Or your JSONL file (schema.py); questions without key points
  get them from an LLM (construction.py, through the `Asker` the stage layer hands in).
- generate: one answer per (question, setting) per model (generation.py).
- judge: one verdict per (answer, key point) per judge (judging.py).
- aggregate: KPR rows, breakdowns, judge agreement, report, MLflow runs (aggregate.py,
  scoring.py, report.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pipeline.benchmarks.long2rag import construction, derived, generation, judging
from pipeline.benchmarks.long2rag.aggregate import (
    KPR,
    SECTIONS,
    agreement_rows,
    doc_tokens,
    item_score,
    sections,
    setting_order,
)
from pipeline.benchmarks.long2rag.params import Long2ragLeadModel, Long2ragParams, OverlapJudge
from pipeline.benchmarks.long2rag.report import agreement_lines, breakdown_lines, plot_png
from pipeline.benchmarks.long2rag.report import report_section as _report_section
from pipeline.benchmarks.long2rag.schema import Question, parse_questions
from pipeline.benchmarks.long2rag.scoring import length_bucket
from pipeline.core.benchmark import (
    Asker,
    Audit,
    AuditScale,
    Benchmark,
    Constructed,
    Context,
    Coverage,
    CoverageCase,
    CoverageJudge,
    CoverageVerdictLike,
    LLMJudge,
    Paper,
    Passage,
    Planned,
    ReportSection,
    Retrieval,
    RetrievalQuery,
    Run,
    RunRow,
    SystemAnswer,
    Systems,
    Tables,
)
from pipeline.core.benchmark import Question as Question_
from pipeline.core.config import JudgeSpec, ModelSpec, OpenAIJudge, OpenAIModel, Params
from pipeline.core.drawing import Plot
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.core.results import ItemScore, Outcome, ResultRow, Results, RowKey, RunFields, Summary

DERIVED = "summhay"


Ctx = Context[Long2ragParams]


def _counts(qs: Sequence[Question]) -> str:
    return (
        f"{len(qs)} questions, {sum(len(q.key_points) for q in qs)} key points,"
        f" {sum(1 for q in qs if not q.key_points)} questions without key points"
    )


class Long2ragCoverage(Coverage[Long2ragParams, Question]):
    """A coverage judge on an answer: the key points against its sentences; the lexical
    overlap judge is this benchmark's own."""

    def cases(self, ctx: Ctx, item: Question, generation: Generation) -> list[CoverageCase]:
        targets = [(k.kp_id, k.text) for k in item.key_points]
        return [CoverageCase(targets, judging.answer_units(generation.text or ""))]

    def verdict(self, target: str, verdict: CoverageVerdictLike) -> Verdict:
        return judging.entailment_verdict(target, verdict)

    def judge(self, spec: JudgeSpec) -> CoverageJudge | None:
        if isinstance(spec, OverlapJudge):
            return judging.OverlapCoverage(full=spec.full, partial=spec.partial)
        return None


class Long2ragPaper(Paper[Long2ragParams, Question]):
    """The paper's own: agreement between judges (free-marginal kappa), KPR by domain, category
    and input length, and each row's breakdown plot."""

    def tables(
        self,
        ctx: Ctx,
        dataset: Sequence[Question],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
        scores: Mapping[RowKey, Sequence[ItemScore]],
    ) -> Tables:
        l2 = ctx.section
        agreement = agreement_rows(runs, l2.scoring.neutral) if len(l2.judges) > 1 else []
        derived_note = (
            " DERIVED from SummHay (question = subtopic query, documents = top 5 by"
            f" {l2.derived.retriever}, key points = the planted insights they hold); not the"
            " paper's data."
            if l2.source == DERIVED
            else f" From {l2.source}."
        )
        note = (
            f"Dataset: {len(dataset)} questions, {sum(len(q.key_points) for q in dataset)} key"
            f" points.{derived_note} KPR = mean over questions of the share of key points the"
            f" answer entails; neutral counts as {l2.scoring.neutral.replace('_', ' ')}."
        )
        flat = [r.flat() for r in rows]
        return Tables(
            sections={"agreement": agreement},
            report=[note, "", *breakdown_lines(flat), *agreement_lines(agreement)],
        )

    def run_change(
        self, ctx: Ctx, dataset: Sequence[Question], runs: Sequence[Run], rows: Sequence[ResultRow]
    ) -> Callable[[RunRow, Mapping[str, Any]], RunRow]:
        """Each run's plot of KPR by domain and category (drawn when it is logged) and the
        source of its questions."""
        l2 = ctx.section
        source = f"derived:{DERIVED}" if l2.source == DERIVED else l2.source

        def change(run: RunRow, row: Mapping[str, Any]) -> RunRow:
            plots = {"kpr_by_domain_and_category.png": Plot(plot_png, (dict(row),))}
            return replace(run, plots=plots, tags=run.tags | {"dataset.source": source})

        return change

    def report_section(
        self, metrics: Mapping[str, Any], where: str, table: Callable[[], ReportSection]
    ) -> ReportSection:
        return _report_section(metrics["rows"], where)


class Long2ragAudit(Audit[Long2ragParams, Question]):
    """A person audits the judge's verdict on one key point against one answer."""

    def scale(self, ctx: Ctx) -> AuditScale:
        neutral = 1.0 if ctx.section.scoring.neutral == "entailed" else 0.0
        return AuditScale(
            name="entailment",
            labels=("yes", "neutral", "no"),
            values={"yes": 1.0, "neutral": neutral, "no": 0.0},
            metric=KPR.name,
            meaning="does the answer contain the key point? yes: it states it, with its"
            " details; neutral: only partly or vaguely; no: not at all, or contradicts it",
            per_item=True,
        )

    def view(self, ctx: Ctx, item: Question, generation: Generation, target: str) -> dict[str, str]:
        point = next((k for k in item.key_points if k.kp_id == target), None)
        if point is None:
            raise DataError("no such key point in the question", item=item.item_id, field=target)
        return {"question": item.question, "key point": point.text, "answer": generation.text or ""}


# the setting of a whole RAG system's answers (its own retrieval)
SYSTEM_SETTING = "own"


def rank_of(ctx: Ctx) -> generation.RankOf:
    """A retrievers entry's ranking of a question's chunks (its retrieval stage's output)."""
    for r in ctx.section.retrievers:
        ctx.preload(r)

    def ranking(name: str, q: Question) -> list[str]:
        return [p for p, _ in ctx.ranked(name, q.item_id)]

    return ranking


class Long2ragRetrieval(Retrieval[Long2ragParams, Question]):
    """Every question over the chunks of its documents (`generation.chunk_tokens` cl100k
    tokens, `chunk_overlap` shared): the chunks a `rag_<budget>@<entry>` setting packs."""

    reserved = ("bm25", "dense", "long_context", SYSTEM_SETTING)

    def retriever_of(self, ctx: Ctx, setting: str) -> str | None:
        name = generation.ranker_of(setting)
        return name if name is not None and ctx.is_retriever(name) else None

    def side_by_side(
        self, params: Params, rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str, str, float]]:
        """KPR of the answers made from a retriever's chunks (`rag_<budget>@<entry>`, and the
        default ranker's `rag_<budget>`), and of your RAG systems."""
        out = []
        section = params.raw_section("long2rag") or {}
        default = str((section.get("generation") or {}).get("chunk_ranker") or "bm25")
        for r in rows:
            setting, kpr = str(r["setting"]), r.get("kpr")
            if kpr is None or setting == generation.LONG_CONTEXT:
                continue
            name = (
                str(r["system"])
                if setting == SYSTEM_SETTING
                else generation.ranker_of(setting) or default
            )
            budget = "" if setting == SYSTEM_SETTING else f", {setting.partition('@')[0]}"
            what = f"KPR of {r['system']}'s answers ({r['judge']}{budget})"
            out.append((name, what, float(kpr)))
        return out

    def queries(
        self, ctx: Ctx, dataset: Sequence[Question], retriever: str
    ) -> list[RetrievalQuery]:
        cfg = ctx.section.generation
        return [
            RetrievalQuery(
                q.item_id,
                q.question,
                [
                    Passage(generation.chunk_id(c), c.text)
                    for c in generation.question_chunks(q, cfg)
                ],
            )
            for q in dataset
        ]


class Long2ragSystems(Systems[Long2ragParams, Question]):
    """A whole RAG system answers each question from its documents, in long form."""

    def questions(self, ctx: Ctx, dataset: Sequence[Question]) -> list[Question_]:
        words = ctx.section.generation.max_words
        task = (
            f"Answer the question in a detailed, long-form answer of about {words} words,"
            " using what the documents say."
        )
        return [
            Question_(
                q.item_id,
                q.question,
                [
                    Passage(d.doc_id, (f"{d.title}\n" if d.title else "") + d.text)
                    for d in q.documents
                ],
                task,
                {"domain": q.domain, "category": q.category},
            )
            for q in dataset
        ]

    def generation(
        self, ctx: Ctx, model: str, system: str, question: Question_, answer: SystemAnswer
    ) -> Generation:
        meta: dict[str, Any] = {"prompt_sha": "system"}
        if answer.passages is not None:
            meta["context_docs"] = list(answer.passages)
        return Generation.offline(
            "long2rag", question.id, model, system, SYSTEM_SETTING, answer.answer, meta
        )

    def setting(self, model: str, system: str) -> str:
        return SYSTEM_SETTING


class Long2Rag(Benchmark[Long2ragParams, Question, Question]):
    name = "long2rag"
    coverage = Long2ragCoverage()
    paper = Long2ragPaper()
    audit = Long2ragAudit()
    title = "Long²RAG"
    version = "1"
    params_model = Long2ragParams
    record = Question
    providers = (Long2ragLeadModel, OverlapJudge)

    retrieval = Long2ragRetrieval()
    systems = Long2ragSystems()

    def setting_names(self, section: Long2ragParams) -> Sequence[str]:
        return section.settings

    def check_params(self, section: Long2ragParams, params: Params) -> None:
        for setting in section.settings:
            name = generation.ranker_of(setting)
            if name is not None and name not in section.retrievers:
                raise ValueError(
                    f"long2rag.settings: {setting!r} names {name!r}, which long2rag.retrievers"
                    " does not list (a retrievers entry must be listed there to run)"
                )
        llm = section.construction.llm
        if llm is not None and not isinstance(params.judges.get(llm), OpenAIJudge):
            raise ValueError(
                f"long2rag.construction.llm names {llm!r}, which is not an openai judges entry"
            )

    # ---- construct

    def construct(self, ctx: Ctx, ask: Asker | None) -> Constructed[Question]:
        l2 = ctx.section
        if l2.source == DERIVED:
            d = l2.derived
            qs, note = derived.derive(
                ctx.inputs, ctx.data_dir, d.haystacks, d.subtopics, l2.n_documents, d.retriever
            )
            return Constructed(qs, summary=f"{_counts(qs)}; {note}")
        lines = ctx.inputs.jsonl(l2.source)
        qs = parse_questions(lines, l2.source, l2.n_documents)
        need = [(where, q) for (where, _), q in zip(lines, qs, strict=True) if not q.key_points]
        if not need and not l2.construction.decompose:
            return Constructed(qs, summary=f"{_counts(qs)}; every question has key points")
        if ask is None:
            if need:
                where, q = need[0]
                raise DataError(
                    f"the question has no key points ({len(need)} in the file have none) and"
                    " long2rag.construction.llm names no model to build them: set it to an"
                    " openai judges entry, or give every question its key points",
                    file=where,
                    item=q.item_id,
                    field="key_points",
                )
            raise ConfigError(
                "long2rag.construction.decompose needs long2rag.construction.llm (an openai"
                " judges entry)"
            )
        name = l2.construction.llm
        assert name is not None
        spec = ctx.params.judges[name]
        llm = construction.Llm(ask, ctx.prompt("repair"), getattr(spec, "json_mode", True))
        prompts = construction.Prompts(
            decompose=ctx.prompt("decompose"),
            extract=ctx.prompt("extract"),
            aggregate=ctx.prompt("aggregate"),
            filter=ctx.prompt("filter"),
            repair=ctx.prompt("repair"),
        )
        out, failures = construction.construct_key_points(qs, l2.construction, prompts, llm, name)
        return Constructed(out, failures, summary=_counts(out))

    def items(self, dataset: Sequence[Question]) -> dict[str, Question]:
        return {q.item_id: q for q in dataset}

    # ---- generate

    def plan_generations(
        self, ctx: Ctx, model: str, spec: OpenAIModel, dataset: Sequence[Question]
    ) -> list[Planned]:
        return generation.plan(
            ctx.section, model, spec, dataset, ctx.prompt("generate"), rank_of(ctx)
        )

    def offline_generations(
        self, ctx: Ctx, model: str, spec: ModelSpec, dataset: Sequence[Question]
    ) -> list[Generation]:
        return generation.offline(ctx.section, model, spec, dataset, rank_of(ctx))

    # ---- judge

    llm_judge = LLMJudge(
        task=judging.judge_task,
        prompt="judge_point",
        batched="judge_batch",
        schemas=judging.SCHEMAS,
    )

    # ---- results

    metrics = (KPR,)
    results = Results(
        order=lambda r: (r.system, setting_order(r.setting), r.judge, r.model),
        plotted=("kpr",),
        summary=Summary(digits=4),
        runs=RunFields(breakdowns=tuple(f"by_{s}" for s in SECTIONS)),
    )

    def item_score(
        self, ctx: Ctx, item: Question, generation: Generation, judgement: Judgement
    ) -> Outcome:
        bucket = length_bucket(doc_tokens([item])[item.item_id], ctx.section.scoring.length_buckets)
        return item_score(item, judgement, ctx.section.scoring.neutral, bucket)

    def row_extra(self, ctx: Ctx, row: ResultRow, scores: Sequence[ItemScore]) -> None:
        row.extra["n_key_points"] = sum(s.detail["key_points"] for s in scores)
        row.extra["neutral"] = ctx.section.scoring.neutral
        row.extra |= sections(scores, ctx.section.scoring.length_buckets)
