"""SummHay on the result model: per summary (one item = one subtopic's summary), the insight
scores pooled as the paper pools them; one row per (domain, collection, system, setting,
judge, scoring mode, model); a system run on both domains also gets a row with domain `all`
pooling them, as the paper's Table 2 does.

Coverage, Joint (over every valid insight) and Citation, its precision and recall (over the
covered insights) are ratios of summed insight scores; the macro averages (corrected mode) are
means of per-summary scores; words per bullet a mean over summaries with bullets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from math import fsum
from typing import Any

from pipeline.benchmarks.summhay.scoring import (
    InsightScore,
    Mode,
    extract_bullets,
    pool,
    score_summary,
    words_per_bullet,
)
from pipeline.core.benchmark import Run
from pipeline.core.drawing import Plot
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement
from pipeline.core.results import (
    Counts,
    ItemScore,
    Metric,
    Outcome,
    ResultRow,
    RowKey,
    Scored,
    Spend,
    combine,
    interval,
)
from pipeline.data.haystacks import Haystack, Subtopic


def _ratio(name: str, title: str) -> Metric:
    return Metric(name, title, pool="ratio", scale=100.0, unit="0-100", lo=0.0, hi=100.0)


def _mean(name: str, title: str, unit: str = "0-100") -> Metric:
    return Metric(name, title, unit=unit, lo=0.0, hi=100.0 if unit == "0-100" else None)


METRICS = (
    _ratio("joint", "Joint"),
    _ratio("coverage", "Coverage"),
    _ratio("citation", "Citation"),
    _ratio("citation_precision", "citation precision"),
    _ratio("citation_recall", "citation recall"),
    Metric("words_per_bullet", "words per bullet", higher_is_better=False, unit="words"),
    _mean("coverage_macro", "Coverage (macro)"),
    _mean("citation_macro", "Citation (macro)"),
    _mean("joint_macro", "Joint (macro)"),
)
GROUP_KEYS = ("domain", "collection", "mode")
ALL = "all"  # the domain of rows pooling both domains
EXTRA = ("n_insights", "n_covered", "n_invalid_insights", "n_bad_links", "haystacks")
# The fields of a row of metrics/summhay.json (ResultRow.flat()), in order.
ROW_KEYS = (
    "benchmark",
    *GROUP_KEYS,
    "system",
    "setting",
    "judge",
    "model",
    *(m.name for m in METRICS),
    *Counts.model_fields,
    *Spend.model_fields,
    *EXTRA,
)


def haystack_label(hay: Haystack) -> str:
    """`id`, or `id=<recipe sha, 12>` for a derived haystack."""
    return (
        hay.haystack_id
        if hay.derived is None
        else f"{hay.haystack_id}={hay.derived.recipe_sha[:12]}"
    )


def keys(hay: Haystack, mode: str) -> dict[str, str]:
    return {"domain": hay.domain, "collection": hay.collection, "mode": mode}


def _insight(gen: Generation, sc: InsightScore) -> dict[str, Any]:
    return {
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


def _sums(scores: Sequence[InsightScore]) -> dict[str, tuple[float, float]]:
    ok = [s for s in scores if s.status == "ok"]
    covered = [s for s in ok if s.covered]
    return {
        "coverage": (fsum(s.coverage for s in ok), len(ok)),
        "joint": (fsum(s.joint for s in ok), len(ok)),
        "citation": (fsum(s.f1 or 0.0 for s in covered), len(covered)),
        "citation_precision": (fsum(s.precision or 0.0 for s in covered), len(covered)),
        "citation_recall": (fsum(s.recall or 0.0 for s in covered), len(covered)),
    }


def item_score(
    item: tuple[Haystack, Subtopic],
    gen: Generation,
    j: Judgement,
    modes: Sequence[Mode],
    partial_credit: float,
) -> Outcome:
    """One summary's insight scores in each scoring mode (one item score per mode)."""
    hay, sub = item
    gold = {i.insight_id: i.gold_docs for i in sub.insights}
    ids = [i.insight_id for i in sub.insights]
    bullets = extract_bullets(gen.text or "")
    out = []
    for mode in modes:
        try:
            scores = score_summary(bullets, j.verdicts, ids, gold, mode, partial_credit)
        except ValueError as e:
            raise DataError(str(e), item=j.generation_id, field="verdicts") from e
        p = pool(scores)
        macro = mode == "corrected" and p.coverage is not None and p.joint is not None
        out.append(
            ItemScore(
                gen.item_id,
                values={
                    "words_per_bullet": words_per_bullet(bullets),
                    "coverage_macro": p.coverage if macro else None,
                    "citation_macro": p.citation if macro else None,
                    "joint_macro": p.joint if macro else None,
                },
                parts=_sums(scores),
                keys=keys(hay, mode),
                detail={
                    "generation_id": gen.generation_id,
                    "n_invalid": p.n_invalid,
                    "n_bad_links": p.n_bad_links,
                    "insights": [_insight(gen, s) for s in scores],
                },
            )
        )
    invalid = sum(1 for v in j.verdicts if v.status == "invalid")
    return Scored(out, invalid_verdicts=invalid)


