"""CRUX (context coverage and density) on the benchmark contract.

- construct: the dataset (schema.py). Default (`crux.source: summhay`): DERIVED from the SummHay
  haystacks, no model (derived.py). Or a folder in CRUX's released layout (layout.py). Or a JSONL
  file of your documents and reference answers, built with an LLM (construction.py).
- generate: no model. A "generation" is a retrieval context: one retriever's ranking of a
  query's passages (contexts.py), deep enough for every cut-off.
- judge: a 0-5 rating of each (passage of a context, sub-question) pair: the dataset's labels,
  an LLM with the project's prompt, or the local judge adapted to answerability (judging.py).
- aggregate: Coverage, alpha-nDCG and Density per (domain, retriever, cut-off, judge); each
  judge's agreement with the labels; Kendall tau between the context metrics and the final
  answers' coverage, the paper's Table 1 bottom row (aggregate.py, report.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from statistics import fmean
from typing import Any

from pipeline.benchmarks.crux import aggregate as agg
from pipeline.benchmarks.crux import construction, contexts, derived, judging, layout
from pipeline.benchmarks.crux.aggregate import Answers, answer_scores, views
from pipeline.benchmarks.crux.audit import CruxAudit
from pipeline.benchmarks.crux.params import ContextsModel, CruxParams, LabelsJudge
from pipeline.benchmarks.crux.report import figures, render, report_section
from pipeline.benchmarks.crux.schema import Collection, QueryView
from pipeline.core.benchmark import (
    Asker,
    Benchmark,
    Constructed,
    Context,
    Coverage,
    CoverageCase,
    CoverageVerdictLike,
    LLMJudge,
    NoModelJudge,
    Paper,
    Passage,
    Planned,
    Question,
    ReportSection,
    Retrieval,
    RetrievalQuery,
    Run,
    RunRow,
    SystemAnswer,
    Systems,
    Tables,
)
from pipeline.core.config import JudgeSpec, ModelSpec, OpenAIJudge, OpenAIModel, Params
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.records import Generation, Judgement, Verdict, validate_lines
from pipeline.core.results import ItemScore, Outcome, ResultRow, Results, RowKey, RunFields, Summary

DERIVED = "summhay"
Ctx = Context[CruxParams]


def _counts(dataset: Sequence[Collection]) -> str:
    qs = [q for c in dataset for q in c.queries]
    return (
        f"{len(dataset)} collections, {sum(len(c.passages) for c in dataset)} passages,"
        f" {len(qs)} queries, {sum(len(q.subquestions) for q in qs)} answerable sub-questions"
        f" ({sum(len(q.dropped) for q in qs)} that no passage answers dropped;"
        f" {sum(1 for q in qs if not q.subquestions)} queries left with none, excluded)"
    )


def rated(ctx: Ctx, view: QueryView) -> bool:
    """Whether judges other than the labels rate this query's contexts (`judge_sample`)."""
    n = ctx.section.judge_sample
    return n is None or view.position < n


class CruxLabels(NoModelJudge[CruxParams, QueryView]):
    """The sub-questions' ratings the data carries, as a judge (provider crux-labels)."""

    def judgements(
        self,
        ctx: Ctx,
        judge: str,
        spec: JudgeSpec,
        items: Mapping[str, QueryView],
        gens: Sequence[Generation],
    ) -> list[Judgement]:
        return [judging.labels_judgement(g, items[g.item_id], judge) for g in gens]


class CruxCoverage(Coverage[CruxParams, QueryView]):
    """The local judge on a context: each sub-question against the context's passages (cut into
    `local_sentences`-sentence pieces); a query outside the judges' sample is judged by no one."""

    def cases(self, ctx: Ctx, item: QueryView, generation: Generation) -> list[CoverageCase]:
        if not rated(ctx, item):
            return []  # judged by no one: left out of the rows and counted
        return judging.coverage_cases(item, generation, ctx.section.local_sentences)

    def verdict(self, target: str, verdict: CoverageVerdictLike) -> Verdict:
        return judging.coverage_verdict(target, verdict)


SIZES = ("passages", "tokens")  # a row's mean context size (columns, and metrics of its run)


