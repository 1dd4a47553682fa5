"""Result plots (matplotlib, Agg): PNG bytes that are identical from one run to the next.

The shared helpers of the benchmarks' plots (each benchmark draws its own, in its package).
Logged as MLflow run artifacts (they render in the UI) and embedded in `lfbench report`.
Determinism: no timestamp or software string in the PNG metadata, a fixed DPI and size, and
inputs sorted before drawing, so re-running the aggregate does not change an artifact (their
digest is part of the run's fingerprint).
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

_DPI = 100

__all__ = ["plt", "png", "style"]


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (fixed DPI, no metadata that changes), closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def style() -> None:
    """The house style of result plots."""
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
