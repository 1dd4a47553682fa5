"""Result plots (matplotlib, Agg): PNG bytes that are identical from one run to the next.

Logged as MLflow run artifacts (they render in the UI) and embedded in `lfbench report`.
Determinism: no timestamp or software string in the PNG metadata, a fixed DPI and size, and
inputs sorted before drawing, so re-running the aggregate does not change an artifact (their
digest is part of the run's fingerprint).
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

_DPI = 100
# SummHay's whole-haystack orderings (README "Context settings"): default order, then the
# documents that hold the subtopic's insights moved to the top, the middle or the bottom.
POSITION_SETTINGS = (
    ("full", "Default order"),
    ("full-sort", "Top"),
    ("full-middle", "Middle"),
    ("full-rev-sort", "Bottom"),
)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _style() -> None:
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})


def joint_by_setting(rows: Sequence[Mapping[str, Any]], title: str) -> bytes:
    """Bars of Joint (and Coverage, Citation) per context setting for the rows of one system
    (one domain, judge and scoring mode). Settings are drawn in sorted order."""
    rows = sorted(rows, key=lambda r: str(r["setting"]))
    if not rows:
        raise ValueError("joint_by_setting: no rows")
    _style()
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
    return _png(fig)


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
    table = position_table(rows)
    if not table:
        return None
    _style()
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
    return _png(fig)


def _breakdown(row: Mapping[str, Any], dim: str) -> Mapping[str, Any]:
    """A row's KPR per value of `dim` ("domain" or "category"): `kpr_by_<dim>` or
    `breakdowns[<dim>]`, each {value: kpr} or {value: {"kpr": ...}}."""
    found = row.get(f"kpr_by_{dim}")
    if found is None:
        found = (row.get("breakdowns") or {}).get(dim)
    if not isinstance(found, Mapping):
        raise ValueError(
            f"long2rag row {row.get('system')!r}/{row.get('setting')!r}: field "
            f"'kpr_by_{dim}' (or 'breakdowns.{dim}') missing or not an object"
        )
    return found


def kpr_breakdown(rows: Sequence[Mapping[str, Any]], title: str = "Long²RAG KPR") -> bytes:
    """Long²RAG Key Point Recall per domain (left) and per question category (right), one bar
    colour per (system, setting, judge) row."""
    if not rows:
        raise ValueError("kpr_breakdown: no rows")
    rows = sorted(rows, key=lambda r: (str(r["system"]), str(r["setting"]), str(r["judge"])))
    _style()
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0), sharey=True)
    for ax, dim in zip(axes, ("domain", "category"), strict=True):
        per_row = []
        for r in rows:
            b = _breakdown(r, dim)
            per_row.append(
                {str(k): float(v["kpr"] if isinstance(v, Mapping) else v) for k, v in b.items()}
            )
        keys = sorted({k for b in per_row for k in b})
        w = 0.8 / len(rows)
        for n, (r, b) in enumerate(zip(rows, per_row, strict=True)):
            xs = [i - 0.4 + (n + 0.5) * w for i, k in enumerate(keys) if k in b]
            ax.bar(
                xs,
                [b[k] for k in keys if k in b],
                w,
                label=f"{r['system']} / {r['setting']} / {r['judge']}",
            )
        ax.set_xticks(range(len(keys)), keys, rotation=40, ha="right")
        ax.set_title(f"by {dim}")
    axes[0].set_ylabel("KPR")
    axes[1].legend(loc="upper right", fontsize=7, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return _png(fig)
