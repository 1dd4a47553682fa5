"""The join of items, generations and judgements (the stage layer's, pipeline/core/results.py),
as CRUD-RAG meets it: an orphan, a duplicate or a missing judgement and a generation of an
unknown item are each an error naming the file and line (CRUD-RAG's own rows used to skip a
generation of an unknown item without a word)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pipeline.benchmarks.crud_rag.benchmark import CrudRag
from pipeline.benchmarks.crud_rag.params import CrudParams
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core import aggregation
from pipeline.core.benchmark import Context, Run
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement
from tests.benchmarks.crud_rag.helpers import ctx

BENCH = CrudRag()
GRID = {
    "oracle": True,
    "chunk": [],
    "chunk_overlap": [],
    "top_k": [],
    "base": {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25", "top_k": 1},
}


def _case() -> tuple[Context[CrudParams], list[Item], list[Generation], list[Judgement]]:
    c = ctx(tasks=["event_summary"], grid=GRID)
    data = BENCH.construct(c, None).records
    gens = BENCH.offline_generations(c, "lead", c.params.models["lead"], data)
    js = BENCH.no_model_judge.judgements(
        c, "text", c.params.judges["text"], BENCH.items(data), gens
    )
    assert len(gens) == len(js) >= 3 and all(g.status == "ok" for g in gens)
    return c, data, gens, js


def _aggregate(gens: Sequence[Generation], js: Sequence[Judgement]) -> None:
    c, data, _, _ = _case()
    g_lines = [f"generations/crud_rag/lead.jsonl:{n}" for n in range(1, len(gens) + 1)]
    j_lines = [f"judgements/crud_rag/lead/text.jsonl:{n}" for n in range(1, len(js) + 1)]
    aggregation.aggregate(BENCH, c, data, [Run("lead", "text", gens, js, g_lines, j_lines)])


def test_the_complete_run_aggregates() -> None:
    _, _, gens, js = _case()
    _aggregate(gens, js)


def test_an_orphan_judgement_is_an_error_naming_its_line() -> None:
    _, _, gens, js = _case()
    with pytest.raises(DataError, match=r"judgements/crud_rag/lead/text\.jsonl:1\b.*orphan"):
        _aggregate(gens[1:], js)


def test_a_duplicate_judgement_is_an_error_naming_both_lines() -> None:
    _, _, gens, js = _case()
    n = len(js) + 1
    with pytest.raises(DataError, match=rf"text\.jsonl:{n}\b.*first at .*text\.jsonl:2\b"):
        _aggregate(gens, [*js, js[1]])


def test_a_missing_judgement_is_an_error_naming_the_generation() -> None:
    _, _, gens, js = _case()
    with pytest.raises(DataError, match=r"lead\.jsonl:3\b.*without a judgement"):
        _aggregate(gens, [j for k, j in enumerate(js) if k != 2])


def test_a_generation_of_an_unknown_item_is_an_error_naming_its_line() -> None:
    _, _, gens, js = _case()
    stray = gens[0].model_copy(update={"item_id": "event_summary/no-such-record"})
    with pytest.raises(DataError, match=r"lead\.jsonl:1\b.*not in the dataset"):
        _aggregate([stray, *gens[1:]], js[1:])
