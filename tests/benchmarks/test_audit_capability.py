"""The audit capability of SummHay and Long²RAG: the label scale (what each label is worth in the
metric), what the judge saw on one verdict, and SummHay's released labels as an audit."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.benchmarks.long2rag.schema import KeyPoint, L2Document, Question
from pipeline.benchmarks.summhay.agreement import Label, Sample
from pipeline.core import registry
from pipeline.core.errors import DataError
from pipeline.core.params import load_params
from pipeline.core.records import Generation
from pipeline.data.haystacks import Insight, Subtopic
from pipeline.results.audit import _context
from tests.conftest import ROOT


def _ctx(name: str) -> tuple[Any, Any]:
    bench = registry.get(name)
    return bench, _context(bench, load_params(ROOT / "params.yaml", [name]), ROOT)


def _gen(item: str, text: str) -> Generation:
    return Generation(
        benchmark="x", item_id=item, model="m", system="s", setting="o", status="ok", text=text
    )


def test_summhay_shows_the_insight_and_the_numbered_summary() -> None:
    bench, ctx = _ctx("summhay")
    assert bench.audit is not None
    scale = bench.audit.scale(ctx)
    assert scale.name == "coverage" and scale.metric == "coverage" and not scale.per_item
    assert dict(scale.values) == {
        "FULL_COVERAGE": 100.0,
        "PARTIAL_COVERAGE": ctx.section.scoring.partial_credit,
        "NO_COVERAGE": 0.0,
    }
    sub = Subtopic(
        item_id="news1/a",
        subtopic_id="a",
        name="",
        subtopic="",
        query="",
        insights=[Insight(insight_id="i1", name="", text="Stores close in 2026.", gold_docs=[1])],
        retriever_scores={},
    )
    view = bench.audit.view(ctx, sub, _gen("news1/a", "- one [1]\n\n- two [2]"), "i1")
    assert view == {"insight": "Stores close in 2026.", "summary": "1. - one [1]\n2. - two [2]"}
    with pytest.raises(DataError, match="no such insight"):
        bench.audit.view(ctx, sub, _gen("news1/a", "x"), "i9")


def test_long2rag_shows_the_key_point_against_the_answer_and_weighs_by_question() -> None:
    bench, ctx = _ctx("long2rag")
    assert bench.audit is not None
    scale = bench.audit.scale(ctx)
    assert (scale.name, scale.metric, scale.per_item) == ("entailment", "kpr", True)
    neutral = 1.0 if ctx.section.scoring.neutral == "entailed" else 0.0
    assert dict(scale.values) == {"yes": 1.0, "neutral": neutral, "no": 0.0}
    q = Question(
        item_id="q1",
        question="What happened?",
        domain="d",
        category="c",
        documents=[L2Document(doc_id="d1", text="text")],
        key_points=[KeyPoint(kp_id="kp1", text="A store closed.", doc_id="d1")],
    )
    view = bench.audit.view(ctx, q, _gen("q1", "An answer."), "kp1")
    assert view == {
        "question": "What happened?",
        "key point": "A store closed.",
        "answer": "An answer.",
    }


def test_summhay_released_labels_name_the_system_setting_and_domain() -> None:
    bench, ctx = _ctx("summhay")
    assert bench.audit is not None
    sample = Sample(
        index=3,
        sample_id="3:sub:summary_subtopic_oracle_gpt-4o",
        subtopic_id="sub",
        summkey="summary_subtopic_oracle_gpt-4o",
        domain="news",
        summary=["- a"],
        insights=[("i1", "x"), ("i2", "y")],
        human={"i1": Label("FULL", 1), "i2": Label("NO", None)},
        predictions={},
    )
    judged = {
        "local": {sample.sample_id: {"i1": Label("PARTIAL", 1), "i2": None}},
        "llm": {},  # an LLM judge scores only the first N summaries: none of this one
    }
    got = bench.audit.released(ctx, [sample], judged)
    assert [(x.judge, x.system, x.setting, dict(x.keys), x.unit) for x in got] == [
        ("local", "gpt-4o", "oracle", {"domain": "news"}, f"{sample.sample_id}#i1"),
        ("local", "gpt-4o", "oracle", {"domain": "news"}, f"{sample.sample_id}#i2"),
    ]
    assert [(x.judge_label, x.human_label) for x in got] == [
        ("PARTIAL_COVERAGE", "FULL_COVERAGE"),
        (None, "NO_COVERAGE"),
    ]


def test_crux_shows_the_passage_against_the_sub_question_and_gives_kappa_only() -> None:
    from pipeline.benchmarks.crux.schema import Passage, Query, QueryView, SubQuestion
    from pipeline.results.audit import Pairs, Scale, audit_numbers

    bench, ctx = _ctx("crux")
    assert bench.audit is not None
    scale = bench.audit.scale(ctx)
    assert scale.metric is None and scale.labels == ("5", "4", "3", "2", "1", "0")
    view = QueryView(
        Query(
            item_id="c/q1",
            query="q",
            domain="d",
            subquestions=[SubQuestion(qid="s1", text="Who closed stores?")],
            ratings={"p1": [5]},
            zstar=["p1"],
        ),
        {"p1": Passage(pid="p1", text="Foot Locker closed stores.", tokens=5)},
    )
    shown = bench.audit.view(ctx, view, _gen("c/q1", ""), "p1#s1")
    assert shown == {"sub-question": "Who closed stores?", "passage": "Foot Locker closed stores."}
    with pytest.raises(DataError, match="no such passage or sub-question"):
        bench.audit.view(ctx, view, _gen("c/q1", ""), "p9#s1")
    # no metric is a mean of the ratings: the audit gives kappa, no corrected score
    pairs = Pairs([5.0, 3.0, 0.0], None, ["5", "3", "0"], ["5", "2", "0"], None)
    numbers = audit_numbers(Scale.of(scale), pairs, n_resamples=50)
    assert numbers["audit.exact_agreement"] == pytest.approx(2 / 3)
    assert not any(k.endswith("_ppi") or k.startswith("audit.human") for k in numbers)


def test_a_crux_row_holds_the_pairs_of_the_passages_in_its_cut_off() -> None:
    from pipeline.benchmarks.crux.schema import Passage, Query, QueryView, SubQuestion

    bench, ctx = _ctx("crux")
    assert bench.audit is not None
    passages = {p: Passage(pid=p, text=f"text {p}", tokens=5) for p in ("p1", "p2", "p3")}
    view = QueryView(
        Query(
            item_id="c/q1",
            query="q",
            domain="d",
            subquestions=[SubQuestion(qid="s1", text="?")],
            ratings={"p1": [5]},
            zstar=["p1"],
        ),
        passages,
    )
    gen = _gen("c/q1", "").model_copy(
        update={"setting": "bm25", "meta": {"ranking": ["p3", "p1", "p2"]}}
    )
    held = {
        (setting, pid): bench.audit.in_row(ctx, setting, view, gen, f"{pid}#s1")
        for setting in ("bm25@2", "bm25@zstar", "vector@2")
        for pid in ("p1", "p2", "p3")
    }
    assert [k for k, v in held.items() if v] == [
        ("bm25@2", "p1"),
        ("bm25@2", "p3"),
        ("bm25@zstar", "p3"),
    ]
    # the other benchmarks: a row's setting is its generations'
    summhay, sctx = _ctx("summhay")
    assert summhay.audit is not None
    assert summhay.audit.in_row(sctx, "o", None, _gen("x", ""), "i1")
    assert not summhay.audit.in_row(sctx, "bm25", None, _gen("x", ""), "i1")
