"""Summary of a Haystack (Laban et al., EMNLP 2024) on the benchmark contract.

- construct: the released haystacks, validated and normalised (`pipeline.data.haystacks`);
- generate: bullet-point summaries that cite documents, from a model (`generation.plan`), a
  no-model baseline, or the 78 released systems (`published`);
- judge: coverage of each reference insight and the bullet that covers it (an LLM judge,
  `judging`; the local judge; or the released GPT-4o judgements);
- aggregate: Coverage / Citation / Joint rows as the paper pools them (`aggregate`, `scoring`),
  the paper's table layouts (`report`), one MLflow run per row with its plots;
- agreement: every judge against the 1,419 human labels (`agreement`);
- the local judge's training data: released judgements of the haystacks people did not
  annotate (`training`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pipeline.benchmarks.summhay import aggregate as agg
from pipeline.benchmarks.summhay import generation, judging, published
from pipeline.benchmarks.summhay.agreement import HumanLabels
from pipeline.benchmarks.summhay.params import CONTEXT_SETTINGS, SummhayParams, settings_of
from pipeline.benchmarks.summhay.report import report_section
from pipeline.benchmarks.summhay.scoring import extract_bullets
from pipeline.benchmarks.summhay.training import SummhayTraining
from pipeline.core.benchmark import (
    Asker,
    Audit,
    AuditScale,
    Benchmark,
    Constructed,
    Context,
    Coverage,
    CoverageCase,
    CoverageVerdictLike,
    Gens,
    LLMJudge,
    Paper,
    Passage,
    Planned,
    PriorLabel,
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
from pipeline.core.config import (
    BaselineModel,
    JudgeSpec,
    ModelSpec,
    OpenAIJudge,
    OpenAIModel,
    Params,
    PublishedModel,
)
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.extensions import ItemsInRecords, ReleasedJudgements
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.core.results import ItemScore, Outcome, ResultRow, Results, RowKey, RunFields, Summary
from pipeline.data.haystacks import (
    HAYSTACK_IDS,
    RELEASED_SETTINGS,
    Haystack,
    RawHaystack,
    Subtopic,
    domain_of,
    haystack_file,
    normalise,
    parse_raw_haystack,
)
from pipeline.retrieval.context import RELEASED_RETRIEVERS

RELEASED_NAME = {ours: theirs for theirs, ours in RELEASED_SETTINGS.items()}


def derived_table(dataset: Sequence[Haystack]) -> list[dict[str, Any]]:
    """The dataset's derived haystacks (metrics/summhay.json `derived`): how each was made."""
    return [
        {
            "haystack": h.haystack_id,
            "kind": h.derived.kind,
            "collection": h.derived.collection,
            "documents": len(h.documents),
            "tokens": h.derived.n_tokens,
            "target_tokens": h.derived.target_tokens,
            "subtopics": len(h.subtopics),
            "insights": sum(len(s.insights) for s in h.subtopics),
            "sources": h.derived.sources,
            "seed": h.derived.seed,
            "recipe_sha": h.derived.recipe_sha,
            "figures": h.derived.figures,
        }
        for h in dataset
        if h.derived is not None
    ]


Ctx = Context[SummhayParams]


def studied(
    model: str, spec: OpenAIModel | BaselineModel, dataset: Sequence[Haystack]
) -> list[Haystack]:
    """The haystacks a model runs on: the length study's recombined haystacks only when its
    entry opts in (`length_study`: on for baselines, off for models that cost calls). Every
    released retriever one of its settings needs must have scores in every subtopic (checked
    here, by the model's own stage, so that construction does not depend on model entries)."""
    out = [
        h
        for h in dataset
        if spec.length_study or h.derived is None or h.derived.kind != "recombined"
    ]
    needed = [s for s in settings_of(spec) if s in RELEASED_RETRIEVERS]
    for h in out:
        for sub in h.subtopics:
            for setting in needed:
                if setting not in sub.retriever_scores:
                    raise DataError(
                        f"no scores of the released retriever {RELEASED_NAME[setting]!r},"
                        f" which setting {setting} of models.{model} needs",
                        file=h.source_file,
                        item=sub.item_id,
                        field=f"retriever.{RELEASED_NAME[setting]}",
                    )
    return out


