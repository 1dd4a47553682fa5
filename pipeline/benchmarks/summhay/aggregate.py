"""From judgements to the rows of metrics/summhay.json (and the item-level detail behind them).

One row per (domain, system, setting, judge, mode): the paper's table cells, pooled over every
subtopic of every haystack of the domain. When a system was run on both domains, an extra row
with domain `all` pools them, as the paper's Table 2 does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from pipeline.benchmarks.summhay.scoring import (
    InsightScore,
    Mode,
    extract_bullets,
    macro,
    pool,
    score_summary,
    words_per_bullet,
)
from pipeline.core.benchmark import Details, Rows, Run, RunRow
from pipeline.core.errors import DataError
from pipeline.core.records import Judgement
from pipeline.data.haystacks import Haystack

ROW_KEYS = (
    "benchmark",
    "domain",
    "collection",
    "system",
    "setting",
    "judge",
    "mode",
    "model",
    "coverage",
    "citation",
    "joint",
    "citation_precision",
    "citation_recall",
    "words_per_bullet",
    "n_insights",
    "n_summaries",
    "n_covered",
    "n_invalid",
    "n_bad_links",
    "n_failed_generations",
    "n_failed_judgements",
    "n_truncated",
    "coverage_macro",
    "citation_macro",
    "joint_macro",
    "invalid_judgements",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "haystacks",
)


@dataclass
class _Group:
    per_summary: list[list[InsightScore]] = field(default_factory=list)
    wpb: list[float] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)
    failed_generations: int = 0
    failed_judgements: int = 0
    truncated: int = 0  # answers the server cut for length, kept and scored (flagged)
    invalid_judgements: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    haystacks: set[str] = field(default_factory=set)  # `id` or `id=<recipe sha, 12>` if derived


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def build_rows(
    dataset: Sequence[Haystack],
    runs: Iterable[Run],
    modes: Sequence[Mode],
    partial_credit: float = 0.5,
) -> tuple[list[dict[str, Any]], dict[tuple[str, ...], list[dict[str, Any]]]]:
    """Rows of metrics/summhay.json and, per row key, the insight-level scores behind it.

    Every generation counts somewhere: scored, or in `n_failed_generations` (the model call
    failed) or `n_failed_judgements` (the judge failed, or left it unjudged).
    """
    items = {s.item_id: (h, s) for h in dataset for s in h.subtopics}
    groups: dict[tuple[str, ...], _Group] = defaultdict(_Group)

    for run in runs:
        by_gen: dict[str, Judgement] = {}
        j: Judgement | None
        gen_ids = {g.generation_id for g in run.generations}
        for jd in run.judgements:
            if jd.generation_id not in gen_ids:
                raise DataError(
                    "judgement of a generation that is not in the generations file",
                    item=jd.generation_id,
                    field="generation_id",
                )
            if jd.generation_id in by_gen:
                raise DataError(
                    "two judgements of one generation by one judge",
                    item=jd.generation_id,
                    field="generation_id",
                )
            by_gen[jd.generation_id] = jd
        for gen in run.generations:
            if gen.item_id not in items:
                raise DataError(
                    "generation of an item that is not in the dataset",
                    item=gen.generation_id,
                    field="item_id",
                )
            hay, sub = items[gen.item_id]
            gold = {i.insight_id: i.gold_docs for i in sub.insights}
            ids = [i.insight_id for i in sub.insights]
            bullets = extract_bullets(gen.text or "")
            j = by_gen.get(gen.generation_id)
            for mode in modes:
                g = groups[
                    (
                        hay.domain,
                        hay.collection,
                        gen.system,
                        gen.setting,
                        run.judge,
                        mode,
                        run.model,
                    )
                ]
                g.haystacks.add(
                    hay.haystack_id
                    if hay.derived is None
                    else f"{hay.haystack_id}={hay.derived.recipe_sha[:12]}"
                )
                g.input_tokens += gen.usage.input_tokens
                g.output_tokens += gen.usage.output_tokens
                g.cost_usd += gen.usage.cost_usd
                if j is not None:
                    g.input_tokens += j.usage.input_tokens
                    g.output_tokens += j.usage.output_tokens
                    g.cost_usd += j.usage.cost_usd
                    g.invalid_judgements += sum(1 for v in j.verdicts if v.status == "invalid")
                if gen.status == "error":
                    g.failed_generations += 1
                    continue
                if gen.meta.get("truncated"):
                    g.truncated += 1
                if j is None or j.status == "error":
                    g.failed_judgements += 1
                    continue
                try:
                    scores = score_summary(bullets, j.verdicts, ids, gold, mode, partial_credit)
                except ValueError as e:
                    raise DataError(str(e), item=j.generation_id, field="verdicts") from e
                g.per_summary.append(scores)
                wpb = words_per_bullet(bullets)
                if wpb is not None:
                    g.wpb.append(wpb)
                for sc in scores:
                    g.details.append(
                        {
                            "item_id": gen.item_id,
                            "generation_id": gen.generation_id,
                            "insight_id": sc.insight_id,
                            "status": sc.status,
                            "covered": sc.covered,
                            "coverage": sc.coverage,
                            "precision": sc.precision,
                            "recall": sc.recall,
                            "f1": sc.f1,
                            "bullet": None if sc.bullet_index is None else sc.bullet_index + 1,
                            "bad_link": sc.bad_link,
                        }
                    )

    # Pool both domains when a system has rows in both.
    by_rest: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
    for key in groups:
        by_rest[key[1:]].append(key)
    for rest, keys in by_rest.items():
        if len({k[0] for k in keys}) > 1:
            allg = _Group()
            for k in sorted(keys):
                src = groups[k]
                allg.per_summary += src.per_summary
                allg.wpb += src.wpb
                allg.details += src.details
                allg.failed_generations += src.failed_generations
                allg.failed_judgements += src.failed_judgements
                allg.truncated += src.truncated
                allg.invalid_judgements += src.invalid_judgements
                allg.input_tokens += src.input_tokens
                allg.output_tokens += src.output_tokens
                allg.cost_usd += src.cost_usd
                allg.haystacks |= src.haystacks
            groups[("all", *rest)] = allg

    rows = []
    details: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for key in sorted(groups):
        domain, collection, system, setting, judge, mode_name, model = key
        g = groups[key]
        p = pool(s for summary in g.per_summary for s in summary)
        m = macro(g.per_summary) if mode_name == "corrected" else None
        row: dict[str, Any] = {
            "benchmark": "summhay",
            "domain": domain,
            "collection": collection,
            "system": system,
            "setting": setting,
            "judge": judge,
            "mode": mode_name,
            "model": model,
            "coverage": _r(p.coverage),
            "citation": _r(p.citation),
            "joint": _r(p.joint),
            "citation_precision": _r(p.citation_precision),
            "citation_recall": _r(p.citation_recall),
            "words_per_bullet": _r(fmean(g.wpb)) if g.wpb else None,
            "n_insights": p.n_insights,
            "n_summaries": len(g.per_summary),
            "n_covered": p.n_covered,
            "n_invalid": p.n_invalid,
            "n_bad_links": p.n_bad_links,
            "n_failed_generations": g.failed_generations,
            "n_failed_judgements": g.failed_judgements,
            "n_truncated": g.truncated,
            "coverage_macro": _r(m.coverage) if m else None,
            "citation_macro": _r(m.citation) if m else None,
            "joint_macro": _r(m.joint) if m else None,
            "invalid_judgements": g.invalid_judgements,
            "input_tokens": g.input_tokens,
            "output_tokens": g.output_tokens,
            "cost_usd": round(g.cost_usd, 6),
            "haystacks": ",".join(sorted(g.haystacks)),
        }
        assert tuple(row) == ROW_KEYS
        rows.append(row)
        details[row_key(row)] = g.details
    return rows, details


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    """What names a row (its MLflow run): a derived collection's rows add the collection."""
    key = tuple(str(row[k]) for k in ("domain", "system", "setting", "judge", "mode", "model"))
    return key if row["collection"] == "released" else (*key, str(row["collection"]))


