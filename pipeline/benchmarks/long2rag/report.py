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


def plot_png(row: Mapping[str, Any]) -> bytes:
    """A bar chart of one row's KPR by domain and by category, as PNG bytes (deterministic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [("domain", row["by_domain"]), ("category", row["by_category"])]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    for ax, (name, groups) in zip(axes, sections, strict=True):
        labels = list(groups)
        values = [groups[g]["kpr"] or 0.0 for g in labels]
        ax.bar(range(len(labels)), values, color="#4c72b0")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([lb[:28] for lb in labels], rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1)
        ax.set_title(f"KPR by {name}")
    fig.suptitle(f"{row['system']} / {row['setting']} / judge {row['judge']}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
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