class CruxAnalyses(Paper[CruxParams, Collection]):
    """CRUX's own: every context scored at every cut-off, the rows in the order of params.yaml,
    each judge against the labels, and the contexts against the final answers (Kendall tau)."""

    def runs(self, ctx: Ctx, dataset: Sequence[Collection], runs: Sequence[Run]) -> list[Run]:
        qviews, sc = views(dataset), ctx.section.scoring
        return [agg.at_cutoffs(r, qviews, sc) for r in runs]

    def rows(
        self,
        ctx: Ctx,
        dataset: Sequence[Collection],
        runs: Sequence[Run],
        rows: list[ResultRow],
        scores: dict[RowKey, list[ItemScore]],
    ) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
        """Within each domain: judges, retrievers, cut-offs in the order of params.yaml."""
        cutoffs = ctx.section.scoring.cutoffs
        judges = [r.judge for r in runs]
        retrievers = list(dict.fromkeys(g.setting for r in runs for g in r.generations))
        rows = sorted(
            rows,
            key=lambda r: (
                r.keys["domain"], r.model, r.system, judges.index(r.judge),
                retrievers.index(r.extra["retriever"]), cutoffs.index(r.extra["cutoff"]),
            ),
        )  # fmt: skip
        return rows, scores

    def tables(
        self,
        ctx: Ctx,
        dataset: Sequence[Collection],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
        scores: Mapping[RowKey, Sequence[ItemScore]],
    ) -> Tables:
        cx = ctx.section
        seed = ctx.params.seed
        agreement = self._agreement(ctx, dataset, runs)
        answers = self._answers(ctx, views(dataset))
        taus = []
        if answers is not None:
            contexts = agg.context_scores(rows, scores, cx.answers.cutoff)
            taus = agg.tau_rows(cx, contexts, answers, seed)
        source = f"derived:{DERIVED}" if cx.source == DERIVED else cx.source
        flat = [r.flat() for r in rows]
        plots = figures(flat, taus)
        return Tables(
            sections={"agreement": agreement, "tau": taus, "source": source},
            # the report in CRUX's order: data, headline, every context, analyses
            report_text=render(cx, dataset, flat, agreement, taus, answers, source),
            figures=plots,
            runs=agg.tau_run_rows(taus, plots),
            summary=agg.tau_summary(taus),
        )

    def run_change(
        self,
        ctx: Ctx,
        dataset: Sequence[Collection],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
    ) -> Callable[[RunRow, Mapping[str, Any]], RunRow]:
        """Each context run: its judge's kappa against the labels."""
        agreement = self._agreement(ctx, dataset, runs)
        kappas = {(a["model"], a["judge"], a["domain"]): a["kappa"] for a in agreement}

        def change(run: RunRow, row: Mapping[str, Any]) -> RunRow:
            if (kappa := kappas.get((run.model, run.judge, row["domain"]))) is not None:
                run.metrics["kappa"] = kappa
            return run

        return change

    def _agreement(
        self, ctx: Ctx, dataset: Sequence[Collection], runs: Sequence[Run]
    ) -> list[dict[str, Any]]:
        """Each judge against the labels (made once for the runs `run_change` and `tables` get)."""
        made = getattr(self, "_made", None)
        if made is None or made[0] is not runs:
            made = (runs, agg.label_agreement(ctx.section, dataset, runs, ctx.params.seed))
            self._made = made
        return made[1]

    def report_section(
        self, metrics: Mapping[str, Any], where: str, table: Callable[[], ReportSection]
    ) -> ReportSection:
        return report_section(metrics, where)

    def _answers(self, ctx: Ctx, qviews: Mapping[str, QueryView]) -> Answers | None:
        """The final answers whose coverage the contexts should predict (`crux.answers`)."""
        from pipeline.retrieval.tokens import count_tokens_batch

        a, sc = ctx.section.answers, ctx.section.scoring
        if a.generations is None:
            return None
        lines = ctx.inputs.jsonl(a.generations)
        gens = [g for _, g in validate_lines(lines, Generation, a.generations, "generation_id")]
        gens = [g for g in gens if g.item_id in qviews and g.status == "ok"]
        counts = count_tokens_batch([g.text or "" for g in gens])
        tokens = {g.generation_id: n for g, n in zip(gens, counts, strict=True)}
        js: list[Judgement] = []
        for path in a.judgements:
            lines = ctx.inputs.jsonl(path)
            js += [j for _, j in validate_lines(lines, Judgement, path, "generation_id")]
        scores, skipped = answer_scores(qviews, gens, js, sc.partial_answers, sc.w, tokens)
        joint: dict[tuple[str, str, str, str], float] = {}
        if a.metrics is not None:
            models = {g.model for g in gens}
            rows = [
                r for r in ctx.inputs.json(a.metrics).get("rows", []) if r.get("model") in models
            ]
            first = rows[0].get("mode") if rows else None  # SummHay's first scoring mode
            for r in rows:
                if r.get("mode") == first and r.get("joint") is not None:
                    key = (str(r["judge"]), str(r["domain"]), str(r["setting"]), str(r["system"]))
                    joint[key] = float(r["joint"])
        return Answers(scores, joint, skipped, [a.generations, *a.judgements])