def where(row: dict[str, Any]) -> str:
    """The row's haystacks in words: `news`, or `news@50k` for a derived collection."""
    c = row["collection"]
    return str(row["domain"]) if c == "released" else f"{row['domain']}@{c}"


# ---------------------------------------------------------------- what is logged


# Every numeric column of a row is an MLflow metric; the others identify the row.
ID_KEYS = ("benchmark", "domain", "collection", "system", "setting", "judge", "mode", "model")
TEXT_KEYS = ("haystacks",)  # logged as a tag: the haystacks a row pools (derived: =recipe sha)
METRIC_KEYS = tuple(k for k in ROW_KEYS if k not in ID_KEYS + TEXT_KEYS)


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """The headline scores nested for `dvc metrics show/diff`: {domain/judge/mode: {system/
    setting: {coverage, citation, joint}}} (DVC cannot read the row list)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for r in rows:
        section = out.setdefault(f"{where(r)}/{r['judge']}/{r['mode']}", {})
        section[f"{r['system']}/{r['setting']}"] = {
            k: None if r[k] is None else round(r[k], 2) for k in ("coverage", "citation", "joint")
        }
    return out


def _plot_group(row: dict[str, Any]) -> tuple[str, ...]:
    return (where(row), *(str(row[k]) for k in ("judge", "mode", "model", "system")))


def row_plots(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, bytes]]:
    """The plots logged with each run, per (domain, judge, mode, model entry, system):
    `plots/joint_by_setting.png` (the system's scores in each context setting) and, when the
    system has whole-haystack orderings, `plots/position_sensitivity.png` (Joint with the
    relevant documents at the top / middle / bottom of the context vs the default order, for
    every system of that domain, judge and mode that has them)."""
    from pipeline.benchmarks.summhay import plots

    by_group: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    by_view: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(_plot_group(r), []).append(r)
        by_view.setdefault(_plot_group(r)[:3], []).append(r)
    position: dict[tuple[str, ...], tuple[set[str], bytes | None]] = {}
    for view, vrows in by_view.items():
        domain, judge_name, mode = view
        systems = {t["system"] for t in plots.position_table(vrows)}
        title = f"SummHay position sensitivity ({domain}, {judge_name}, {mode})"
        position[view] = (systems, plots.position_sensitivity(vrows, title) if systems else None)
    out: dict[tuple[str, ...], dict[str, bytes]] = {}
    for group, grows in sorted(by_group.items()):
        domain, judge_name, mode, _, system = group
        title = f"SummHay {system} ({domain}, judge {judge_name}, {mode})"
        files = {"plots/joint_by_setting.png": plots.joint_by_setting(grows, title)}
        systems, png = position[group[:3]]
        if png is not None and system in systems:
            files["plots/position_sensitivity.png"] = png
        out[group] = files
    return out


def run_rows(rows: Rows, details: Details, partial_credit: float) -> list[RunRow]:
    """One MLflow run per row: its numbers, its insight-level scores and its plots."""
    plot_files = row_plots(rows)
    return [
        run_row(row, details[row_key(row)], plot_files.get(_plot_group(row), {}), partial_credit)
        for row in rows
    ]


def run_row(
    row: dict[str, Any], detail: list[dict[str, Any]], plots: dict[str, bytes], partial: float
) -> RunRow:
    ids = ("domain", "collection", "system", "setting", "judge", "mode", "model")
    return RunRow(
        key="|".join(row_key(row)),
        name=" / ".join(
            [*(str(row[k]) for k in ("system", "setting", "judge", "mode")), where(row)]
        ),
        metrics={k: float(row[k]) for k in METRIC_KEYS if row[k] is not None},
        params={k: str(row[k]) for k in ids} | {"partial_credit": str(partial)},
        tags={
            "domain": row["domain"],
            "collection": row["collection"],
            "summhay.haystacks": row["haystacks"],
            "mode": row["mode"],
            "setting": row["setting"],
            "model.name": row["system"],
        },
        artifacts={"judgements.jsonl": detail, "row.json": row},
        plots=plots,
        model=row["model"],
        judge=row["judge"],
    )