# the setting of a whole RAG system's summaries (its own retrieval)
SYSTEM_SETTING = "own"


def rank_of(ctx: Ctx) -> generation.RankOf:
    """The ranking of a setting that names one of the section's retrievers entries."""

    for r in ctx.section.retrievers:  # read once here (baselines fork out their work)
        ctx.preload(r)

    def ranking(setting: str, sub: Subtopic) -> list[int] | None:
        if not ctx.is_retriever(setting):
            return None
        try:
            return [int(p) for p, _ in ctx.ranked(setting, sub.item_id)]
        except ValueError:
            raise DataError(
                f"retriever {setting!r} ranks ids that are not document positions",
                item=sub.item_id,
            ) from None

    return ranking


def passages(hay: Haystack) -> list[Passage]:
    """A haystack's documents as retrievable passages: the id is the document's position (what
    a summary cites as [i], and what a TREC run file names)."""
    return [Passage(str(d.position), d.text) for d in hay.documents]


class SummhayRetrieval(Retrieval[SummhayParams, Haystack]):
    """Every subtopic's query (and subtopic text, as the released scores were computed) over its
    haystack's documents, with the released rankings it has (what a reranker may re-order)."""

    reserved = (*CONTEXT_SETTINGS, "full-shuffle", SYSTEM_SETTING)

    def side_by_side(
        self, params: Params, rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str, str, float]]:
        """Coverage of the summaries of your models (not the released systems) per context
        setting that is a ranking (not a whole-haystack order), and of your RAG systems."""
        out = []
        first = next((str(r["mode"]) for r in rows if "mode" in r), None)
        for r in rows:
            spec = params.models.get(str(r.get("model")))
            if spec is None or spec.provider == "published" or r.get("coverage") is None:
                continue
            if r.get("mode") != first or r.get("collection") != "released":
                continue
            setting = str(r["setting"])
            if setting.startswith("full"):
                continue
            retriever = str(r["system"]) if setting == SYSTEM_SETTING else setting
            what = f"coverage of {r['system']}'s summaries ({r['judge']}, {r['domain']})"
            out.append((retriever, what, float(r["coverage"])))
        return out

    def queries(
        self, ctx: Ctx, dataset: Sequence[Haystack], retriever: str
    ) -> list[RetrievalQuery]:
        from pipeline.retrieval.context import retrieval_query

        out = []
        for hay in dataset:
            docs = passages(hay)
            positions = [d.position for d in hay.documents]
            for sub in hay.subtopics:
                released = {
                    name: [
                        str(p)
                        for _, p in sorted(
                            zip(scores, positions, strict=True), key=lambda x: (-x[0], x[1])
                        )
                    ]
                    for name, scores in sorted(sub.retriever_scores.items())
                    if len(scores) == len(positions)
                }
                out.append(RetrievalQuery(sub.item_id, retrieval_query(sub), docs, None, released))
        return out


class SummhaySystems(Systems[SummhayParams, Haystack]):
    """A whole RAG system summarizes each subtopic from the whole haystack: a bullet list, each
    bullet citing the documents it draws on by their ids in brackets ([3][12]); citations
    given apart (`citations`, one list per bullet) are written into its bullets."""

    def questions(self, ctx: Ctx, dataset: Sequence[Haystack]) -> list[Question]:
        out = []
        for hay in dataset:
            docs = passages(hay)
            for sub in hay.subtopics:
                n = generation.n_insights(sub)
                task = (
                    f"Summarize what the documents say about the question in {n} bullet points,"
                    " one insight per bullet. End each bullet with the ids of the documents it"
                    " comes from, in square brackets, e.g. [3][12]."
                )
                meta = {"topic": hay.topic, "domain": hay.domain, "bullets": n}
                out.append(Question(sub.item_id, sub.query, docs, task, meta))
        return out

    def generation(
        self, ctx: Ctx, model: str, system: str, question: Question, answer: SystemAnswer
    ) -> Generation:
        text = answer.answer
        meta: dict[str, Any] = {"prompt_sha": "system"}
        error = None
        if answer.citations is not None:
            text, error = with_citations(text, answer.citations)
        if answer.passages is not None:
            try:
                meta["context_docs"] = [int(p) for p in answer.passages]
            except ValueError:
                error = f"passages {list(answer.passages)[:3]} are not document ids"
        if error is not None:
            return Generation(
                benchmark="summhay", item_id=question.id, model=model, system=system,
                setting=SYSTEM_SETTING, status="error", error=error, meta=meta,
            )  # fmt: skip
        return Generation.offline("summhay", question.id, model, system, SYSTEM_SETTING, text, meta)

    def setting(self, model: str, system: str) -> str:
        return SYSTEM_SETTING


