"""Long²RAG on the result model: KPR per question, declared once; breakdowns by domain, category
and input length; agreement between judges (the paper's free-marginal kappa)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.benchmarks.long2rag.schema import Question
from pipeline.benchmarks.long2rag.scoring import (
    LABELS,
    bucket_order,
    paired_ratings,
    question_recall,
)
from pipeline.core.benchmark import Run
from pipeline.core.records import Judgement
from pipeline.core.results import Excluded, Invalid, ItemScore, Metric, Outcome, Scored

ENTAILMENT_CATEGORIES = ("entailed", "not_entailed")
KPR = Metric(
    "kpr",
    "KPR",
    higher_is_better=True,
    unit="share of key points entailed",
    lo=0.0,
    hi=1.0,
    digits=None,
    ordered_sum=True,  # summed question by question, as Long²RAG's KPR always was
)
SECTIONS = ("domain", "category", "length")
NO_KEY_POINTS = "no key points"


def setting_order(setting: str) -> tuple[int, int, str]:
    """long_context first, then the RAG budgets from small to large (a budget's retrievers of
    yours, `rag_<budget>@<entry>`, after its default ranker), then a system's own (`own`)."""
    budget = setting[4:].partition("@")[0]
    if setting.startswith("rag_") and budget.isdigit():
        return (1, int(budget), setting)
    return (2 if setting == "own" else 0, 0, setting)


def item_score(q: Question, j: Judgement, neutral: str, bucket: str) -> Outcome:
    """recall(q): the entailed share of the key points with a usable verdict; a question
    without key points is excluded, one without a usable verdict is invalid."""
    if not q.key_points:
        return Excluded(NO_KEY_POINTS)
    by_kp = {v.target_id: v for v in j.verdicts}
    labels = [
        v.label if (v := by_kp.get(kp.kp_id)) is not None and v.status == "ok" else None
        for kp in q.key_points
    ]
    invalid = sum(1 for x in labels if x is None)
    recall = question_recall(labels, neutral)
    if recall is None:
        return Invalid("no usable verdict", invalid_verdicts=invalid)
    detail = {
        "labels": labels,
        "key_points": len(labels) - invalid,
        "domain": q.domain,
        "category": q.category,
        "length": bucket,
    }
    return Scored([ItemScore(q.item_id, values={"kpr": recall}, detail=detail)], invalid)


def doc_tokens(dataset: Sequence[Question]) -> dict[str, int]:
    """cl100k_base tokens of each question's documents (the input-length bucket's measure;
    `count_tokens` remembers each text's count, so every model and setting counts it once)."""
    from pipeline.retrieval.tokens import count_tokens

    return {q.item_id: sum(count_tokens(d.text) for d in q.documents) for q in dataset}


def sections(scores: Sequence[ItemScore], edges: Sequence[int]) -> dict[str, Any]:
    """The row's KPR by domain, by category and by input length (as `by_<section>`)."""
    from pipeline.core.results import breakdown

    return {
        f"by_{s}": breakdown(KPR, scores, s, bucket_order(edges) if s == "length" else None)
        for s in SECTIONS
    }


def agreement_rows(runs: Sequence[Run], neutral: str) -> list[dict[str, Any]]:
    """Free-marginal (Randolph) kappa between every two judges of the same model, over the
    (answer, key point) units both judged: on the binary entailment decision (k = 2) and on the
    three verdicts (k = 3). Between two samples of one judge, pass the two samples' runs."""
    from pipeline.metrics.agreement import randolph_kappa

    def units(run: Run) -> dict[tuple[str, str], str | None]:
        return {
            (j.generation_id, v.target_id): (v.label if v.status == "ok" else None)
            for j in run.judgements
            for v in j.verdicts
        }

    out = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a.model != b.model:
                continue
            ua, ub = units(a), units(b)
            row: dict[str, Any] = {"model": a.model, "judge_a": a.judge, "judge_b": b.judge}
            for name, mode, cats in (
                ("binary", neutral, ENTAILMENT_CATEGORIES),
                ("three_way", None, LABELS),
            ):
                pairs = paired_ratings(ua, ub, mode)
                row[f"n_units_{name}"] = len(pairs)
                row[f"kappa_free_{name}"] = (
                    randolph_kappa([list(p) for p in pairs], categories=cats) if pairs else None
                )
            out.append(row)
    return out
