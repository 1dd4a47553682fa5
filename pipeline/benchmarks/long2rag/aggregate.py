"""Long²RAG rows: KPR per (system, setting, judge), with breakdowns and judge agreement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.benchmarks.long2rag.schema import Question
from pipeline.benchmarks.long2rag.scoring import (
    LABELS,
    QuestionVerdicts,
    breakdown,
    bucket_order,
    kpr,
    length_bucket,
    paired_ratings,
)
from pipeline.records import Generation, Judgement

BENCHMARK = "long2rag"
ENTAILMENT_CATEGORIES = ("entailed", "not_entailed")
ROW_KEYS = (
    "benchmark",
    "system",
    "setting",
    "judge",
    "model",
    "kpr",
    "n_questions",
    "n_key_points",
    "n_excluded_questions",
    "n_unjudged_questions",
    "invalid_verdicts",
    "failed_generations",
    "neutral",
    "by_domain",
    "by_category",
    "by_length",
)


@dataclass
class Run:
    model: str
    judge: str
    generations: list[Generation]
    judgements: list[Judgement]


def setting_order(setting: str) -> tuple[int, int, str]:
    """long_context first, then the RAG budgets from small to large."""
    if setting.startswith("rag_") and setting[4:].isdigit():
        return (1, int(setting[4:]), setting)
    return (0, 0, setting)


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    return (row["system"], row["setting"], row["judge"], row["model"])


def _labels(q: Question, j: Judgement | None) -> QuestionVerdicts:
    by_kp = {v.target_id: v for v in j.verdicts} if j is not None else {}
    labels: list[str | None] = []
    for kp in q.key_points:
        v = by_kp.get(kp.kp_id)
        labels.append(v.label if v is not None and v.status == "ok" else None)
    return QuestionVerdicts(q.item_id, tuple(labels))


def _section(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g: {"kpr": r.kpr, "n_questions": r.n_questions} for g, r in results.items()}


def build_rows(
    dataset: Sequence[Question],
    runs: Sequence[Run],
    doc_tokens: dict[str, int],
    edges: Sequence[int],
    neutral: str,
) -> tuple[list[dict[str, Any]], dict[tuple[str, ...], list[dict[str, Any]]]]:
    """Rows (sorted) and, per row, the per-question details for MLflow."""
    qs = {q.item_id: q for q in dataset}
    domain = {q.item_id: q.domain for q in dataset}
    category = {q.item_id: q.category for q in dataset}
    bucket = {i: length_bucket(n, edges) for i, n in doc_tokens.items()}
    order = bucket_order(edges)
    rows = []
    details: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for run in runs:
        js = {(j.item_id, j.system, j.setting): j for j in run.judgements if j.sample == 0}
        cells: dict[tuple[str, str], list[Generation]] = {}
        for g in run.generations:
            if g.sample == 0:
                cells.setdefault((g.system, g.setting), []).append(g)
        for (system, setting), gens in sorted(cells.items()):
            verdicts = []
            failed = 0
            for g in gens:
                if g.status != "ok":
                    failed += 1
                    continue
                j = js.get((g.item_id, system, setting))
                if j is not None and j.status == "error":
                    j = None
                verdicts.append(_labels(qs[g.item_id], j))
            total = kpr(verdicts, neutral)
            by_len = breakdown(verdicts, bucket.__getitem__, neutral)
            row = {
                "benchmark": BENCHMARK,
                "system": system,
                "setting": setting,
                "judge": run.judge,
                "model": run.model,
                **total.as_dict(),
                "failed_generations": failed,
                "neutral": neutral,
                "by_domain": _section(breakdown(verdicts, domain.__getitem__, neutral)),
                "by_category": _section(breakdown(verdicts, category.__getitem__, neutral)),
                "by_length": {b: _section(by_len)[b] for b in order if b in by_len},
            }
            rows.append(row)
            details[row_key(row)] = [
                {"item_id": v.item_id, "labels": list(v.labels)} for v in verdicts
            ]
    rows.sort(key=lambda r: (r["system"], setting_order(r["setting"]), r["judge"], r["model"]))
    return rows, details


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
            row: dict[str, Any] = {
                "model": a.model,
                "judge_a": a.judge,
                "judge_b": b.judge,
            }
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
