"""`lfbench compare` on two CRUD-RAG knob settings: the paired bootstrap over the rows' item
scores (the runs' items.jsonl artifacts), its point estimate the difference of the two rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.benchmarks.crud_rag.benchmark import CrudRag
from pipeline.core import aggregation
from pipeline.core.benchmark import Run
from pipeline.results.compare import MIN_PAIRED_ITEMS, bootstrap_declared
from tests.benchmarks.crud_rag.helpers import ctx

BENCH = CrudRag()


def test_two_knob_settings_compared_item_by_item(mirror: Path) -> None:
    base = {"chunk_size": 128, "chunk_overlap": 0, "retriever": "bm25", "top_k": 8}
    grid = {"oracle": False, "chunk": [], "chunk_overlap": [], "top_k": [2], "base": base}
    c = ctx(mirror, "crud_rag", source="released", tasks=["event_summary"], records=12,
            corpus="records", grid=grid)  # fmt: skip
    data = BENCH.construct(c, None).records
    gens = BENCH.offline_generations(c, "lead", c.params.models["lead"], data)
    js = BENCH.no_model_judge.judgements(
        c, "text", c.params.judges["text"], BENCH.items(data), gens
    )
    agg = aggregation.aggregate(BENCH, c, data, [Run("lead", "text", gens, js)])
    rows = {r["setting"]: r for r in agg.metrics["rows"]}
    items = {r.params["setting"]: r.artifacts["items.jsonl"] for r in agg.runs}
    a, b = "bm25-c128-o0-k8", "bm25-c128-o0-k2"
    assert rows[a]["n_scored"] == rows[b]["n_scored"] == 12 >= MIN_PAIRED_ITEMS
    tested, shared = bootstrap_declared(BENCH.metrics, items[a], items[b], resamples=500)
    assert shared == 12 and "length" in tested and "embedding_sim" not in tested
    for m in ("bleu", "rouge_l", "length"):
        assert tested[m]["delta"] == pytest.approx(rows[b][m] - rows[a][m], abs=1e-3)
    itself, _ = bootstrap_declared(BENCH.metrics, items[a], items[a], resamples=500)
    assert itself["bleu"]["delta"] == 0 and itself["bleu"]["ci_low"] == itself["bleu"]["ci_high"]