def _passages(view: QueryView) -> list[Passage]:
    return [Passage(pid, p.text) for pid, p in view.passages.items()]


class CruxRetrieval(Retrieval[CruxParams, Collection]):
    """Every query over its collection's passages, with the released rankings it has."""

    reserved = ("zstar", "oracle", "random", "vector", "longembed", "keywords", "rerank3",
                "bm25", "dense")  # fmt: skip

    def side_by_side(
        self, params: Params, rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str, str, float]]:
        """Each context's coverage at |Z*| and alpha-nDCG at 10 passages, per judge and domain."""
        out = []
        for r in rows:
            where = f"({r['judge']}, {r['domain']})"
            if r.get("cutoff") == "zstar" and r.get("coverage") is not None:
                out.append((str(r["retriever"]), f"context Cov@|Z*| {where}", float(r["coverage"])))
            if r.get("cutoff") == "10" and r.get("alpha_ndcg") is not None:
                what = f"context alpha-nDCG@10 {where}"
                out.append((str(r["retriever"]), what, float(r["alpha_ndcg"])))
        return out

    def queries(
        self, ctx: Ctx, dataset: Sequence[Collection], retriever: str
    ) -> list[RetrievalQuery]:
        return [
            RetrievalQuery(
                view.query.item_id,
                contexts.retrieval_text(view.query),
                _passages(view),
                None,
                dict(view.query.rankings),
            )
            for view in views(dataset).values()
        ]


class CruxSystems(Systems[CruxParams, Collection]):
    """A whole RAG system answers each query from its collection's passages; the passages it
    says it used are its context, judged as a retriever's (every cut-off of them)."""

    def questions(self, ctx: Ctx, dataset: Sequence[Collection]) -> list[Question]:
        task = (
            "Write a report answering the question from the passages, and give the ids of the"
            " passages you used (most useful first): they are judged as your context."
        )
        return [
            Question(view.query.item_id, view.query.query, _passages(view), task, {"view": view})
            for view in views(dataset).values()
        ]

    def generation(
        self, ctx: Ctx, model: str, system: str, question: Question, answer: SystemAnswer
    ) -> Generation:
        view = question.meta.get("view")
        if not isinstance(view, QueryView):
            raise DataError("a system's question without its query", item=question.id)
        if not answer.passages:
            return Generation(
                benchmark="crux", item_id=question.id, model=model, system=system,
                setting=system, status="error",
                error="the system gave no passages: CRUX judges the passages a system used",
            )  # fmt: skip
        return contexts.generation(
            view, system, model, system, ctx.section.scoring, answer.passages, keep_all=True
        )

    def setting(self, model: str, system: str) -> str:
        return system


