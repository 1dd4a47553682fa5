"""Long²RAG's result plots: Key Point Recall by domain and by category."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.plots import plt, png, style


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
    style()
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
    return png(fig)
