"""CRUX on the result model's join: an orphan or duplicate judgement, a context of an unknown
query, and a verdict on an unknown passage or sub-question are errors naming the file and line;
a context without a judgement is counted (`n_unjudged`: judges rate a sample)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.core import aggregation
from pipeline.core.benchmark import Run
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement, Verdict
from tests.benchmarks.crux.test_scoring import BENCH, _row, built, ctx

GENS = "generations/crux/ctx.jsonl"
JUDGED = "judgements/crux/ctx/labels.jsonl"


def _run(gens: list[Generation], js: list[Judgement]) -> Run:
    return Run(
        "ctx",
        "labels",
        gens,
        js,
        [f"{GENS}:{n}" for n in range(1, len(gens) + 1)],
        [f"{JUDGED}:{n}" for n in range(1, len(js) + 1)],
    )


def _target(j: Judgement, target: str) -> Judgement:
    first = j.verdicts[0]
    return j.model_copy(update={"verdicts": [Verdict(target_id=target, label=first.label)]})


Case = Callable[[list[Generation], list[Judgement]], tuple[list[Generation], list[Judgement]]]
CASES: list[tuple[str, Case, str, str, str]] = [
    (
        "orphan judgement",
        lambda g, j: (g[1:], j),  # q1's first-stage context is not in the generations file
        f"{JUDGED}:1",
        "an orphan",
        "generation_id",
    ),
    ("duplicate judgement", lambda g, j: (g, [*j, j[1]]), f"{JUDGED}:5", "two judgements",
     "generation_id"),
    (
        "context of an unknown query",
        lambda g, j: ([*g, g[0].model_copy(update={"item_id": "q9"})], j),
        f"{GENS}:5",
        "not in the dataset",
        "item_id",
    ),
    (
        "verdict on an unknown passage",
        lambda g, j: (g, [_target(j[0], "p99#q1"), *j[1:]]),
        f"{JUDGED}:1",
        "unknown passage",
        "verdicts.p99#q1",
    ),
    (
        "verdict on an unknown sub-question",
        lambda g, j: (g, [j[0], _target(j[1], "p1#q9"), *j[2:]]),
        f"{JUDGED}:2",
        "unknown sub-question",
        "verdicts.p1#q9",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "change", "where", "message", "field"), CASES, ids=[c[0] for c in CASES]
)
def test_join_errors_name_the_file_and_line(
    case: str, change: Case, where: str, message: str, field: str
) -> None:
    c = ctx()
    dataset, gens, js = built(c)
    gens, js = change(list(gens), list(js))
    with pytest.raises(DataError, match=message) as e:
        aggregation.aggregate(BENCH, c, dataset, [_run(gens, js)])
    assert (e.value.file, e.value.field) == (where, field)


def test_a_context_without_a_judgement_is_counted_unjudged() -> None:
    c = ctx()
    dataset, gens, js = built(c)
    rows: Any = aggregation.aggregate(BENCH, c, dataset, [_run(gens, js[1:])]).metrics["rows"]
    r = _row(rows, "first-stage", "2")
    assert (r["n_items"], r["n_scored"], r["n_unjudged"], r["n_excluded"]) == (2, 0, 1, 1)
    assert _row(rows, "zstar", "2")["n_scored"] == 1


def test_compare_pairs_two_contexts_by_query() -> None:
    """`lfbench compare`'s paired bootstrap on two CRUX contexts (their rows' items.jsonl): the
    point estimates are the rows' values; a context against itself differs by 0."""
    from pipeline.benchmarks.crux.schema import Collection, Passage, Query, SubQuestion
    from pipeline.results.compare import bootstrap_declared

    c = ctx()
    passages = [Passage(pid=f"p{n}", text=f"passage {n}", tokens=10 + n) for n in range(4)]
    queries = [
        Query(
            item_id=f"q{n}",
            query=f"query {n}",
            domain="synthetic",
            subquestions=[SubQuestion(qid=f"q{n}.{i}", text=f"sub {i}") for i in range(2)],
            ratings={"p0": [5, 0], "p1": [0, 5 if n % 3 else 2], "p2": [3, 0]},
            zstar=["p0", "p1"],
            rankings={"first-stage": ["p3", "p2", "p1", "p0"] if n % 2 else ["p1", "p0"]},
        )
        for n in range(12)
    ]
    dataset = [Collection(collection_id="c", domain="synthetic", source="x", passages=passages,
                          queries=queries)]  # fmt: skip
    gens = BENCH.offline_generations(c, "ctx", c.params.models["ctx"], dataset)
    js = BENCH.no_model_judge.judgements(
        c, "labels", c.params.judges["labels"], BENCH.items(dataset), gens
    )
    out = aggregation.aggregate(BENCH, c, dataset, [_run(gens, js)])
    runs = {r.params["setting"]: r for r in out.runs}
    rows = {r["setting"]: r for r in out.metrics["rows"]}
    a, b = runs["first-stage@2"].artifacts["items.jsonl"], runs["zstar@2"].artifacts["items.jsonl"]
    assert isinstance(a, list) and isinstance(b, list)
    tested, shared = bootstrap_declared(BENCH.metrics, a, b, resamples=200)
    assert shared == 12 and set(tested) == {"coverage", "alpha_ndcg", "density", "recall", "ndcg"}
    for name, res in tested.items():
        assert res["a"] == pytest.approx(rows["first-stage@2"][name], abs=1e-3)
        assert res["b"] == pytest.approx(rows["zstar@2"][name], abs=1e-3)
    assert tested["coverage"]["delta"] > 0  # Z* covers what the first-stage ranking misses
    same, _ = bootstrap_declared(BENCH.metrics, a, a, resamples=200)
    assert {(r["delta"], r["ci_low"], r["ci_high"]) for r in same.values()} == {(0.0, 0.0, 0.0)}
