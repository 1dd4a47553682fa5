"""The Long²RAG Markdown report and the "KPR by domain and category" plot."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.benchmark import ReportSection
from pipeline.core.markdown import fmt, need, table


def breakdown_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """KPR by domain, category and input length: one table each (n = questions scored)."""
    lines: list[str] = []
    for section, title in (
        ("by_domain", "domain"),
        ("by_category", "category"),
        ("by_length", "input length (cl100k tokens of the documents)"),
    ):
        groups: list[str] = []
        for r in rows:
            groups += [g for g in r[section] if g not in groups]
        if not groups:
            continue
        body = [
            [
                r["system"],
                r["setting"],
                r["judge"],
                *(
                    f"{fmt(r[section][g]['kpr'], 3)} (n={r[section][g]['n_scored']})"
                    if g in r[section]
                    else "-"
                    for g in groups
                ),
            ]
            for r in rows
        ]
        lines += [f"## KPR by {title}", "", *table(["System", "Setting", "Judge", *groups], body)]
    return lines


def agreement_lines(agreement: Sequence[dict[str, Any]]) -> list[str]:
    if not agreement:
        return []
    head = ["Model", "Judge A", "Judge B", "units", "kappa (entailed or not)"]
    body = [
        [
            a["model"],
            a["judge_a"],
            a["judge_b"],
            a["n_units_binary"],
            fmt(a["kappa_free_binary"], 3),
            fmt(a["kappa_free_three_way"], 3),
        ]
        for a in agreement
    ]
    return [
        "## Judge agreement (free-marginal kappa)",
        "",
        *table([*head, "kappa (yes/no/neutral)"], body),
    ]


# One figure per set of groups, reused for every row that has them: the axes, ticks and layout
# are drawn once, a row sets its bars' heights and its title (an aggregate draws 80 rows or more;
# building each figure anew took three times as long). The bytes are those of a fresh figure.
_FIGURES: dict[tuple[tuple[str, ...], ...], tuple[Any, list[Any], Any]] = {}
_LABEL_CHARS = 28


def _figure(key: tuple[tuple[str, ...], ...]) -> tuple[Any, list[Any], Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    bars = []
    for ax, name, labels in zip(axes, ("domain", "category"), key, strict=True):
        bars.append(ax.bar(range(len(labels)), [0.0] * len(labels), color="#4c72b0"))
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(
            [lb[:_LABEL_CHARS] for lb in labels], rotation=45, ha="right", fontsize=7
        )
        ax.set_ylim(0, 1)
        ax.set_title(f"KPR by {name}")
    # room below the axes for the longest slanted tick label (a fixed layout: tight_layout
    # measured every text of every figure)
    longest = max((len(lb[:_LABEL_CHARS]) for labels in key for lb in labels), default=0)
    fig.subplots_adjust(
        left=0.05, right=0.99, top=0.86, bottom=0.07 + 0.0085 * longest, wspace=0.12
    )
    return fig, bars, fig.suptitle("", fontsize=10)


def plot_png(row: Mapping[str, Any]) -> bytes:
    """A bar chart of one row's KPR by domain and by category, as PNG bytes (deterministic)."""
    sections = (row["by_domain"], row["by_category"])
    key = tuple(tuple(str(g) for g in groups) for groups in sections)
    if key not in _FIGURES:
        _FIGURES[key] = _figure(key)
    fig, bars, title = _FIGURES[key]
    for container, groups in zip(bars, sections, strict=True):
        for patch, g in zip(container.patches, groups, strict=True):
            patch.set_height(groups[g]["kpr"] or 0.0)
    title.set_text(f"{row['system']} / {row['setting']} / judge {row['judge']}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    return buf.getvalue()


def _with_breakdowns(row: dict[str, Any]) -> dict[str, Any]:
    """The row with `kpr_by_domain` / `kpr_by_category` (what the plot reads) taken from the
    aggregate's `by_domain` / `by_category`; a group without a KPR (every question excluded)
    has no bar."""
    out = dict(row)
    for dim in ("domain", "category"):
        groups = row.get(f"by_{dim}")
        if f"kpr_by_{dim}" not in row and isinstance(groups, dict):
            out[f"kpr_by_{dim}"] = {
                g: v["kpr"]
                for g, v in groups.items()
                if isinstance(v, dict) and v.get("kpr") is not None
            }
    return out


def report_section(rows: Sequence[dict[str, Any]], where: str) -> ReportSection:
    """Long²RAG's part of `lfbench report`: the KPR table and the breakdown plot."""
    from pipeline.benchmarks.long2rag.plots import kpr_breakdown

    body = []
    for n, r in enumerate(rows, 1):
        need(r, ("system", "setting", "judge", "kpr"), where, n)
        body.append(
            [
                r["system"],
                r["setting"],
                r["judge"],
                fmt(r["kpr"], 3),
                fmt(r.get("n_scored")),
                fmt(r.get("n_key_points")),
            ]
        )
    out = [f"Key Point Recall from {where}.", ""]
    out += table(["system", "setting", "judge", "KPR", "questions", "key points"], body)
    figs: list[tuple[str, bytes]] = []
    judges = list(dict.fromkeys(str(r["judge"]) for r in rows))
    try:
        for judge in judges:  # one figure per judge: its bars comparable, its colours few
            plotted = [_with_breakdowns(r) for r in rows if str(r["judge"]) == judge]
            title = f"Long²RAG KPR by domain and category, judge {judge}"
            figs.append((title, kpr_breakdown(plotted, title)))
    except ValueError as e:  # rows without breakdowns: the table stands alone
        out += [f"(no breakdown plot: {e})", ""]
    return ReportSection(out, figs)
