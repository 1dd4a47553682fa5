"""CRUD-RAG on the benchmark contract.

- construct: the items (schema.py): the released event-summarisation records by default, or the
  authors' benchmark file (every task family); RAGQuestEval's questions from the authors' caches
  or an LLM (questeval.py), written back in the authors' cache layout (datasets/crud_rag/).
- generate: each item in each setting of the knob study (generation.py, retrieval.py): a model
  with the project's prompts, or the no-model baselines.
- judge: the text metrics (`crud_rag-text`, no model: metrics.py) and RAGQuestEval (an
  `openai` judge answering the record's questions from the output: questeval.py).
- aggregate: the declared metrics and each item's score on the result model (aggregate.py:
  rows per (model, system, setting, judge, task) with the knobs); the knob-study tables and
  plot (report.py).
- `lfbench score`: the text metrics of a user's own outputs (`scorer`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pipeline.benchmarks.crud_rag import aggregate as A
from pipeline.benchmarks.crud_rag import generation, metrics, questeval
from pipeline.benchmarks.crud_rag.params import RELEASED, CrudParams, Knobs, TextJudge
from pipeline.benchmarks.crud_rag.report import (
    PLOT,
    figure,
    figure_plot,
    knob_blocks,
    knob_cols,
    render,
)
from pipeline.benchmarks.crud_rag.schema import (
    Item,
    QuestSet,
    cache_file,
    cache_layout,
    parse_benchmark,
    parse_cache,
    parse_released,
)
from pipeline.core.benchmark import (
    Asker,
    Benchmark,
    Constructed,
    Context,
    LLMJudge,
    NoModelJudge,
    Paper,
    Passage,
    Planned,
    ReportSection,
    Retrieval,
    RetrievalQuery,
    Run,
    RunRow,
    Tables,
)
from pipeline.core.config import (
    BaselineModel,
    JudgeSpec,
    ModelSpec,
    OpenAIJudge,
    OpenAIModel,
    Params,
)
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.extensions import FailedOutcome, Scorer
from pipeline.core.markdown import need
from pipeline.core.records import Generation, Judgement
from pipeline.core.results import (
    Excluded,
    Invalid,
    ItemScore,
    Outcome,
    ResultRow,
    Results,
    RowKey,
    RunFields,
    Summary,
)
from pipeline.core.types import EndpointConfig

RELEASED_FILE = "event_summary.first1328.json"
Ctx = Context[CrudParams]


def questions_line(counts: Mapping[str, int], llm: str | None) -> str:
    """Where the records' RAGQuestEval questions came from, for the construct stage's line: with
    no `quest_eval.llm` none was written by a model, and the line says so rather than naming
    None."""
    written = (
        f"{counts['generated']} written by {llm}"
        if llm
        else "none written by a model (quest_eval.llm not set)"
    )
    return (
        f"RAGQuestEval questions: {counts['released']} from the authors' caches, {written},"
        f" {counts['none']} without"
    )


class TextScorer(Scorer):
    def score_line(self, generation: str, reference: str) -> dict[str, float]:
        return metrics.text_metrics(generation, reference)


class EmptyOutputs(FailedOutcome[CrudParams, Item]):
    """An empty output (a failed generation) is an item its text metrics cannot score."""

    def outcome(self, ctx: Ctx, item: Item, generation: Generation) -> Invalid | Excluded | None:
        return A.empty_output(item, generation)


class TextMetrics(NoModelJudge[CrudParams, Item]):
    """The text metrics against the reference (provider crud_rag-text), and an embedding
    similarity when the entry names embeddings."""

    def embedding(self, spec: JudgeSpec) -> str | EndpointConfig | None:
        return spec.embedding if isinstance(spec, TextJudge) else None

    def judgements(
        self,
        ctx: Ctx,
        judge: str,
        spec: JudgeSpec,
        items: Mapping[str, Item],
        gens: Sequence[Generation],
    ) -> list[Judgement]:
        assert isinstance(spec, TextJudge)  # judge_kind: the one judge of its own
        sims: dict[str, float] = {}
        if ctx.embed is not None and spec.embedding is not None:
            sims = metrics.embedding_similarities(ctx.embed, gens, items)
        label = metrics.embedding_label(spec.embedding)
        from pipeline.core.parallel import fork_map

        # each generation's text metrics on their own: on every core, in order
        return fork_map(
            lambda g: metrics.judgement(
                g, items[g.item_id], judge, sims.get(g.generation_id), label
            ),
            gens,
            min_items=100,
        )


class KnobStudy(Paper[CrudParams, Item]):
    """The paper's knob study: the rows in its order of settings, a block per knob, its plot."""

    def rows(
        self,
        ctx: Ctx,
        dataset: Sequence[Item],
        runs: Sequence[Run],
        rows: list[ResultRow],
        scores: dict[RowKey, list[ItemScore]],
    ) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
        return A.ordered(ctx.section, rows), scores

    def tables(
        self,
        ctx: Ctx,
        dataset: Sequence[Item],
        runs: Sequence[Run],
        rows: Sequence[ResultRow],
        scores: Mapping[RowKey, Sequence[ItemScore]],
    ) -> Tables:
        cx = ctx.section
        source = "released:event_summary" if cx.source == RELEASED else cx.source
        report, figures = render(cx, dataset, [r.flat() for r in rows], source)
        return Tables(sections={"source": source}, report=report, figures=figures)

    def run_change(
        self, ctx: Ctx, dataset: Sequence[Item], runs: Sequence[Run], rows: Sequence[ResultRow]
    ) -> Callable[[RunRow, Mapping[str, Any]], RunRow]:
        """The knob-study plot on the base setting's runs (drawn when one is logged)."""
        plot = figure_plot([r.flat() for r in rows])
        plots = {PLOT: plot} if plot is not None else {}

        def change(run: RunRow, row: Mapping[str, Any]) -> RunRow:
            return replace(run, plots=plots) if row["knob"] == "base" and plots else run

        return change

    def report_section(
        self, metrics_file: Mapping[str, Any], where: str, table: Callable[[], ReportSection]
    ) -> ReportSection:
        section = table()
        rows = metrics_file["rows"]
        for n, r in enumerate(rows, 1):
            need(
                r,
                ("task", "knob", *A.KNOBS, "n_failed_generations", "n_failed_judgements"),
                where,
                n,
            )
        lines = [f"The knob study ({metrics_file.get('source', '?')}).", ""]
        lines += knob_blocks(rows, knob_cols(rows))
        plot = figure(rows)
        figures = [("CRUD-RAG knob study", plot)] if plot else []
        return ReportSection([*section.lines, *lines], [*section.figures, *figures])


