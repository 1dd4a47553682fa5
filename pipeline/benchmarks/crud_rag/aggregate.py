"""CRUD-RAG's rows: per (task, model, setting, judge), the mean of each metric over the items it
scores (x100, as the paper's tables; length in characters), with the setting's knobs and the
items left out, counted: `n_invalid` (the metric cannot be computed, e.g. an empty output, or
the judge's answer was unusable after a repair; reasons in `invalid_reasons`), `n_failed` (the
generation or its judgement failed), `n_no_questions` (RAGQuestEval: the record has no question
its reference answers)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from pipeline.benchmarks.crud_rag import metrics as M
from pipeline.benchmarks.crud_rag import questeval
from pipeline.benchmarks.crud_rag.generation import settings
from pipeline.benchmarks.crud_rag.params import CrudParams
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core.benchmark import Run, RunRow

TEXT = (*M.METRICS, M.EMBEDDING, "length")
QUEST = ("precision", "recall")
KNOBS = ("chunk_size", "chunk_overlap", "retriever", "top_k")
COUNTS = ("n_items", "n_scored", "n_invalid", "n_failed", "n_no_questions")


def _text_scores(j: Any) -> tuple[dict[str, float] | None, str | None]:
    bad = [v for v in j.verdicts if v.status != "ok"]
    if bad:
        return None, bad[0].raw or "invalid"
    scores = {v.target_id: float(v.label) for v in j.verdicts}
    return scores, next((v.raw for v in j.verdicts if v.target_id == M.EMBEDDING), None)


def build_rows(
    section: CrudParams, dataset: Sequence[Item], runs: Sequence[Run]
) -> tuple[list[dict[str, Any]], dict[tuple[str, ...], list[dict[str, Any]]]]:
    items = {i.item_id: i for i in dataset}
    grid = {s.name: s for s in settings(section)}
    order = list(grid)
    cells: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    counts: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    reasons: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    kinds: dict[str, str] = {}
    embedders: dict[tuple[str, ...], str] = {}
    for run in runs:
        by_gen = {j.generation_id: j for j in run.judgements}
        for g in run.generations:
            item = items.get(g.item_id)
            if item is None:
                continue
            key: tuple[str, ...] = (item.task, run.model, g.system, g.setting, run.judge)
            c = counts[key]
            c["n_items"] += 1
            j = by_gen.get(g.generation_id)
            if g.status != "ok" and not (g.text or "").strip() and g.error == "empty answer":
                # an empty output: an explicit invalid item for every judge (the authors' code
                # scores it 0)
                c["n_invalid"] += 1
                reasons[key]["empty output"] += 1
                continue
            if g.status != "ok" or j is None or j.status == "error":
                c["n_failed"] += 1
                continue
            text_judge = j.judge_prompt_sha == M.SHA
            kinds[run.judge] = "text" if text_judge else "ragquesteval"
            if text_judge:
                scores, why = _text_scores(j)
                if scores is None:
                    c["n_invalid"] += 1
                    reasons[key][str(why)] += 1
                    continue
                cells[key].append({"item_id": g.item_id, **scores})
                if why is not None:  # the embedding model, on a scored output
                    embedders[key] = why
                continue
            qset = item.quest_eval
            if qset is None or not qset.kept():
                c["n_no_questions"] += 1
                continue
            bad = [v for v in j.verdicts if v.status != "ok"]
            if bad or not j.verdicts:
                c["n_invalid"] += 1
                reasons[key][(bad[0].raw or "invalid")[:120] if bad else "no verdict"] += 1
                continue
            s = questeval.score(qset, {v.target_id: v.label for v in j.verdicts})
            cells[key].append(
                {"item_id": g.item_id, "precision": s.precision, "recall": s.recall,
                 "n_questions": s.n_questions, "n_answered": s.n_answered}
            )  # fmt: skip
    rows, details = [], {}

    def sort_key(key: tuple[str, ...]) -> tuple[Any, ...]:
        task, model, system, setting, judge = key
        return (task, model, system, judge, order.index(setting) if setting in order else 99)

    for key in sorted(counts, key=sort_key):
        task, model, system, setting, judge = key
        scored = cells.get(key, [])
        st = grid.get(setting)
        knobs = st.knobs.model_dump() if st is not None and st.knobs is not None else {}
        row: dict[str, Any] = {
            "benchmark": "crud_rag",
            "task": task,
            "system": system,
            "setting": setting,
            "knob": st.knob if st is not None else None,
            **{k: knobs.get(k) for k in KNOBS},
            "judge": judge,
            "judge_kind": kinds.get(judge),
            "model": model,
        }
        for metric in (*TEXT, *QUEST):
            values = [x[metric] for x in scored if metric in x]
            scale = 1.0 if metric == "length" else 100.0
            row[metric] = round(scale * fmean(values), 4) if values else None
        row["embedding_model"] = embedders.get(key)
        row |= {k: counts[key][k] for k in COUNTS}
        row["n_scored"] = len(scored)
        row["invalid_reasons"] = dict(reasons[key])
        rows.append(row)
        details[key] = scored
    return rows, details


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{task/system/judge: {setting: {bleu, rouge_l, precision, recall}}} for `dvc metrics`."""
    out: dict[str, Any] = {}
    for r in rows:
        cell = {
            k: round(r[k], 2)
            for k in ("bleu", "bleu_bp", "rouge_l", "precision", "recall")
            if r.get(k) is not None
        }
        out.setdefault(f"{r['task']}/{r['system']}/{r['judge']}", {})[r["setting"]] = cell
    return out


def run_rows(
    rows: Sequence[Mapping[str, Any]],
    details: Mapping[tuple[str, ...], list[dict[str, Any]]],
    figures: Mapping[str, bytes],
) -> list[RunRow]:
    out = []
    for row in rows:
        key = tuple(str(row[k]) for k in ("task", "model", "system", "setting", "judge"))
        numbers = {k: float(row[k]) for k in (*TEXT, *QUEST, *COUNTS) if row.get(k) is not None}
        params = {k: str(row[k]) for k in ("task", "setting", "knob", *KNOBS, "judge", "model")}
        out.append(
            RunRow(
                key="|".join(key),
                name=f"{row['system']} / {row['setting']} / {row['judge']} / {row['task']}",
                metrics=numbers,
                params=params,
                tags={
                    "task": str(row["task"]),
                    "setting": str(row["setting"]),
                    "model.name": str(row["system"]),
                    "knob": str(row["knob"]),
                },
                artifacts={"items.jsonl": details.get(key, []), "row.json": dict(row)},
                plots=figures if row["knob"] == "base" else {},
                model=str(row["model"]),
                judge=str(row["judge"]),
            )
        )
    return out
