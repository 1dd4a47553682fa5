"""The knob study: the grid's settings, chunking, retrieval (ties, reciprocal rank fusion), the
no-model baselines, the requests to a model, and the rows with their counts (by hand)."""

from __future__ import annotations

from statistics import fmean

import pytest

from pipeline.benchmarks.crud_rag import retrieval
from pipeline.benchmarks.crud_rag.benchmark import CrudRag
from pipeline.benchmarks.crud_rag.generation import extractive, lead, settings
from pipeline.benchmarks.crud_rag.metrics import text_metrics
from pipeline.benchmarks.crud_rag.params import Grid, Knobs
from pipeline.benchmarks.crud_rag.text import chunks, sentences
from pipeline.core import aggregation
from pipeline.core.benchmark import Run
from pipeline.core.config import OpenAIModel
from pipeline.core.errors import ConfigError
from pipeline.core.records import Generation
from tests.benchmarks.crud_rag.helpers import ctx

BENCH = CrudRag()


def test_the_default_grid_is_the_papers_one_factor_at_a_time_study() -> None:
    grid = Grid()
    names = [k.name for _, k in grid.settings()]
    assert names[0] == "bm25-c128-o0-k8"  # the base first
    assert len(names) == len(set(names)) == 12  # 4 chunk + 4 overlap + 4 top-k beyond the base
    assert ("chunk_size", Knobs(chunk_size=64, chunk_overlap=0, retriever="bm25", top_k=16)) in (
        grid.settings()
    )
    with pytest.raises(ValueError, match="listed twice"):
        Grid(top_k=[2, 2])


@pytest.mark.parametrize(
    ("grid", "named"),
    [
        ({"top_k": [-1]}, "top_k: -1"),
        ({"top_k": [0]}, "top_k: 0"),
        ({"chunk": [[0, 3]]}, "chunk: [0, 3]"),
        ({"chunk": [[64, 0]]}, "chunk: [64, 0]"),
        ({"chunk_overlap": [150]}, "chunk_overlap: 150"),
    ],
)
def test_a_grid_value_that_makes_an_invalid_setting_is_refused_at_check(
    grid: dict[str, object], named: str
) -> None:
    """Every derived setting is validated as Knobs (issue 26, point 1): not only the base."""
    with pytest.raises(ConfigError, match=r"crud_rag\.grid") as e:
        ctx(grid=grid)
    assert f"grid {named} gives an invalid setting" in str(e.value)
    with pytest.raises(ValueError, match="invalid setting"):
        Grid(**grid)  # type: ignore[arg-type]


def test_chunks_pack_sentences_and_carry_the_overlap() -> None:
    text = "甲乙。丙丁。戊己。庚辛。"
    assert sentences(text) == ["甲乙。", "丙丁。", "戊己。", "庚辛。"]
    count = len  # one token per character, to reason by hand
    assert chunks(text, 6, 0, count) == [["甲乙。", "丙丁。"], ["戊己。", "庚辛。"]]
    # overlap 3: each chunk starts with the previous chunk's last sentence that fits
    assert chunks(text, 6, 3, count) == [
        ["甲乙。", "丙丁。"], ["丙丁。", "戊己。"], ["戊己。", "庚辛。"]
    ]  # fmt: skip
    # a sentence longer than a chunk is cut by characters
    assert chunks("一二三四五六七八。", 4, 0, count) == [["一二三四"], ["五六七八"], ["。"]]


def test_top_breaks_ties_by_corpus_order_and_rrf_fuses_ranks() -> None:
    import numpy as np

    assert retrieval.top(np.array([1.0, 3.0, 3.0, 2.0]), 3) == [1, 2, 3]
    # chunk 7: 0.5/61 + 0.5/62; chunk 5: 0.5/62 + 0.5/61 (a tie: first seen first); chunk 9:
    # 0.5/63 only
    assert retrieval.rrf([[7, 5, 9], [5, 7]], 3) == [7, 5, 9]
    assert retrieval.rrf([[1, 2], [3, 1]], 1) == [1]


def test_baselines() -> None:
    ctx_text = "会议于周一举行。地铁全长二十公里。设站十五座。"
    assert lead(ctx_text, 10) == "会议于周一举行。"
    assert lead(ctx_text, 18) == "会议于周一举行。地铁全长二十公里。"
    # extractive: the sentences that match the query first
    assert extractive("地铁全长多少公里", ctx_text, 10).startswith("地铁全长二十公里。")
    assert extractive("地铁", "", 10) == ""


def test_offline_generations_cover_every_item_and_setting() -> None:
    c = ctx()
    data = BENCH.construct(c, None).records
    gens = BENCH.offline_generations(c, "lead", c.params.models["lead"], data)
    names = [s.name for s in settings(c.section)]
    oracle = sum(1 for i in data if i.oracle)
    assert len(gens) == oracle + len(data) * (len(names) - 1)
    g = next(g for g in gens if g.setting == "bm25-c16-o0-k2")
    assert g.meta["knobs"] == {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25",
                               "top_k": 2} and len(g.meta["chunks"]) == 2  # fmt: skip


def test_an_openai_model_gets_its_tasks_prompt_and_context() -> None:
    c = ctx()
    data = BENCH.construct(c, None).records
    spec = OpenAIModel(provider="openai", base_url="http://x/v1", model="m", api_key_env=None)
    planned = BENCH.plan_generations(c, "m", spec, data)
    hm = next(p for p in planned if p.item_id == "hallu_modified/hm-1" and p.setting != "oracle")
    content = hm.request.messages[0]["content"]
    assert "今年苹果产量比去年下降一半。" in content  # the continuation to correct
    assert "苹果节" in content  # the retrieved context
    assert hm.meta["prompt"].endswith("hallu_modified.txt")