def with_citations(text: str, citations: Sequence[Sequence[str]]) -> tuple[str, str | None]:
    """The answer with each bullet's cited ids written after it as [id] (a bullet that already
    cites keeps its text); an error when there are not as many citation lists as bullets."""
    lines = text.splitlines()
    bullets = [i for i, line in enumerate(lines) if line.lstrip()[:1] in ("-", "*", "\u2022")]
    if len(bullets) != len(citations):
        return text, f"citations for {len(citations)} bullets, but the answer has {len(bullets)}"
    for i, ids in zip(bullets, citations, strict=True):
        if ids and "[" not in lines[i]:
            lines[i] = lines[i].rstrip() + " " + "".join(f"[{d}]" for d in ids)
    return "\n".join(lines), None


class SummhayCoverage(Coverage[SummhayParams, Subtopic]):
    """The local judge on a summary: the subtopic's insights against its bullets."""

    def cases(self, ctx: Ctx, item: Subtopic, generation: Generation) -> list[CoverageCase]:
        targets = [(i.insight_id, i.text) for i in item.insights]
        return [CoverageCase(targets, extract_bullets(generation.text or ""))]

    def verdict(self, target: str, verdict: CoverageVerdictLike) -> Verdict:
        return Verdict(
            target_id=target,
            label=verdict.label,
            link=verdict.bullet,
            raw=",".join(f"{p:.4f}" for p in verdict.proba),
        )


class ReleasedGpt4o(ReleasedJudgements[SummhayParams, Haystack]):
    """The GPT-4o judgements released with SummHay (of the released summaries)."""

    def judgements(
        self, ctx: Ctx, judge: str, spec: JudgeSpec, dataset: Sequence[Haystack], gens: Gens
    ) -> list[Judgement]:
        return list(published.judgements(judge, ctx.inputs, ctx.data_dir, gens))


def row_order(row: ResultRow) -> tuple[Any, ...]:
    k = row.keys
    return (k["domain"], k["collection"], row.system, row.setting, row.judge, k["mode"],
            row.model)  # fmt: skip


def scored_items(dataset: Sequence[Haystack]) -> dict[str, tuple[Haystack, Subtopic]]:
    return {s.item_id: (h, s) for h in dataset for s in h.subtopics}


class Subtopics(ItemsInRecords[Haystack]):
    """A haystack holds its subtopics (the items): a model's slice keeps some of a haystack's
    subtopics, and an item score sees its subtopic with its haystack."""

    def restrict(self, dataset: Sequence[Haystack], keep: set[str]) -> list[Haystack]:
        out = []
        for h in dataset:
            subs = [s for s in h.subtopics if s.item_id in keep]
            if subs:
                out.append(h.model_copy(update={"subtopics": subs}))
        return out

    def scored(self, dataset: Sequence[Haystack]) -> dict[str, tuple[Haystack, Subtopic]]:
        return scored_items(dataset)