def source_of(ctx: Ctx) -> tuple[list[Item], list[str]]:
    """The source's items and news texts."""
    cx = ctx.section
    if cx.source == RELEASED:
        path = posixpath.join(ctx.data_dir or "data/crud_rag", RELEASED_FILE)
        return parse_released(ctx.inputs.json(path), path, cx.records)
    return parse_benchmark(ctx.inputs.json(cx.source), cx.source, list(cx.tasks), cx.records)


def corpus_of(ctx: Ctx) -> list[str]:
    """The retrieval corpus: the source's news texts, or the authors' corpus files."""
    cx = ctx.section
    if cx.corpus == "records":
        return source_of(ctx)[1]
    docs = []
    for path in ctx.inputs.glob(cx.corpus, "*"):
        docs += [line.strip() for line in ctx.inputs.text(path).splitlines() if line.strip()]
    if not docs:
        raise DataError("no news items in the corpus folder", file=cx.corpus)
    return docs


SETTING_NAME = re.compile(r"^(.+)-c[0-9]+-o[0-9]+-k[0-9]+$")


def rank_of(ctx: Ctx) -> generation.RankOf:
    """A retrievers entry's ranking of an item's query over a chunking (its retrieval stage)."""
    for r in ctx.section.retrievers:
        ctx.preload(r)

    def ranking(knobs: Knobs, item: Item) -> list[str] | None:
        if not ctx.is_retriever(knobs.retriever):
            return None
        return [p for p, _ in ctx.ranked(knobs.retriever, generation.query_id(knobs, item))]

    return ranking


class CrudRetrieval(Retrieval[CrudParams, Item]):
    """Each item's query over the corpus chunked as the settings that name the retriever chunk
    it (one query per item and chunking), kept to their largest top-k."""

    reserved = ("bm25", "dense", "hybrid", "oracle")

    def retriever_of(self, ctx: Ctx, setting: str) -> str | None:
        m = SETTING_NAME.match(setting)
        return m.group(1) if m and ctx.is_retriever(m.group(1)) else None

    def queries(self, ctx: Ctx, dataset: Sequence[Item], retriever: str) -> list[RetrievalQuery]:
        from pipeline.benchmarks.crud_rag.retrieval import Index

        chunkings: dict[tuple[int, int], tuple[Knobs, int]] = {}
        for _, k in ctx.section.grid.settings():
            if k.retriever == retriever:
                key = (k.chunk_size, k.overlap_tokens)
                depth = max(k.top_k, chunkings[key][1]) if key in chunkings else k.top_k
                chunkings[key] = (k, depth)
        corpus = corpus_of(ctx)
        out = []
        for (size, overlap), (knobs, depth) in chunkings.items():
            index = Index.build(corpus, size, overlap)
            passages = [Passage(str(i), c) for i, c in enumerate(index.chunks)]
            out += [
                RetrievalQuery(generation.query_id(knobs, item), item.query, passages, depth)
                for item in dataset
            ]
        return out