def row_extra(row: ResultRow, scores: Sequence[ItemScore]) -> None:
    """The insight counts behind the pooled scores."""
    row.extra["n_insights"] = int(fsum(s.parts["coverage"][1] for s in scores))
    row.extra["n_covered"] = int(fsum(s.parts["citation"][1] for s in scores))
    row.extra["n_invalid_insights"] = sum(s.detail["n_invalid"] for s in scores)
    row.extra["n_bad_links"] = sum(s.detail["n_bad_links"] for s in scores)


def haystacks(
    runs: Sequence[Run], items: Mapping[str, tuple[Haystack, Subtopic]]
) -> dict[tuple[str, ...], set[str]]:
    """(model, system, setting, domain, collection) -> the haystacks of its generations."""
    out: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for run in runs:
        for g in run.generations:
            if g.item_id in items:
                hay = items[g.item_id][0]
                key = (run.model, g.system, g.setting, hay.domain, hay.collection)
                out[key].add(haystack_label(hay))
    return out


def with_all_domains(
    rows: Sequence[ResultRow], scores: Mapping[RowKey, Sequence[ItemScore]], seed: int = 0
) -> tuple[list[ResultRow], dict[RowKey, list[ItemScore]]]:
    """The rows plus, for every (model, system, setting, judge, collection, mode) scored in
    more than one domain, a row pooling them (domain `all`)."""
    groups: dict[tuple[str, ...], list[ResultRow]] = defaultdict(list)
    for r in rows:
        groups[
            (r.model, r.system, r.setting, r.judge, r.keys["collection"], r.keys["mode"])
        ].append(r)
    out, by_key = list(rows), {k: list(v) for k, v in scores.items()}
    for group in groups.values():
        if len({r.keys["domain"] for r in group}) > 1:
            parts = sorted(group, key=lambda r: r.keys["domain"])
            row, joined = combine(METRICS, parts, [scores[r.key] for r in parts], domain=ALL)
            low, high = interval(METRICS[0], joined, seed)
            row.metrics |= {f"{METRICS[0].name}_ci_low": low, f"{METRICS[0].name}_ci_high": high}
            row_extra(row, joined)
            row.extra["haystacks"] = ",".join(
                sorted({h for r in parts for h in r.extra["haystacks"].split(",") if h})
            )
            out.append(row)
            by_key[row.key] = joined
    return out, by_key


def where(row: Mapping[str, Any]) -> str:
    """The row's haystacks in words: `news`, or `news@50k` for a derived collection."""
    c = row["collection"]
    return str(row["domain"]) if c == "released" else f"{row['domain']}@{c}"


def plot_group(row: Mapping[str, Any]) -> tuple[str, ...]:
    return (where(row), *(str(row[k]) for k in ("judge", "mode", "model", "system")))


def row_plots(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, ...], dict[str, Plot]]:
    """The plots logged with each run, per (domain, judge, mode, model entry, system):
    `plots/joint_by_setting.png` (the system's scores in each context setting) and, when the
    system has whole-haystack orderings, `plots/position_sensitivity.png` (Joint with the
    relevant documents at the top / middle / bottom of the context vs the default order, for
    every system of that domain, judge and mode that has them). Drawn when a run is logged."""
    from pipeline.benchmarks.summhay import plots

    by_group: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    by_view: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(plot_group(r), []).append(r)
        by_view.setdefault(plot_group(r)[:3], []).append(r)
    position: dict[tuple[str, ...], tuple[set[str], Plot]] = {}
    for view, vrows in by_view.items():
        domain, judge_name, mode = view
        systems = {t["system"] for t in plots.position_table(vrows)}
        title = f"SummHay position sensitivity ({domain}, {judge_name}, {mode})"
        position[view] = (systems, Plot(plots.position_png, (vrows, title)))
    out: dict[tuple[str, ...], dict[str, Plot]] = {}
    for group, grows in sorted(by_group.items()):
        domain, judge_name, mode, _, system = group
        title = f"SummHay {system} ({domain}, judge {judge_name}, {mode})"
        files = {"plots/joint_by_setting.png": Plot(plots.joint_by_setting, (grows, title))}
        systems, png = position[group[:3]]
        if group[4] in systems:
            files["plots/position_sensitivity.png"] = png
        out[group] = files
    return out