class PaperTables(Paper[SummhayParams, Haystack]):
    """The paper's own: rows pooling both domains (Table 2's), Table 2 / Table 3 layouts, the
    length study's figure, what the derived haystacks are, each row's plots."""

    def rows(
        self,
        ctx: Ctx,
        dataset: Sequence[Haystack],
        runs: Sequence[Run],
        rows: list[ResultRow],
        scores: dict[RowKey, list[ItemScore]],
    ) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
        hays = agg.haystacks(runs, scored_items(dataset))
        for r in rows:
            where = (r.model, r.system, r.setting, r.keys["domain"], r.keys["collection"])
            r.extra["haystacks"] = ",".join(sorted(hays.get(where, ())))
        rows, scores = agg.with_all_domains(rows, scores, ctx.params.seed)
        return sorted(rows, key=row_order), scores

    def tables(
        self,
        ctx: Ctx,
        dataset: Sequence[Haystack],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
        scores: Mapping[RowKey, Sequence[ItemScore]],
    ) -> Tables:
        from pipeline.benchmarks.summhay import plots
        from pipeline.benchmarks.summhay.report import LENGTH_PLOT, length_views, paper_sections

        domains = sorted({h.domain for h in dataset})
        note = (
            f"Dataset: {len(dataset)} haystacks ({', '.join(domains)}), "
            f"{sum(len(h.subtopics) for h in dataset)} subtopics. Scores on 0-100; Citation is"
            " the mean citation F1 over covered insights."
        )
        derived = derived_table(dataset)
        flat = [r.flat() for r in rows]
        return Tables(
            sections={"derived": derived},
            report=paper_sections(flat, note, derived),
            table=False,  # the paper's layouts show every row
            figures={LENGTH_PLOT: plots.length_scaling(length_views(flat))},
        )

    def run_change(
        self, ctx: Ctx, dataset: Sequence[Haystack], runs: Sequence[Run], rows: Sequence[ResultRow]
    ) -> Callable[[RunRow, Mapping[str, Any]], RunRow]:
        """Each run's plots (drawn when it is logged): its system across settings, and the
        position sensitivity of its view."""
        plot_files = agg.row_plots([r.flat() for r in rows])

        def change(run: RunRow, row: Mapping[str, Any]) -> RunRow:
            return replace(run, plots=plot_files.get(agg.plot_group(row), {}))

        return change

    def report_section(
        self, metrics: Mapping[str, Any], where: str, table: Callable[[], ReportSection]
    ) -> ReportSection:
        return report_section(metrics["rows"], where)


class SummhayAudit(Audit[SummhayParams, Subtopic]):
    """A person audits the judge's coverage verdict on one insight against one summary."""

    def scale(self, ctx: Ctx) -> AuditScale:
        partial = ctx.section.scoring.partial_credit
        return AuditScale(
            name="coverage",
            labels=("FULL_COVERAGE", "PARTIAL_COVERAGE", "NO_COVERAGE"),
            values={"FULL_COVERAGE": 100.0, "PARTIAL_COVERAGE": partial, "NO_COVERAGE": 0.0},
            metric="coverage",
            meaning="does the summary state the insight? FULL_COVERAGE: all of it;"
            " PARTIAL_COVERAGE: part of it; NO_COVERAGE: none of it",
        )

    def view(self, ctx: Ctx, item: Subtopic, generation: Generation, target: str) -> dict[str, str]:
        insight = next((i for i in item.insights if i.insight_id == target), None)
        if insight is None:
            raise DataError("no such insight in the subtopic", item=item.item_id, field=target)
        bullets = extract_bullets(generation.text or "")
        return {
            "insight": insight.text,
            "summary": "\n".join(f"{n}. {b}" for n, b in enumerate(bullets, 1)),
        }

    def released(self, ctx: Ctx, labelled: Any, judged: Mapping[str, Any]) -> list[PriorLabel]:
        """The 1,419 labels of the annotated summaries: each was written by a released system
        (its summary key names the summarizer and the retriever) in one domain."""
        from pipeline.benchmarks.summhay.agreement import JUDGE_LABELS, Sample
        from pipeline.data.haystacks import parse_summary_key

        name = {short: label for label, short in JUDGE_LABELS.items()}
        out = []
        for s in labelled:
            assert isinstance(s, Sample)
            system, setting = parse_summary_key(s.summkey)
            for judge, labels in judged.items():
                verdicts = labels.get(s.sample_id)
                if verdicts is None:  # an LLM judge scores only the first N summaries
                    continue
                for iid, _ in s.insights:
                    if iid not in verdicts:
                        continue
                    got = verdicts[iid]
                    out.append(
                        PriorLabel(
                            judge=judge,
                            system=system,
                            setting=setting,
                            keys={"domain": s.domain},
                            unit=f"{s.sample_id}#{iid}",
                            judge_label=None if got is None else name[got.cls],
                            human_label=name[s.human[iid].cls],
                        )
                    )
        return out


