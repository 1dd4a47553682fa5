"""Long²RAG's breakdown plot: deterministic PNG bytes from the rows."""

from __future__ import annotations

import pytest

from pipeline.benchmarks.long2rag import plots
from tests.test_report import L2R

PNG = b"\x89PNG\r\n\x1a\n"


def test_kpr_breakdown_plot_takes_long2rag_rows() -> None:
    png = plots.kpr_breakdown(L2R)
    assert png.startswith(PNG) and png == plots.kpr_breakdown(list(reversed(L2R)))
    with pytest.raises(ValueError, match="kpr_by_domain"):
        plots.kpr_breakdown([{"system": "m", "setting": "s", "judge": "j", "kpr": 0.1}])
