"""CRUD-RAG's results on the result model (pipeline/core/results.py): per (model, system,
setting, judge, task) the mean of each metric over the items it scores (x100, as the paper's
tables; length in characters, no better direction), with the setting's knobs. Left out and
counted: `n_invalid` (the metric cannot be computed: an empty output, for every judge, or the
judge's answer unusable after a repair; reasons in `invalid_reasons`) and `n_excluded`
(RAGQuestEval: the record has no question its reference answers, `excluded["no questions"]`);
failed generations and judgements by the stage layer's counters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.benchmarks.crud_rag import metrics as M
from pipeline.benchmarks.crud_rag import questeval
from pipeline.benchmarks.crud_rag.generation import settings
from pipeline.benchmarks.crud_rag.params import CrudParams, TextJudge
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core.config import Params
from pipeline.core.records import Generation, Judgement
from pipeline.core.results import Excluded, Invalid, ItemScore, Metric, Outcome, ResultRow, Scored


def _pct(name: str, title: str = "") -> Metric:
    return Metric(name, title, scale=100.0, unit="x100", lo=0.0, hi=100.0, digits=4)


# The first is the main one (headline, ranking, plots): ROUGE-L.
METRICS = (
    _pct("rouge_l", "ROUGE-L"),
    _pct("bleu", "BLEU (no BP)"),
    _pct("bleu_bp", "BLEU"),
    *(_pct(f"bleu{n}", f"BLEU-{n} precision") for n in range(1, 5)),
    _pct(M.EMBEDDING, "embedding similarity"),
    Metric("length", "length", higher_is_better=None, unit="chars", lo=0.0, digits=4),
    _pct("precision", "RAGQuestEval precision"),
    _pct("recall", "RAGQuestEval recall"),
)
# A judge gives some of the metrics (the text metrics, or RAGQuestEval's): the others are
# undefined for its items.
UNDEFINED: dict[str, float | None] = {m.name: None for m in METRICS}
KNOBS = ("chunk_size", "chunk_overlap", "retriever", "top_k")
EMPTY_OUTPUT = "empty output"
NO_QUESTIONS = "no questions"
SUMMARY = ("bleu", "bleu_bp", "rouge_l", "precision", "recall")


def empty_output(item: Item, g: Generation) -> Invalid | None:
    """An empty output is an explicit invalid item for every judge (the authors' code scores it
    0); any other failed generation is counted as one."""
    if not (g.text or "").strip() and g.error == "empty answer":
        return Invalid(EMPTY_OUTPUT, keys={"task": item.task})
    return None


def item_score(item: Item, j: Judgement) -> Outcome:
    """The text metrics' verdicts (one per metric), or RAGQuestEval's answers, as a score."""
    keys = {"task": item.task}
    bad = [v for v in j.verdicts if v.status != "ok"]
    if j.judge_prompt_sha == M.SHA:
        if bad:
            return Invalid(bad[0].raw or "invalid", len(bad), keys)
        values = UNDEFINED | {v.target_id: float(v.label) for v in j.verdicts}
        embedder = next((v.raw for v in j.verdicts if v.target_id == M.EMBEDDING), None)
        made = {"embedding_model": embedder} if embedder else {}
        return Scored([ItemScore(item.item_id, values, keys=keys, detail=made)])
    qset = item.quest_eval
    if qset is None or not qset.kept():
        return Excluded(NO_QUESTIONS, keys)
    if bad or not j.verdicts:
        return Invalid((bad[0].raw or "invalid")[:120] if bad else "no verdict", len(bad), keys)
    s = questeval.score(qset, {v.target_id: v.label for v in j.verdicts})
    detail = {"n_questions": s.n_questions, "n_answered": s.n_answered}
    values = UNDEFINED | {"precision": s.precision, "recall": s.recall}
    return Scored([ItemScore(item.item_id, values, keys=keys, detail=detail)])


def row_extra(
    section: CrudParams, params: Params, row: ResultRow, scores: Sequence[ItemScore]
) -> None:
    """The setting's knobs (which one it varies, and their values), the judge's kind and, for
    the text judge, whose embeddings its similarity used (as its verdicts name them)."""
    st = next((s for s in settings(section) if s.name == row.setting), None)
    knobs = st.knobs.model_dump() if st is not None and st.knobs is not None else {}
    spec = params.judges.get(row.judge)
    kind = None if spec is None else "text" if isinstance(spec, TextJudge) else "ragquesteval"
    embedders = [s.detail["embedding_model"] for s in scores if "embedding_model" in s.detail]
    row.extra |= {
        "knob": st.knob if st is not None else None,
        **{k: knobs.get(k) for k in KNOBS},
        "judge_kind": kind,
        "embedding_model": embedders[-1] if embedders else None,
    }


def ordered(section: CrudParams, rows: Sequence[ResultRow]) -> list[ResultRow]:
    """By task, model, system, judge, then the knob study's order of settings."""
    order = [s.name for s in settings(section)]

    def key(r: ResultRow) -> tuple[Any, ...]:
        at = order.index(r.setting) if r.setting in order else 99
        return (r.keys["task"], r.model, r.system, r.judge, at)

    return sorted(rows, key=key)