class SummHay(Benchmark[SummhayParams, Haystack, Subtopic]):
    name = "summhay"
    coverage = SummhayCoverage()
    paper = PaperTables()
    audit = SummhayAudit()
    title = "SummHay"
    version = "1"
    params_model = SummhayParams
    record = Haystack
    model_providers = frozenset({"openai", "published", "baseline"})
    agreement = HumanLabels()
    # what SummHay alone has: the released GPT-4o judgements (replayed, and the local judge's
    # training cases) and haystacks that hold several items
    extensions = (ReleasedGpt4o(), SummhayTraining(), Subtopics())

    retrieval = SummhayRetrieval()
    systems = SummhaySystems()

    def setting_names(self, section: SummhayParams) -> Sequence[str]:
        return (*CONTEXT_SETTINGS, *section.retrievers)

    # ---- construct

    def construct(self, ctx: Ctx, ask: Asker | None) -> Constructed[Haystack]:
        """The released haystacks, validated and normalised; then the length study's
        recombined haystacks (`summhay.lengths`) and the synthesized ones (`summhay.synthesis`)."""
        section = ctx.section
        raws: dict[str, RawHaystack] = {}

        def raw_of(hid: str) -> RawHaystack:
            if hid not in raws:
                path = posixpath.join(ctx.data_dir, haystack_file(hid))
                raws[hid] = parse_raw_haystack(ctx.inputs.json(path), path)
            return raws[hid]

        hays = []
        for hid in section.haystacks:
            raw = raw_of(hid)
            hay = normalise(hid, raw, source_file=haystack_file(hid))
            if section.subtopics is not None:
                hay = hay.model_copy(update={"subtopics": hay.subtopics[: section.subtopics]})
            hays.append(hay)
        hays += self.recombined(ctx, raw_of)
        made, failures = self.synthesized(ctx, ask)
        hays += made
        n_sub = sum(len(h.subtopics) for h in hays)
        n_ins = sum(len(s.insights) for h in hays for s in h.subtopics)
        n_derived = sum(1 for h in hays if h.derived is not None)
        return Constructed(
            hays,
            failures=failures,
            summary=f"{len(hays)} haystacks ({n_derived} derived), {n_sub} subtopics,"
            f" {n_ins} insights",
        )

    def recombined(self, ctx: Ctx, raw_of: Callable[[str], RawHaystack]) -> list[Haystack]:
        """The length study's haystacks: each target's task at each length (recombine.py)."""
        from pipeline.benchmarks.summhay.recombine import recombine
        from pipeline.retrieval.tokens import count_tokens_batch

        lengths = ctx.section.lengths
        out = []
        for target in lengths.haystacks:
            domain = domain_of(target)
            pool = [(h, raw_of(h)) for h in HAYSTACK_IDS if h != target and domain_of(h) == domain]
            for tokens in sorted(lengths.tokens):
                hay = recombine(
                    target, raw_of(target), pool, tokens, ctx.params.seed, count_tokens_batch
                )
                if ctx.section.subtopics is not None:
                    hay = hay.model_copy(
                        update={"subtopics": hay.subtopics[: ctx.section.subtopics]}
                    )
                out.append(hay)
        return out

    def synthesized(
        self, ctx: Ctx, ask: Asker | None
    ) -> tuple[list[Haystack], list[tuple[str, str]]]:
        """New haystacks through the construction model (synthesis.py); a haystack whose making
        failed is a failure of the stage (the others are written; every answer is cached)."""
        from pipeline.benchmarks.summhay.synthesis import (
            SynthesisFailed,
            Synthesizer,
            load_prompts,
        )
        from pipeline.retrieval.tokens import count_tokens_batch

        cfg = ctx.section.synthesis
        if not cfg.haystacks:
            return [], []
        if ask is None or cfg.llm is None:
            raise ConfigError("summhay.synthesis: no construction model (synthesis.llm)")
        spec = ctx.params.judges.get(cfg.llm)
        if not isinstance(spec, OpenAIJudge):
            raise ConfigError(f"summhay.synthesis.llm: judges.{cfg.llm} is not an openai entry")
        prompts = load_prompts(ctx.inputs, cfg)
        made, failures = [], []
        for entry in cfg.haystacks:
            for path in entry.seed_documents:
                if not ctx.inputs.exists(path):
                    raise DataError(
                        "seed document not found",
                        file=path,
                        item=f"synthesis haystack {entry.id!r}",
                        field="seed_documents",
                    )
            synth = Synthesizer(
                entry,
                cfg,
                prompts,
                ask,
                ctx.params.seed,
                spec.json_mode,
                (spec.price_input_per_1m, spec.price_output_per_1m),
                count_tokens_batch,
                [(p, ctx.inputs.text(p)) for p in entry.seed_documents],
            )
            try:
                made.append(synth.run())
            except SynthesisFailed as e:
                failures.append((synth.hid, str(e)))
        return made, failures

    def items(self, dataset: Sequence[Haystack]) -> dict[str, Subtopic]:
        return {s.item_id: s for h in dataset for s in h.subtopics}

    # ---- generate

    def plan_generations(
        self, ctx: Ctx, model: str, spec: OpenAIModel, dataset: Sequence[Haystack]
    ) -> list[Planned]:
        dataset = studied(model, spec, dataset)
        return generation.plan(
            ctx.section, ctx.params.seed, model, spec, dataset, ctx.prompts, rank_of(ctx)
        )

    def offline_generations(
        self, ctx: Ctx, model: str, spec: ModelSpec, dataset: Sequence[Haystack]
    ) -> list[Generation]:
        if isinstance(spec, PublishedModel):
            return list(published.generations(model, spec, ctx.inputs, ctx.data_dir, dataset))
        if isinstance(spec, BaselineModel):
            return generation.baseline_generations(
                ctx.section,
                ctx.params.seed,
                model,
                spec,
                studied(model, spec, dataset),
                rank_of(ctx),
            )
        raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run summhay")

    # ---- judge

    llm_judge = LLMJudge(
        task=judging.judge_task,
        prompt="judge_insight",
        batched="judge_batch",
        repair="judge_repair",
        schemas=judging.SCHEMAS,
    )

    # ---- results

    metrics = agg.METRICS
    results = Results(
        group_keys=agg.GROUP_KEYS,
        order=row_order,
        plotted=("joint", "coverage", "citation"),
        summary=Summary(
            group=lambda r: f"{agg.where(r)}/{r['judge']}/{r['mode']}",
            name=("system", "setting"),
            metrics=("coverage", "citation", "joint"),
            digits=2,
        ),
        runs=RunFields(
            tags={"summhay.haystacks": "haystacks"},
            section_params={"partial_credit": "scoring.partial_credit"},
            name=lambda r: " / ".join(
                [*(str(r[k]) for k in ("system", "setting", "judge", "mode")), agg.where(r)]
            ),
        ),
    )

    def item_score(
        self,
        ctx: Ctx,
        item: tuple[Haystack, Subtopic],
        generation: Generation,
        judgement: Judgement,
    ) -> Outcome:
        scoring = ctx.section.scoring
        partial = scoring.partial_credit / 100.0
        return agg.item_score(item, generation, judgement, scoring.modes, partial)

    def failed_keys(
        self, ctx: Ctx, item: tuple[Haystack, Subtopic], generation: Generation
    ) -> list[dict[str, str]]:
        return [agg.keys(item[0], mode) for mode in ctx.section.scoring.modes]

    def row_extra(self, ctx: Ctx, row: ResultRow, scores: Sequence[ItemScore]) -> None:
        agg.row_extra(row, scores)
