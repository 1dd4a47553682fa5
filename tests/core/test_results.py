"""The result model (pipeline/core/results.py) on hand-computed cases: pooling, the join of
items, generations and judgements, the counters, combined rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.core import aggregation
from pipeline.core.benchmark import Run
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement, Usage
from pipeline.core.results import (
    Excluded,
    Invalid,
    ItemScore,
    Metric,
    Scored,
    combine,
    join,
    pool,
    score_rows,
)
from tests.join_faults import FAULTS, faulty_run

MEAN = Metric("m", digits=None)
RATIO = Metric("r", pool="ratio", scale=100.0, digits=4)


def _gen(item: str, status: str = "ok", cost: float = 0.0) -> Generation:
    return Generation(
        benchmark="b",
        item_id=item,
        model="m",
        system="s",
        setting="x",
        status=status,  # type: ignore[arg-type]
        text="t" if status == "ok" else None,
        usage=Usage(input_tokens=10, output_tokens=2, cost_usd=cost),
    )


def _judgement(g: Generation, status: str = "ok") -> Judgement:
    return Judgement.of("b", g, "j", "sha", status, [], usage=Usage(input_tokens=5))


def test_pool_mean_and_ratio_by_hand() -> None:
    scores = [
        ItemScore("a", values={"m": 1.0}, parts={"r": (1.0, 2.0)}),
        ItemScore("b", values={"m": 0.0}, parts={"r": (0.0, 0.0)}),  # no unit counts for r
        ItemScore("c", values={"m": None}, parts={"r": (2.0, 2.0)}),  # m undefined for c
    ]
    # mean over the items defining it: (1 + 0) / 2; ratio of sums: 100 x (1 + 0 + 2) / (2 + 0 + 2)
    assert pool(MEAN, scores) == 0.5
    assert pool(RATIO, scores) == 75.0
    # a ratio is not the mean of the item ratios (50, -, 100 -> 75 here too; 1/2 and 1/8 not)
    uneven = [ItemScore("a", parts={"r": (1.0, 2.0)}), ItemScore("b", parts={"r": (1.0, 8.0)})]
    assert pool(RATIO, uneven) == 20.0  # 100 x 2 / 10, while the mean of ratios is 31.25
    assert pool(MEAN, []) is None and pool(RATIO, [ItemScore("a", parts={"r": (0, 0)})]) is None


ITEMS = {"i1": "one", "i2": "two", "i3": "three"}


@pytest.mark.parametrize(
    ("fault", "where", "message"),
    [
        ("orphan", "j.jsonl:3", "orphan"),
        ("duplicate", "j.jsonl:3", "two judgements of one generation"),
        ("missing", "g.jsonl:2", "without a judgement"),
        ("unknown item", "g.jsonl:4", "not in the dataset"),
        ("duplicate generation", "g.jsonl:4", "the same generation twice"),
        ("judged failure", "j.jsonl:3", "judgement of a failed generation"),
    ],
)
def test_join_errors_name_file_and_line(fault: str, where: str, message: str) -> None:
    gens = [_gen("i1"), _gen("i2"), _gen("i3", status="error")]
    js = [_judgement(gens[0]), _judgement(gens[1])]
    if fault == "orphan":
        js.append(_judgement(_gen("i3")).model_copy(update={"generation_id": "zz|x|s|0"}))
    elif fault == "duplicate":
        js.append(js[1])
    elif fault == "missing":
        js = js[:1]
    elif fault == "unknown item":
        gens.append(_gen("i9"))
    elif fault == "duplicate generation":
        gens.append(gens[0])
    else:
        js.append(Judgement.of("b", gens[2], "j", "sha", "ok", []))
    gl = [f"g.jsonl:{n}" for n in range(1, len(gens) + 1)]
    jl = [f"j.jsonl:{n}" for n in range(1, len(js) + 1)]
    with pytest.raises(DataError, match=message) as e:
        join(ITEMS, gens, js, generation_lines=gl, judgement_lines=jl)
    assert where in str(e.value)


def test_counters_and_spend_by_hand() -> None:
    """i1 scored (1.0), i2 excluded by the benchmark, i3 invalid, i4 a failed generation, i5 a
    failed judge call, i6 not judged (counted by policy)."""
    items = {f"i{n}": n for n in range(1, 7)}
    gens = [_gen(i, cost=0.5) for i in ("i1", "i2", "i3", "i5", "i6")] + [_gen("i4", "error")]
    js = [_judgement(g) for g in gens[:3]] + [_judgement(gens[3], "error")]

    def score(item: int, g: Generation, j: Judgement) -> Any:
        if item == 1:
            return Scored([ItemScore("i1", values={"m": 1.0})], invalid_verdicts=1)
        if item == 2:
            return Excluded("no reference")
        return Invalid("unusable", invalid_verdicts=3)

    out = score_rows("b", [MEAN], [Run("m", "j", gens, js)], items, score, unjudged="count")
    (row,) = out.rows
    c = row.counts
    assert (c.n_items, c.n_scored, c.n_excluded, c.n_invalid) == (6, 1, 1, 1)
    assert (c.n_failed_generations, c.n_failed_judgements, c.n_unjudged) == (1, 1, 1)
    assert c.n_invalid_verdicts == 1 + 3 and c.excluded == {"no reference": 1}
    assert row.metrics == {"m": 1.0}
    # every generation's usage (6 x 10 in, 6 x 2 out, 5 x $0.5) and every judgement's (4 x 5 in)
    assert (row.spend.input_tokens, row.spend.output_tokens) == (80, 12)
    assert row.spend.cost_usd == 2.5
    with pytest.raises(DataError, match="without a judgement"):
        score_rows("b", [MEAN], [Run("m", "j", gens, js)], items, score)


def test_a_failed_generation_the_benchmark_counts_as_invalid_with_its_reason() -> None:
    """`failed_outcome`: i2's empty output is an invalid item (its reason counted, in
    `invalid_reasons` like a judge's), i3's failed call stays a failed generation."""
    items = {"i1": 1, "i2": 2, "i3": 3}
    gens = [_gen("i1"), _gen("i2", "error"), _gen("i3", "error")]
    js = [_judgement(gens[0])]

    def failed(item: int, g: Generation) -> Any:
        return Invalid("empty output") if item == 2 else None

    out = score_rows(
        "b", [MEAN], [Run("m", "j", gens, js)], items,
        lambda *_: Invalid("unusable"), failed_outcome=failed,
    )  # fmt: skip
    c = out.rows[0].counts
    assert (c.n_items, c.n_scored, c.n_invalid, c.n_failed_generations) == (3, 0, 2, 1)
    assert c.invalid_reasons == {"empty output": 1, "unusable": 1}
    assert out.rows[0].spend.input_tokens == 3 * 10 + 5  # the empty output's call counted
    both, _ = combine([MEAN], [out.rows[0], out.rows[0]], [[], []])
    assert both.counts.invalid_reasons == {"empty output": 2, "unusable": 2}


def test_a_metric_without_direction_and_a_main_metric_must_have_one() -> None:
    from pipeline.core.markdown import results_table

    length = Metric("length", higher_is_better=None, unit="chars")
    assert length.direction == "no better direction"
    head = results_table([MEAN, length], [{"system": "s", "m": 1.0, "length": 3.0}])[0]
    assert "| m (↑) | length (chars) |" in head

    from pipeline.benchmarks._template.benchmark import Template

    class NoWay(Template):
        metrics = (length,)

    with pytest.raises(NotImplementedError, match="main metric must have a better direction"):
        aggregation.score(NoWay(), SimpleNamespace(), [], [])  # type: ignore[arg-type]


def test_combine_pools_over_all_items() -> None:
    a = [ItemScore("a", parts={"r": (1.0, 2.0)})]
    b = [ItemScore("b", parts={"r": (3.0, 2.0)})]
    ra = score_rows("x", [RATIO], [], {}, lambda *_: None).rows  # no runs: no rows
    assert ra == []
    runs = [Run("m", "j", [_gen("a"), _gen("b")], [])]
    rows = score_rows(
        "x", [RATIO], runs, {"a": a, "b": b}, lambda i, g, j: Scored(i), unjudged="count"
    ).rows
    assert rows[0].counts.n_unjudged == 2  # nothing judged: no score
    from pipeline.core.results import ResultRow

    r1 = ResultRow(benchmark="x", model="m", system="s", setting="x", judge="j", keys={"d": "1"})
    r2 = r1.model_copy(update={"keys": {"d": "2"}})
    row, joined = combine([RATIO], [r1, r2], [a, b], d="all")
    assert row.keys == {"d": "all"} and row.metrics["r"] == 100.0 and len(joined) == 2


# ---------------------------------------------------------------- the same join in SummHay


@pytest.mark.parametrize("fault", FAULTS)
def test_summhay_join_errors_name_the_file_and_line(mirror: Path, fault: str) -> None:
    from pipeline.benchmarks.summhay import published
    from pipeline.benchmarks.summhay.benchmark import SummHay
    from pipeline.core.config import PublishedModel
    from pipeline.data.haystacks import load_raw_haystack, normalise
    from pipeline.stages.common import FileInputs

    hay = normalise("news1", load_raw_haystack(mirror / "summhay/topic_news1.json"), "x.json")
    spec = PublishedModel(provider="published", systems=["gpt-4o"], settings=["oracle"])
    files, data_dir = FileInputs(Path("/")), str(mirror / "summhay")
    gens = list(published.generations("published", spec, files, data_dir, [hay]))[:3]
    js = list(published.judgements("published-gpt-4o", files, data_dir, gens))
    run, where = faulty_run(fault, gens, js, "news1/nope")
    scoring = SimpleNamespace(modes=["paper"], partial_credit=50)
    params = SimpleNamespace(seed=0, models={})
    ctx: Any = SimpleNamespace(section=SimpleNamespace(scoring=scoring), params=params)
    with pytest.raises(DataError) as e:
        aggregation.score(SummHay(), ctx, [hay], [run])
    assert where in str(e.value)


@pytest.mark.parametrize(
    ("values", "parts", "message", "key"),
    [
        # a misspelled metric: before, the row read `m: None` with n_scored 1, silently
        ({"mm": 1.0}, {"r": (1.0, 2.0)}, "names the metric 'mm', which b does not declare", "mm"),
        ({}, {"r": (1.0, 2.0)}, "has no value of 'm'", "m"),
        ({"m": 1.0}, {}, "has no parts of 'r'", "r"),
        ({"m": 1.0, "r": 0.5}, {}, "gives a value of 'r', a ratio metric", "r"),
        ({}, {"m": (1.0, 1.0), "r": (1.0, 2.0)}, "gives parts of 'm', a mean metric", "m"),
    ],
)
def test_an_item_score_gives_every_declared_metric_and_no_other(
    values: dict[str, Any], parts: dict[str, tuple[float, float]], message: str, key: str
) -> None:
    g = _gen("i1")
    run = Run("m", "j", [g], [_judgement(g)], ["gens.jsonl:1"], ["js.jsonl:1"])

    def score(item: int, g: Generation, j: Judgement) -> Any:
        return Scored([ItemScore("i1", values=values, parts=parts)])

    with pytest.raises(DataError, match=message) as e:
        score_rows("b", [MEAN, RATIO], [run], {"i1": 1}, score)
    assert e.value.file == "gens.jsonl:1" and e.value.item == "i1" and e.value.field == key
    assert "b: the item score" in str(e.value)


def test_none_says_a_declared_metric_is_undefined_for_an_item() -> None:
    g1, g2 = _gen("i1"), _gen("i2")
    run = Run("m", "j", [g1, g2], [_judgement(g1), _judgement(g2)])

    def score(item: int, g: Generation, j: Judgement) -> Any:
        if item == 1:
            return Scored([ItemScore("i1", values={"m": None, "r": None})])
        return Scored([ItemScore("i2", values={"m": 0.5}, parts={"r": (1.0, 4.0)})])

    (row,) = score_rows("b", [MEAN, RATIO], [run], {"i1": 1, "i2": 2}, score).rows
    assert row.metrics == {"m": 0.5, "r": 25.0} and row.counts.n_scored == 2