class Crux(Benchmark[CruxParams, Collection, QueryView]):
    name = "crux"
    coverage = CruxCoverage()
    paper = CruxAnalyses()
    audit = CruxAudit()  # people rate a sample of (passage, sub-question) pairs: kappa
    title = "CRUX"
    version = "1"
    params_model = CruxParams
    record = Collection
    model_providers = frozenset()
    providers = (ContextsModel, LabelsJudge)

    retrieval = CruxRetrieval()
    systems = CruxSystems()

    def check_params(self, section: CruxParams, params: Params) -> None:
        from pipeline.benchmarks.crux.params import COMPUTED, RELEASED

        for m in section.models:
            spec = params.models[m]
            if not isinstance(spec, ContextsModel) or section.source != DERIVED:
                continue  # a CRUX-layout folder's runs are known once it is read
            for r in spec.retrievers:
                if r not in (*RELEASED, *COMPUTED, *section.retrievers):
                    raise ValueError(
                        f"models.{m}.retrievers: {r!r} is neither one of CRUX's rankings"
                        f" ({', '.join((*COMPUTED, *RELEASED))}) nor a retrievers entry listed"
                        " in crux.retrievers"
                    )
        llm = section.construction.llm
        if llm is not None and not isinstance(params.judges.get(llm), OpenAIJudge):
            raise ValueError(
                f"crux.construction.llm names {llm!r}, which is not an openai judges entry"
            )

    # ---- construct

    def construct(self, ctx: Ctx, ask: Asker | None) -> Constructed[Collection]:
        from pipeline.retrieval.tokens import count_tokens

        cx = ctx.section
        eta = cx.scoring.eta
        if cx.source == DERIVED:
            d = cx.derived
            out = derived.derive(ctx.inputs, ctx.data_dir, d.haystacks, d.subtopics, eta)
            return Constructed(out, summary=f"{_counts(out)}; DERIVED from SummHay")
        if not cx.source.endswith(".jsonl"):
            domain = cx.domain or cx.source.rstrip("/").rsplit("/", 1)[-1]
            col = layout.read(ctx.inputs, cx.source, eta, domain, count_tokens)
            return Constructed([col], summary=f"{_counts([col])}; CRUX layout {cx.source}")
        srcs = construction.sources(ctx.inputs.jsonl(cx.source))
        if ask is None:
            raise DataError(
                "building CRUX data from documents needs a model: set crux.construction.llm to"
                " an openai judges entry",
                file=cx.source,
                item=srcs[0].item_id,
                field="reference",
            )
        name = cx.construction.llm
        assert name is not None
        prompts = construction.Prompts(
            passages=ctx.prompt("passages"),
            query=ctx.prompt("query"),
            questions=ctx.prompt("questions"),
            rate=ctx.prompt("rate"),
            repair=ctx.prompt("repair"),
        )
        out, failures = construction.construct(
            srcs,
            prompts,
            ask,
            n_questions=cx.construction.n_questions,
            eta=eta,
            json_mode=getattr(ctx.params.judges[name], "json_mode", True),
            tokens=count_tokens,
        )
        return Constructed(out, failures, summary=f"{_counts(out)}; constructed by {name}")

    def items(self, dataset: Sequence[Collection]) -> dict[str, QueryView]:
        return views(dataset)

    # ---- generate: retrieval contexts, no model

    def plan_generations(
        self, ctx: Ctx, model: str, spec: OpenAIModel, dataset: Sequence[Collection]
    ) -> list[Planned]:
        raise ConfigError(
            f"models.{model}: CRUX evaluates retrieval contexts and generates nothing; use a"
            " models entry with provider crux-contexts"
        )

    def offline_generations(
        self, ctx: Ctx, model: str, spec: ModelSpec, dataset: Sequence[Collection]
    ) -> list[Generation]:
        if not isinstance(spec, ContextsModel):
            raise ConfigError(f"models.{model}: CRUX takes provider crux-contexts")
        from pipeline.core.parallel import fork_map

        system = spec.system or "context"
        scoring = ctx.section.scoring
        yours = {r for r in spec.retrievers if ctx.is_retriever(r)}
        for r in yours:  # your retrievers' rankings, read once here (before the forks)
            ctx.preload(r)

        def of_query(view: QueryView) -> list[Generation]:
            out = []
            for r in spec.retrievers:
                ranked = None
                if r in yours:
                    ranked = [p for p, _ in ctx.ranked(r, view.query.item_id)]
                out.append(contexts.generation(view, r, model, system, scoring, ranked))
            return out

        # each query's rankings and packing on their own: on every core, in order
        return [g for gens in fork_map(of_query, list(views(dataset).values())) for g in gens]

    # ---- judge: an LLM rates a sample of the queries (`judge_sample`), the local judge, or the
    # labels (no model)

    llm_judge = LLMJudge(task=judging.rating_task, prompt="rate", rates=rated)
    no_model_judge = CruxLabels()

    # The result model: the context metrics per (domain, retriever@cutoff, judge), each context
    # scored once per cut-off (aggregate.py: at_cutoffs); judges other than the labels rate a
    # sample (`judge_sample`): the contexts they did not rate are counted, `n_unjudged`.
    metrics = agg.METRICS
    results = Results(
        group_keys=("domain",),
        unjudged="count",
        plotted=("coverage", "alpha_ndcg", "density"),
        summary=Summary(
            group=("domain", "judge"), name=("setting",), metrics=agg.CONTEXT_METRICS, digits=2
        ),
        runs=RunFields(tags={"retriever": "retriever", "cutoff": "cutoff"}, metrics=SIZES),
    )

    def item_score(
        self, ctx: Ctx, item: QueryView, generation: Generation, judgement: Judgement
    ) -> Outcome:
        return agg.context_score(ctx.section.scoring, item, generation, judgement)

    def failed_keys(
        self, ctx: Ctx, item: QueryView, generation: Generation
    ) -> Sequence[Mapping[str, str]]:
        return [{"domain": item.query.domain}]

    def row_extra(self, ctx: Ctx, row: ResultRow, scores: Sequence[ItemScore]) -> None:
        """The row's retriever and cut-off, and the mean size of its contexts."""
        retriever, _, cutoff = row.setting.rpartition("@")
        row.extra |= {"retriever": retriever, "cutoff": cutoff}
        for name, nd in zip(SIZES, (3, 1), strict=True):
            sizes = [s.detail[name] for s in scores]
            row.extra[name] = round(fmean(sizes), nd) if sizes else None