class CrudRag(Benchmark[CrudParams, Item, Item]):
    name = "crud_rag"
    paper = KnobStudy()
    title = "CRUD-RAG"
    version = "1"
    params_model = CrudParams
    record = Item
    model_providers = frozenset({"openai", "baseline"})
    providers = (TextJudge,)
    # what CRUD-RAG alone has: `lfbench score`, and an empty output counted as an invalid item
    extensions = (TextScorer(), EmptyOutputs())

    retrieval = CrudRetrieval()

    def check_params(self, section: CrudParams, params: Params) -> None:
        from pipeline.benchmarks.crud_rag.params import RETRIEVERS

        for _, knobs in section.grid.settings():
            if knobs.retriever not in (*RETRIEVERS, *section.retrievers):
                raise ValueError(
                    f"crud_rag.grid: retriever {knobs.retriever!r} is neither one of"
                    f" {', '.join(RETRIEVERS)} nor a retrievers entry crud_rag.retrievers lists"
                )
        llm = section.quest_eval.llm
        if llm is not None and not isinstance(params.judges.get(llm), OpenAIJudge):
            raise ValueError(
                f"crud_rag.quest_eval.llm names {llm!r}, which is not an openai judges entry"
            )

    # ---- data

    def _source(self, ctx: Ctx) -> tuple[list[Item], list[str]]:
        return source_of(ctx)

    def corpus(self, ctx: Ctx) -> list[str]:
        """The retrieval corpus: the source's news texts, or the authors' corpus files."""
        return corpus_of(ctx)

    def construct(self, ctx: Ctx, ask: Asker | None) -> Constructed[Item]:
        cx = ctx.section
        items, _ = self._source(ctx)
        cached: dict[str, dict[str, QuestSet]] = {}
        if cx.quest_eval.caches is not None:
            for task in cx.tasks:
                path = posixpath.join(cx.quest_eval.caches, cache_file(task))
                if ctx.inputs.exists(path):
                    cached[task] = parse_cache(ctx.inputs.json(path), path)
        prompts = questeval.Prompts(
            ctx.prompt("quest_generate"), ctx.prompt("quest_answer"), ctx.prompt("repair")
        )
        out, failures, counts = questeval.build(
            items, cached, prompts if ask is not None else None, ask, cx.quest_eval.llm
        )
        files = {
            cache_file(task): cache_layout(
                {i.record_id: i.quest_eval for i in out if i.task == task and i.quest_eval}
            )
            for task in cx.tasks
        }
        tasks = ", ".join(f"{t} {sum(1 for i in out if i.task == t)}" for t in cx.tasks)
        summary_line = f"{len(out)} items ({tasks}); " + questions_line(counts, cx.quest_eval.llm)
        return Constructed(out, failures, summary_line, files)

    def items(self, dataset: Sequence[Item]) -> dict[str, Item]:
        return {i.item_id: i for i in dataset}

    # ---- generate

    def plan_generations(
        self, ctx: Ctx, model: str, spec: OpenAIModel, dataset: Sequence[Item]
    ) -> list[Planned]:
        prompts = {
            name: ctx.prompt(name)
            for name in ("event_summary", "continuing_writing", "questanswer", "hallu_modified")
        }
        max_tokens = ctx.section.generation.max_tokens or spec.max_tokens
        return generation.plan(
            ctx.section,
            model,
            spec.system or model,
            max_tokens,
            dataset,
            self.corpus(ctx),
            prompts,
            rank_of(ctx),
        )

    def offline_generations(
        self, ctx: Ctx, model: str, spec: ModelSpec, dataset: Sequence[Item]
    ) -> list[Generation]:
        if not isinstance(spec, BaselineModel):
            raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run crud_rag")
        system = spec.system or model
        return generation.offline(
            ctx.section, model, system, spec.kind, dataset, self.corpus(ctx), rank_of(ctx)
        )

    # ---- judge: RAGQuestEval by an LLM, or the text metrics (no model)

    llm_judge = LLMJudge(task=questeval.judge_task, prompt="quest_answer")
    no_model_judge = TextMetrics()

    # ---- results: declared once; the stage layer joins, counts, pools, logs and compares

    metrics = A.METRICS
    results = Results(
        group_keys=("task",),
        plotted=("rouge_l", "bleu", "bleu_bp"),
        summary=Summary(
            group=("task", "system", "judge"),
            name=("setting",),
            metrics=A.SUMMARY,
            digits=2,
            keep_none=False,
        ),
        runs=RunFields(params={k: k for k in ("knob", *A.KNOBS)}, tags={"knob": "knob"}),
    )

    def item_score(
        self, ctx: Ctx, item: Item, generation: Generation, judgement: Judgement
    ) -> Outcome:
        return A.item_score(item, judgement)

    def failed_keys(self, ctx: Ctx, item: Item, generation: Generation) -> list[dict[str, str]]:
        return [{"task": item.task}]

    def row_extra(self, ctx: Ctx, row: ResultRow, scores: Sequence[ItemScore]) -> None:
        A.row_extra(ctx.section, ctx.params, row, scores)