def test_rows_by_hand_with_an_empty_output_invalid_and_counted() -> None:
    base = {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25", "top_k": 1}
    grid = {"oracle": True, "chunk": [], "chunk_overlap": [], "top_k": [], "base": base}
    c = ctx(tasks=["event_summary"], grid=grid)
    data = BENCH.construct(c, None).records
    gens = [
        Generation.offline("crud_rag", data[0].item_id, "m", "m", "oracle", "海滨市地铁开通。", {}),
        Generation.offline("crud_rag", data[1].item_id, "m", "m", "oracle", "", {}),
    ]
    assert gens[1].status == "error"
    js = BENCH.no_model_judge.judgements(
        c, "text", c.params.judges["text"], BENCH.items(data), gens[:1]
    )
    agg = aggregation.aggregate(BENCH, c, data, [Run("m", "text", gens, js)])
    (row,) = [r for r in agg.metrics["rows"] if r["setting"] == "oracle"]
    expected = text_metrics("海滨市地铁开通。", data[0].reference)
    assert row["bleu"] == pytest.approx(100 * expected["bleu"], abs=1e-3)
    assert row["rouge_l"] == pytest.approx(100 * fmean([expected["rouge_l"]]), abs=1e-3)
    counts = ("n_items", "n_scored", "n_invalid", "n_failed_generations", "n_failed_judgements")
    assert tuple(row[k] for k in counts) == (2, 1, 1, 0, 0)
    assert row["invalid_reasons"] == {"empty output": 1}
    # the length has no better direction: its unit in the results table, no arrow
    assert "| length (chars) |" in agg.report and "length (↑)" not in agg.report
    assert row["knob"] == "oracle" and agg.report.count("| oracle context |") == 1
    assert "crud_rag.png" in agg.figures


def test_embedding_similarity_is_a_verdict_with_its_model_and_a_row_mean() -> None:
    from dataclasses import replace

    import numpy as np

    from pipeline.core.types import LOCAL_EMBEDDING_MODEL
    from pipeline.testing.server import text_vector

    base = {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25", "top_k": 1}
    grid = {"oracle": True, "chunk": [], "chunk_overlap": [], "top_k": [], "base": base}
    c = ctx(tasks=["event_summary"], grid=grid)
    c = replace(c, embed=lambda texts: np.asarray([text_vector(t) for t in texts]))
    spec = c.params.judges["text"].model_copy(update={"embedding": "local"})
    data = BENCH.construct(c, None).records
    gens = [
        Generation.offline("crud_rag", data[0].item_id, "m", "m", "oracle", "海滨市地铁开通。", {}),
        Generation.offline("crud_rag", data[1].item_id, "m", "m", "oracle", data[1].reference, {}),
    ]
    js = BENCH.no_model_judge.judgements(c, "text", spec, BENCH.items(data), gens)
    sims = []
    for g, j in zip(gens, js, strict=True):
        (v,) = [v for v in j.verdicts if v.target_id == "embedding_sim"]
        assert v.raw == LOCAL_EMBEDDING_MODEL
        a, b = (
            np.asarray(text_vector(g.text or "")),
            np.asarray(text_vector(data[0 if g is gens[0] else 1].reference)),
        )
        assert float(v.label) == pytest.approx(float(a @ b))
        sims.append(float(v.label))
    assert sims[1] == pytest.approx(1.0)  # the reference itself
    agg = aggregation.aggregate(BENCH, c, data, [Run("m", "text", gens, js)])
    (row,) = [r for r in agg.metrics["rows"] if r["setting"] == "oracle"]
    assert row["embedding_sim"] == pytest.approx(100 * fmean(sims), abs=1e-3)
    assert row["embedding_model"] == LOCAL_EMBEDDING_MODEL
    assert "| embedding_sim |" in agg.report and LOCAL_EMBEDDING_MODEL in agg.report


def test_dense_and_hybrid_settings_retrieve_from_the_corpus() -> None:
    base = {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25", "top_k": 2}
    grid = {"base": base, "retriever": ["bm25", "dense", "hybrid"], "chunk": [],
            "chunk_overlap": [], "top_k": [], "oracle": False}  # fmt: skip
    c = ctx(tasks=["questanswer_1doc"], grid=grid)
    data = BENCH.construct(c, None).records
    gens = BENCH.offline_generations(c, "lead", c.params.models["lead"], data)
    by = {g.setting: g for g in gens}
    assert set(by) == {"bm25-c16-o0-k2", "dense-c16-o0-k2", "hybrid-c16-o0-k2"}
    for g in gens:
        assert len(g.meta["chunks"]) == 2 and g.status == "ok"
    # the metro question's own news item comes first for the lexical and the fused ranking
    assert "二十公里" in (by["bm25-c16-o0-k2"].text or "")
    index = retrieval.Index.build(BENCH.corpus(c), 16, 0)
    q = data[0].query
    bm, de = retrieval.top(index.bm25(q), 2), retrieval.top(index.dense(q), 2)
    assert by["hybrid-c16-o0-k2"].meta["chunks"] == retrieval.rrf([bm, de], 2)
    assert by["dense-c16-o0-k2"].meta["chunks"] == de
