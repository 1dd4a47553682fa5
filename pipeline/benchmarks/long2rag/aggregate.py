"""Long²RAG rows: KPR per (system, setting, judge), with breakdowns and judge agreement."""

from __future__ import annotations

from collections.abc import Sequence
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
from pipeline.core.benchmark import RESULT_KEYS, Details, Rows, Run, RunRow
from pipeline.core.records import Generation, Judgement

BENCHMARK = "long2rag"
ENTAILMENT_CATEGORIES = ("entailed", "not_entailed")
ROW_KEYS = (
    *RESULT_KEYS,
    "kpr",
    "n_questions",
    "n_key_points",
    "n_excluded_questions",
    "n_unjudged_questions",
    "invalid_verdicts",
    "failed_generations",
    "truncated_generations",
    "neutral",
    "by_domain",
    "by_category",
    "by_length",
)


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
            failed = truncated = 0
            for g in gens:
                if g.status != "ok":
                    failed += 1
                    continue
                # cut for length by the server and kept (on_truncation: keep): scored, counted
                truncated += bool(g.meta.get("truncated"))
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
                "truncated_generations": truncated,
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


# ---------------------------------------------------------------- what is logged

ID_KEYS = ("benchmark", "system", "setting", "judge", "model", "neutral")
SECTION_KEYS = ("by_domain", "by_category", "by_length")
METRIC_KEYS = tuple(k for k in ROW_KEYS if k not in ID_KEYS + SECTION_KEYS)
PLOT_NAME = "kpr_by_domain_and_category.png"


def doc_tokens(dataset: Sequence[Question]) -> dict[str, int]:
    """cl100k_base tokens of each question's documents (the input-length bucket's measure)."""
    from pipeline.retrieval.tokens import count_tokens_batch

    return {q.item_id: sum(count_tokens_batch([d.text for d in q.documents])) for q in dataset}


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """{judge: {system/setting: kpr}} for `dvc metrics show/diff`."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        out.setdefault(r["judge"], {})[f"{r['system']}/{r['setting']}"] = (
            None if r["kpr"] is None else round(r["kpr"], 4)
        )
    return out


def row_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers as MLflow metrics: `kpr`, the counts, and `kpr.<section>.<group>`."""
    m = {k: float(row[k]) for k in METRIC_KEYS if row[k] is not None}
    for section in SECTION_KEYS:
        for group, cell in row[section].items():
            if cell["kpr"] is not None:
                safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)[:80]
                m[f"kpr.{section.removeprefix('by_')}.{safe}"] = float(cell["kpr"])
    return m


def run_rows(rows: Rows, details: Details, source: str) -> list[RunRow]:
    """One MLflow run per row: KPR, counts and breakdowns, per-question verdicts, its plot."""
    return [run_row(row, details[row_key(row)], source) for row in rows]


def run_row(row: dict[str, Any], detail: list[dict[str, Any]], source: str) -> RunRow:
    from pipeline.benchmarks.long2rag.report import plot_png

    return RunRow(
        key="|".join(row_key(row)),
        name=" / ".join(str(row[k]) for k in ("system", "setting", "judge")),
        metrics=row_metrics(row),
        params={k: str(row[k]) for k in ("system", "setting", "judge", "model", "neutral")},
        tags={"setting": row["setting"], "model.name": row["system"], "dataset.source": source},
        artifacts={"questions.jsonl": detail, "row.json": row},
        plots={PLOT_NAME: plot_png(row)},
        model=row["model"],
        judge=row["judge"],
    )
