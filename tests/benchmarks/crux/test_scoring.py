"""CRUX end to end on the synthetic layout fixture, through the benchmark object (no stage
layer): contexts, the labels judge, rows by hand, an excluded query, invalid verdicts, agreement
with the labels, and Kendall tau between contexts and answers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.crux.aggregate import Answers, ContextScores, tau_rows, views
from pipeline.benchmarks.crux.benchmark import Crux, rated
from pipeline.benchmarks.crux.judging import target
from pipeline.benchmarks.crux.params import CruxParams
from pipeline.core import aggregation
from pipeline.core.benchmark import Context, Run, llm_capability
from pipeline.core.config import OpenAIJudge
from pipeline.core.errors import DataError
from pipeline.core.params import validate_params
from pipeline.core.prompts import load_prompt
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.stages.common import FileInputs

LAYOUT = Path(__file__).parent / "layout"
ROOT = Path(__file__).resolve().parents[3]
BENCH = Crux()


def ctx(**crux: Any) -> Context[CruxParams]:
    raw = {
        "models": {"ctx": {"provider": "crux-contexts", "retrievers": ["first-stage", "zstar"]}},
        "judges": {"labels": {"provider": "crux-labels"}},
        "crux": {
            "source": "layout",
            "domain": "synthetic",
            "models": ["ctx"],
            "judges": ["labels"],
            "scoring": {"cutoffs": ["zstar", 2, "budget"], "budget_tokens": 40,
                        "bootstrap_resamples": 200},
            "answers": {"generations": None},
            **crux,
        },
    }  # fmt: skip
    params = validate_params(raw, benchmarks=["crux"])
    section = params.section("crux", CruxParams)
    prompts = {k: load_prompt(v, ROOT) for k, v in section.prompts.model_dump().items()}
    return Context(params, section, prompts, FileInputs(LAYOUT.parent), "")


def built(c: Context[CruxParams]) -> tuple[list[Any], list[Generation], list[Judgement]]:
    dataset = BENCH.construct(c, None).records
    gens = BENCH.offline_generations(c, "ctx", c.params.models["ctx"], dataset)
    js = BENCH.no_model_judge.judgements(
        c, "labels", c.params.judges["labels"], BENCH.items(dataset), gens
    )
    return dataset, gens, js


def test_contexts_and_labels() -> None:
    c = ctx()
    _, gens, js = built(c)
    assert [(g.item_id, g.setting) for g in gens] == [
        ("q1", "first-stage"), ("q1", "zstar"), ("q2", "first-stage"), ("q2", "zstar")
    ]  # fmt: skip
    g = gens[0]
    # deep enough for every cut-off: |Z*| = 2, 2, and what fits the 40-token budget
    assert g.meta["ranking"][:2] == ["p4", "p1"]
    packed = g.meta["budget"]
    assert sum(t for _, t in packed) <= 40 and [p for p, _ in packed][:1] == ["p4"]
    assert gens[1].meta["ranking"][:2] == ["p1", "p2"]  # Z* first
    # the labels judge: a verdict per (ranked passage, sub-question), unrated passages 0
    labels = {v.target_id: v.label for v in js[0].verdicts}
    assert labels[target("p1", "q1")] == "5" and labels[target("p4", "q3")] == "0"
    assert len(js[0].verdicts) == 3 * len(g.meta["ranking"])
    assert js[2].verdicts == []  # q2: no sub-questions left


def _row(
    rows: list[dict[str, Any]], retriever: str, cutoff: str, judge: str = "labels"
) -> dict[str, Any]:
    (row,) = [
        r for r in rows if (r["retriever"], r["cutoff"], r["judge"]) == (retriever, cutoff, judge)
    ]
    return row


def test_rows_by_hand() -> None:
    c = ctx()
    dataset, gens, js = built(c)
    out = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "labels", gens, js)])
    rows = out.metrics["rows"]
    tok = {p.pid: p.tokens for p in dataset[0].passages}
    r = _row(rows, "first-stage", "2")
    # q1 only (q2 has no answerable sub-question: excluded and counted); context p4, p1:
    # p1 answers sub-questions 1 and 3 of 3
    assert (r["n_items"], r["n_scored"], r["n_excluded"], r["n_invalid"]) == (2, 1, 1, 0)
    assert r["excluded"] == {"no answerable sub-question": 1} and r["setting"] == "first-stage@2"
    assert r["coverage"] == pytest.approx(100 * 2 / 3, abs=1e-4)
    # alpha-nDCG@2: gains 0, 2 -> 2/log2(3); greedy ideal p1 (2), then p3 (0.5 + 1)
    assert r["alpha_ndcg"] == pytest.approx(
        100 * (2 / math.log2(3)) / (2 + 1.5 / math.log2(3)), abs=1e-4
    )
    # density against Z* = p1, p2 (coverage 1)
    dens = ((2 / 3) / (tok["p4"] + tok["p1"]) / (1 / (tok["p1"] + tok["p2"]))) ** 0.5
    assert r["density"] == pytest.approx(100 * dens, abs=1e-4)
    # ir-measures, binary qrels {p1, p2, p3}: recall 1/3; nDCG (1/log2(3)) / (1 + 1/log2(3) + 1/2)
    assert r["recall"] == pytest.approx(100 / 3, abs=1e-4)
    assert r["ndcg"] == pytest.approx(
        100 * (1 / math.log2(3)) / (1 + 1 / math.log2(3) + 0.5), abs=1e-4
    )
    # the reference row: Z* at |Z*| covers everything at density 1
    z = _row(rows, "zstar", "zstar")
    assert (z["coverage"], z["density"], z["passages"]) == (100.0, 100.0, 2.0)
    # rows in params order; one MLflow run per row; the report names the derived-or-not source
    assert [(r["retriever"], r["cutoff"]) for r in rows][:3] == [
        ("first-stage", "zstar"), ("first-stage", "2"), ("first-stage", "budget")
    ]  # fmt: skip
    assert len(out.runs) == len(rows) and out.metrics["source"] == "layout"
    assert out.summary["synthetic/labels"]["zstar@zstar"]["coverage"] == 100.0


def _rated(
    j: Judgement, flip: dict[str, str], invalid: set[str] = frozenset(), judge: str = "llm"
) -> Judgement:  # type: ignore[assignment]
    vs = [
        Verdict(target_id=v.target_id, label=flip.get(v.target_id, v.label),
                status="invalid" if v.target_id in invalid else "ok")
        for v in j.verdicts
    ]  # fmt: skip
    return j.model_copy(update={"judge": judge, "judge_prompt_sha": "x", "verdicts": vs})


def test_another_judge_scored_and_measured_against_the_labels() -> None:
    c = ctx()
    dataset, gens, js = built(c)
    # another judge: says p1 does not answer sub-question 1, and cannot rate p2 on sub-question 3
    other = [_rated(j, {target("p1", "q1"): "1"}, {target("p2", "q3")}) for j in js]
    runs = [Run("ctx", "labels", gens, js), Run("ctx", "llm", gens, other)]
    out = aggregation.aggregate(BENCH, c, dataset, runs)
    rows = out.metrics["rows"]
    r = _row(rows, "first-stage", "2", "llm")  # p4, p1: only sub-question 3 answered now
    assert r["coverage"] == pytest.approx(100 / 3, abs=1e-4) and r["n_invalid"] == 0
    # Z* = p1, p2 holds the invalid verdict: q1 left out of that row, counted, never rated 0
    z = _row(rows, "zstar", "zstar", "llm")
    assert (z["n_scored"], z["n_invalid"], z["coverage"]) == (0, 1, None)
    assert z["n_invalid_verdicts"] == 1
    (a,) = out.metrics["agreement"]
    assert (a["judge"], a["reference"], a["n_invalid"]) == ("llm", "labels", 1)
    # the pairs it rated (p1 in both contexts counts once): 3 of p4, 3 of p1, 2 of p2
    assert a["n"] == 8
    # answerable by the labels: p1 on 1 and 3, p2 on 2 (3 of 8); by the judge: 2 of 8
    assert a["answerable_labels"] == pytest.approx(3 / 8) and a[
        "answerable_judge"
    ] == pytest.approx(2 / 8)
    # kappa by hand: agreement 7/8; chance (2/8)(3/8) + (6/8)(5/8) = 36/64 -> (56 - 36) / (64 - 36)
    assert a["kappa"] == pytest.approx(20 / 28)
    assert a["kappa_ci_low"] <= 20 / 28 <= a["kappa_ci_high"]
    assert {run.metrics.get("kappa") for run in out.runs if run.judge == "llm"} == {a["kappa"]}


def test_the_judge_card_against_the_labels() -> None:
    """The card (pipeline/core/cards.py) of the judge above: the same kappa 20/28 with its
    interval, no linking (a rating names no bullet), and its cost per 1,000 ratings from the
    judgements' recorded usage: 0 without model calls, $0.002 a judgement when they cost it,
    unknown when a call came back without token usage."""
    from pipeline.core.records import Usage

    c = ctx()
    dataset, gens, js = built(c)
    other = [_rated(j, {target("p1", "q1"): "1"}, {target("p2", "q3")}) for j in js]
    n_verdicts = sum(len(j.verdicts) for j in other)

    def card_of(judged: list[Judgement]) -> dict[str, Any]:
        runs = [Run("ctx", "labels", gens, js), Run("ctx", "llm", gens, judged)]
        (a,) = aggregation.aggregate(BENCH, c, dataset, runs).metrics["agreement"]
        return dict(a["card"])

    free = card_of(other)
    assert (free["judge"], free["reference"], free["n"]) == ("llm", "labels", 8)
    assert free["kappa"] == pytest.approx(20 / 28)
    assert free["kappa_ci_low"] <= 20 / 28 <= free["kappa_ci_high"]
    assert free["pearson"] is not None and -1 <= free["pearson"] < 1
    assert free["linking_accuracy"] is None and free["n_linked"] is None
    assert (free["cost_status"], free["cost_per_1000"]) == ("free", 0.0)
    paid = [
        j.model_copy(update={"usage": Usage(input_tokens=50, requests=1, cost_usd=0.002)})
        for j in other
    ]
    card = card_of(paid)
    assert card["cost_status"] == "measured"
    assert card["cost_per_1000"] == pytest.approx(0.002 * len(other) / n_verdicts * 1000)
    blind = [j.model_copy(update={"usage": Usage(requests=1)}) for j in other]
    card = card_of(blind)
    assert (card["cost_status"], card["cost_per_1000"]) == ("unknown", None)
    assert f"{len(other)} judgements came without token usage" in card["cost_note"]


def test_an_invalid_verdict_inside_the_context_excludes_the_query() -> None:
    c = ctx()
    dataset, gens, js = built(c)
    other = [_rated(j, {}, {target("p1", "q2")}) for j in js]
    out = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "llm", gens, other)])
    r = _row(out.metrics["rows"], "first-stage", "2", "llm")
    assert (r["n_scored"], r["n_invalid"], r["n_excluded"], r["coverage"]) == (0, 1, 1, None)
    assert r["n_invalid_verdicts"] == 1


def test_each_cut_off_is_a_context_of_its_own() -> None:
    """The first-stage ranking of q1 is p4, p1: an invalid verdict on p1 leaves q1 out of the
    row at cut-off 2 only; at cut-off 1 (p4 alone) it is scored."""
    scoring = {"cutoffs": [1, 2], "budget_tokens": 40, "bootstrap_resamples": 20}
    c = ctx(scoring=scoring, answers={"generations": None, "cutoff": "2"})
    dataset, gens, js = built(c)
    other = [_rated(j, {}, {target("p1", "q2")}) for j in js]
    rows = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "llm", gens, other)]).metrics[
        "rows"
    ]
    one, two = _row(rows, "first-stage", "1", "llm"), _row(rows, "first-stage", "2", "llm")
    assert (one["n_scored"], one["n_invalid"], one["coverage"]) == (1, 0, 0.0)
    assert (two["n_scored"], two["n_invalid"], two["coverage"]) == (0, 1, None)
    assert one["n_excluded"] == two["n_excluded"] == 1  # q2, at every cut-off


def test_tau_by_hand() -> None:
    """Three retrievers whose context coverage ranks the queries' answers perfectly, and one
    summarizer that breaks the order: tau 1 across retrievers, less across pipelines."""
    contexts: ContextScores = {("news", "ctx", "labels"): {}}
    answers: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = {}
    for n, ret in enumerate(["r1", "r2", "r3"]):
        contexts[("news", "ctx", "labels")][ret] = {
            q: {"coverage": 0.2 * (n + 1), "alpha_ndcg": 0.1, "density": 0.5,
                "recall": 0.3 * n, "ndcg": 0.5}
            for q in ("a", "b", "c")
        }  # fmt: skip
        answers[("judge", ret, "s1")] = {q: (0.1 * (n + 1), 0.1) for q in ("a", "b", "c")}
        answers[("judge", ret, "s2")] = {q: (0.5 - 0.1 * n, 0.1) for q in ("a", "b", "c")}
    cx = ctx().section
    rows = tau_rows(cx, contexts, Answers(answers, {}, 0, []), seed=0)
    by = {(r["metric"], r["target"], r["level"]): r for r in rows}
    # retriever means of Cov(y): r1 (0.1+0.5)/2 = 0.3, r2 0.3, r3 0.3: a tie everywhere: NaN -> None
    assert by[("coverage", "cov_y", "retrievers")]["tau"] is None
    # pipelines: x = 0.2, 0.2, 0.4, 0.4, 0.6, 0.6; y = 0.1, 0.5, 0.2, 0.4, 0.3, 0.3
    from scipy.stats import kendalltau

    want = kendalltau([0.2, 0.2, 0.4, 0.4, 0.6, 0.6], [0.1, 0.5, 0.2, 0.4, 0.3, 0.3]).statistic
    assert by[("coverage", "cov_y", "pipelines")]["tau"] == pytest.approx(want)
    assert by[("coverage", "cov_y", "pipelines")]["n_points"] == 6
    # every query gives the same values: every resample does too, the interval is the point
    p = by[("coverage", "cov_y", "pipelines")]
    assert p["ci_low"] == pytest.approx(want) and p["ci_high"] == pytest.approx(want)
    # constant context metric (alpha_ndcg 0.1 everywhere): undefined, not 0
    assert by[("alpha_ndcg", "cov_y", "pipelines")]["tau"] is None


def test_tau_across_retrievers_with_an_interval() -> None:
    contexts: ContextScores = {("news", "ctx", "labels"): {}}
    answers: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = {}
    queries = [f"q{i}" for i in range(8)]
    for n, ret in enumerate(["r1", "r2", "r3", "r4"]):
        contexts[("news", "ctx", "labels")][ret] = {
            q: {"coverage": (n + i % 3) / 10, "alpha_ndcg": n / 10,
                "density": 1 - n / 10, "recall": 0.1, "ndcg": 0.1}
            for i, q in enumerate(queries)
        }  # fmt: skip
        answers[("judge", ret, "s1")] = {
            q: ((n + (i * 7) % 5) / 10, 0.2) for i, q in enumerate(queries)
        }
    rows = tau_rows(ctx().section, contexts, Answers(answers, {}, 0, []), seed=0)
    by = {(r["metric"], r["target"], r["level"]): r for r in rows}
    r = by[("coverage", "cov_y", "retrievers")]
    assert r["tau"] == 1.0 and r["n_points"] == 4 and r["n_queries"] == 8
    assert r["ci_low"] is not None and r["ci_low"] <= r["tau"] <= r["ci_high"]
    assert by[("density", "cov_y", "retrievers")]["tau"] == -1.0


def test_views_and_the_excluded_count_in_the_report() -> None:
    c = ctx()
    dataset, gens, js = built(c)
    assert set(views(dataset)) == {"q1", "q2"}
    out = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "labels", gens, js)])
    assert "2 queries (1 with no answerable sub-question, excluded)" in out.report
    assert "No answers configured" in out.report


def test_judges_other_than_the_labels_rate_a_sample_and_the_rest_is_counted() -> None:
    c = ctx(judge_sample=1)
    dataset, gens, js = built(c)
    items = BENCH.items(dataset)
    assert [rated(c, items[q]) for q in ("q1", "q2")] == [True, False]
    assert BENCH.coverage.cases(c, items["q2"], gens[2]) == []
    spec = OpenAIJudge(provider="openai", base_url="http://127.0.0.1:9/v1", model="m")
    tasks = llm_capability(BENCH).tasks(c, spec, items, gens)
    assert {t.generation.item_id for t in tasks} == {"q1"}
    # a judge that rated only the first-stage contexts: the Z* contexts are unjudged, counted
    # (q2's too: a context no judge rated is unjudged before its query is looked at)
    other = [_rated(j, {}) for j in js if j.setting == "first-stage"]
    out = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "llm", gens, other)])
    z = _row(out.metrics["rows"], "zstar", "zstar", "llm")
    assert (z["n_scored"], z["n_unjudged"], z["n_excluded"], z["coverage"]) == (0, 2, 0, None)
    # the local judge's way: a judgement without verdicts for a query outside the sample
    empty = [_rated(j, {}).model_copy(update={"verdicts": []}) for j in js if j.setting == "zstar"]
    out = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "llm", gens, other + empty)])
    z = _row(out.metrics["rows"], "zstar", "zstar", "llm")
    assert (z["n_items"], z["n_unjudged"], z["n_excluded"]) == (2, 1, 1)
    # a failed context (no ranking) is counted as failed, not scored (and not judged)
    broken = [g.model_copy(update={"status": "error", "text": None}) for g in gens]
    out = aggregation.aggregate(BENCH, c, dataset, [Run("ctx", "labels", broken, [])])
    r = _row(out.metrics["rows"], "first-stage", "2")
    assert (r["n_failed_generations"], r["n_scored"], r["n_items"]) == (2, 0, 2)


def test_computed_retrievers_bm25_and_dense_rank_every_passage() -> None:
    from pipeline.benchmarks.crux.contexts import rank

    c = ctx()
    dataset = BENCH.construct(c, None).records
    view = BENCH.items(dataset)["q1"]
    for retriever in ("bm25", "dense"):
        order = rank(view, retriever)
        assert sorted(order) == sorted(view.passages) and order == rank(view, retriever)
    # the query is about the harbour festival: the unrelated football passage ranks last by BM25
    assert rank(view, "bm25")[-1] in {"p5", "p6"}
    with pytest.raises(DataError, match="no ranking by 'vector'") as e:
        rank(view, "vector")
    assert (e.value.item, e.value.field) == ("q1", "rankings.vector")
