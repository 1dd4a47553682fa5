"""SummHay's result plots: Joint by context setting, and position sensitivity."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

# SummHay's whole-haystack orderings (README "Context settings"): default order, then the
# documents that hold the subtopic's insights moved to the top, the middle or the bottom.
POSITION_SETTINGS = (
    ("full", "Default order"),
    ("full-sort", "Top"),
    ("full-middle", "Middle"),
    ("full-rev-sort", "Bottom"),
)


def joint_by_setting(rows: Sequence[Mapping[str, Any]], title: str) -> bytes:
    """Bars of Joint (and Coverage, Citation) per context setting for the rows of one system
    (one domain, judge and scoring mode). Settings are drawn in sorted order."""
    from pipeline.plots import plt, png, style

    rows = sorted(rows, key=lambda r: str(r["setting"]))
    if not rows:
        raise ValueError("joint_by_setting: no rows")
    style()
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    names = [str(r["setting"]) for r in rows]
    x = list(range(len(rows)))
    w = 0.27
    for k, (metric, color) in enumerate(
        (("coverage", "#9ecae1"), ("citation", "#fdae6b"), ("joint", "#31a354"))
    ):
        vals = [float(r[metric]) if r[metric] is not None else 0.0 for r in rows]
        bars = ax.bar([i + (k - 1) * w for i in x], vals, w, label=metric.capitalize(), color=color)
        if metric == "joint":
            for b, v in zip(bars, vals, strict=True):
                ax.annotate(
                    f"{v:.1f}",
                    (b.get_x() + b.get_width() / 2, v),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("score (0-100)")
    ax.set_ylim(0, 118)  # room for the legend above the 0-100 scale
    ax.set_yticks(range(0, 101, 20))
    ax.set_title(title)
    ax.legend(loc="upper left", ncol=3, frameon=False)
    fig.tight_layout()
    return png(fig)


def position_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per system with the default-order `full`, Top (`full-sort`) and Bottom (`full-rev-sort`)
    rows: Joint per ordering (Middle too when present) and the paper's Position Sensitivity,
    max(|J_top - J_default|, |J_bottom - J_default|) (Table 3; the same definition as
    reports/summhay.md). Rows must share one domain, judge and mode."""
    by_sys: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["setting"] in dict(POSITION_SETTINGS) and r["joint"] is not None:
            by_sys[str(r["system"])][str(r["setting"])] = float(r["joint"])
    out = []
    for system in sorted(by_sys):
        j = by_sys[system]
        ends = [j[s] for s in ("full-sort", "full-rev-sort") if s in j]
        if "full" not in j or len(ends) < 2:
            continue
        out.append(
            {
                "system": system,
                **{label: j.get(s) for s, label in POSITION_SETTINGS},
                "sensitivity": max(abs(e - j["full"]) for e in ends),
            }
        )
    return out


def position_sensitivity(rows: Sequence[Mapping[str, Any]], title: str) -> bytes | None:
    """Joint per ordering of the whole haystack (default, relevant documents at Top / Middle /
    Bottom), one group of bars per system, with each system's Position Sensitivity. None when no
    system has the orderings."""
    from pipeline.plots import plt, png, style

    table = position_table(rows)
    if not table:
        return None
    style()
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    colors = ("#bdbdbd", "#3182bd", "#9e9ac8", "#e6550d")
    w = 0.2
    for k, ((_, label), color) in enumerate(zip(POSITION_SETTINGS, colors, strict=True)):
        xs, vals = [], []
        for i, t in enumerate(table):
            if t[label] is not None:
                xs.append(i + (k - 1.5) * w)
                vals.append(t[label])
        ax.bar(xs, vals, w, label=label, color=color)
    ax.set_xticks(
        range(len(table)),
        [f"{t['system']}\nsensitivity {t['sensitivity']:.1f}" for t in table],
    )
    ax.set_ylabel("Joint (0-100)")
    top = max(
        float(t[label]) for t in table for _, label in POSITION_SETTINGS if t[label] is not None
    )
    ax.set_ylim(0, top * 1.25 + 1)  # room for the legend
    ax.set_title(title)
    ax.legend(loc="upper left", ncol=4, frameon=False)
    fig.tight_layout()
    return png(fig)


def position_png(rows: Sequence[Mapping[str, Any]], title: str) -> bytes:
    """`position_sensitivity` of rows known to have the orderings."""
    drawn = position_sensitivity(rows, title)
    if drawn is None:
        raise ValueError(f"{title}: no system has the whole-haystack orderings")
    return drawn


_LENGTH = re.compile(r"^(\d+(?:\.\d+)?)k$")


def length_of(collection: str) -> float | None:
    """The target length (tokens) of a length-study collection (`50k` -> 50000), else None."""
    m = _LENGTH.match(collection)
    return float(m.group(1)) * 1000 if m else None


def length_scaling(views: Mapping[tuple[str, str, str], Sequence[Mapping[str, Any]]]) -> bytes:
    """Joint against haystack length (cl100k_base tokens, log scale): one panel per (domain,
    judge, mode) view of the length study's rows, one line per (system, setting). A run without
    a length study gets a panel that says so (the file is a stage output either way)."""
    from pipeline.plots import plt, png, style

    style()
    n = max(1, len(views))
    fig, axes = plt.subplots(1, n, figsize=(6.0 * n, 3.9), squeeze=False)
    if not views:
        ax = axes[0][0]
        ax.text(0.5, 0.5, "no length study in this run (summhay.lengths)", ha="center")
        ax.set_axis_off()
    for ax, ((domain, judge, mode), rows) in zip(axes[0], sorted(views.items()), strict=False):
        lines: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            length = length_of(str(r["collection"]))
            if length is not None and r["joint"] is not None:
                lines[(str(r["system"]), str(r["setting"]))].append((length, float(r["joint"])))
        ticks = sorted({x for v in lines.values() for x, _ in v})
        for (system, setting), pts in sorted(lines.items()):
            pts.sort()
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{system} / {setting}"
            )
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{x / 1000:g}k" for x in ticks])
        ax.minorticks_off()
        ax.set_xlabel("haystack length (cl100k_base tokens of documents)")
        ax.set_ylabel("Joint (0-100)")
        ax.set_title(f"SummHay Joint by length ({domain}, {judge}, {mode})", fontsize=9)
        ax.legend(loc="best", fontsize=7, frameon=False)
    fig.tight_layout()
    return png(fig)
