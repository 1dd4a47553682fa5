"""`lfbench compare`'s paired bootstrap over declared metrics (pure part): ratio metrics as
ratios of resampled sums, a run against itself, too few items; and on a real MLflow store what
it refuses and how it names runs (issue 36, points 12 and 22)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pipeline.core.results import ItemScore, Metric, item_record, pool
from pipeline.results.compare import bootstrap_declared

RATIO = Metric("cov", pool="ratio", scale=100.0)
MEAN = Metric("m")


def _items(n: int, shift: float = 0.0) -> list[dict[str, Any]]:
    # item i: ratio parts (i % 3 + shift, 3) over uneven denominators, a mean value i / n
    out = []
    for i in range(n):
        den = 1.0 + i % 4
        out.append(
            item_record(
                ItemScore(
                    f"q{i}",
                    values={"m": i / n + shift},
                    parts={"cov": (min(den, (i % 3) * 0.5 + shift), den)},
                )
            )
        )
    return out


def _pooled(metric: Metric, records: list[dict[str, Any]]) -> float | None:
    return pool(
        metric,
        [
            ItemScore(
                r["item_id"], values=r["values"], parts={k: tuple(v) for k, v in r["parts"].items()}
            )  # type: ignore[misc]
            for r in records
        ],
    )


def test_point_estimate_is_the_difference_of_the_rows_and_ratios_pool_as_ratios() -> None:
    a, b = _items(30), _items(30, shift=0.5)
    res, shared = bootstrap_declared([RATIO, MEAN], a, b, resamples=500)
    assert shared == 30
    for m in (RATIO, MEAN):
        pa, pb = _pooled(m, a), _pooled(m, b)
        assert pa is not None and pb is not None
        assert res[m.name]["a"] == pytest.approx(pa) and res[m.name]["b"] == pytest.approx(pb)
        assert res[m.name]["delta"] == pytest.approx(pb - pa)
        assert res[m.name]["ci_low"] <= res[m.name]["delta"] <= res[m.name]["ci_high"]
    # the ratio of sums, not the mean of the item ratios
    mean_of_ratios = 100 * sum(r["parts"]["cov"][0] / r["parts"]["cov"][1] for r in a) / 30
    assert res["cov"]["a"] != pytest.approx(mean_of_ratios)


def test_a_run_against_itself_and_too_few_items() -> None:
    a = _items(30)
    res, _ = bootstrap_declared([RATIO, MEAN], a, a, resamples=500)
    for m in ("cov", "m"):
        assert res[m]["delta"] == 0 and res[m]["p_value"] == 1.0
        assert res[m]["ci_low"] == res[m]["ci_high"] == 0
    few, shared = bootstrap_declared([RATIO, MEAN], _items(9), _items(9, 0.5), resamples=50)
    assert shared == 9 and few == {}  # below the documented minimum of 10: nothing tested
    one, _ = bootstrap_declared([MEAN], _items(1), _items(1, 0.5), min_items=2)
    assert one == {}


def test_a_run_is_found_by_its_entry_or_by_the_run_name_the_error_suggests(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named by its model entry, a system with several current runs (the length study's, each
    domain's) is ambiguous: the error lists their run names, and each of those names one run."""
    from mlflow.tracking import MlflowClient

    from pipeline.core.errors import LfbenchError
    from pipeline.results.compare import find_run
    from pipeline.stages.tracking import CURRENT, tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = MlflowClient(tracking_uri(tmp_path))
    exp = client.create_experiment("summhay")
    tags = {"model.entry": "lead", "setting": "oracle", "judge.name": "local", CURRENT: "true"}
    ids = {
        where: client.create_run(
            exp, run_name=f"lead / oracle / local / paper / {where}", tags=tags
        ).info.run_id
        for where in ("all", "news")
    }
    with pytest.raises(LfbenchError, match="2 current summhay runs of 'lead'") as err:
        find_run(tmp_path, "summhay", "lead", setting="oracle", judge="local")
    for where, run_id in ids.items():
        suggested = f"lead / oracle / local / paper / {where}"
        assert suggested in str(err.value)
        assert find_run(tmp_path, "summhay", suggested) == run_id


# ---------------------------------------------------------------- issue 36, points 12 and 22


def _record(item: str, cov: float, words: float = 30.0) -> dict[str, Any]:
    parts = {m: (cov, 1.0) for m in ("coverage", "joint", "citation")}
    return item_record(ItemScore(item, values={"words_per_bullet": words}, parts=parts))


def _log(root: Any, experiment: str, runs: list[dict[str, Any]]) -> dict[str, str]:
    """Runs as the aggregate stage logs them (`sync`: tags, params, items.jsonl); returns
    {run name: run id}."""
    from mlflow.tracking import MlflowClient

    from pipeline.stages.tracking import RunSpec, sync, tracking_uri

    specs = []
    for r in runs:
        keys = {"domain": r["domain"], "collection": r["collection"], "mode": "paper"}
        ident = {"system": r["model"], "setting": r["setting"], "judge": "local", **keys}
        items = r["items"]
        n = len(items)
        cov = 100 * sum(x["parts"]["coverage"][0] for x in items) / n
        specs.append(
            RunSpec(
                row_key="|".join(ident.values()),
                name=" / ".join(ident.values()),
                metrics={"coverage": cov, "coverage_ci_low": cov - 1, "coverage_ci_high": cov + 1,
                         "n_items": float(n), **r.get("metrics", {})},
                params={**ident, "model": r["model"]},
                tags={"benchmark": experiment, "setting": r["setting"], "model.name": r["model"],
                      "model.entry": r["model"], "judge.name": "local", **keys},
                artifacts={"items.jsonl": items},
            )
        )  # fmt: skip
    sync(experiment, specs, root, producer=f"{experiment}-aggregate")
    client = MlflowClient(tracking_uri(root))
    exp = client.get_experiment_by_name(experiment)
    return {r.info.run_name: r.info.run_id for r in client.search_runs([exp.experiment_id])}


@pytest.fixture
def store(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """SummHay-like runs: `lead` in two domains x two collections and two settings (42 items
    on news/released, coverage 5.0 on news1/s0 and 11.0 on the others), `mine` on one item
    (coverage 10.0 on news1/s0), and one run of another benchmark."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    released = [_record(f"news1/s{i}", 0.05 if i == 0 else 0.11) for i in range(42)]
    b25k = [_record(f"news1@25k/s{i}", 0.2) for i in range(12)]
    runs = [
        {"model": "lead", "setting": s, "domain": d, "collection": c, "items": items}
        for s in ("oracle", "bm25")
        for d in ("all", "news")
        for c, items in (("released", released), ("25k", b25k))
    ]
    runs.append({"model": "mine", "setting": "oracle", "domain": "news", "collection": "released",
                 "items": [_record("news1/s0", 0.10, words=33287.0)],
                 "metrics": {"input_tokens": 33287.0}})  # fmt: skip
    ids = _log(tmp_path, "summhay", runs)
    other = {"model": "lead", "setting": "oracle", "domain": "news", "collection": "released",
             "items": released}  # fmt: skip
    ids |= {f"crux: {k}": v for k, v in _log(tmp_path, "crux", [other]).items()}
    return ids


def _cli(args: list[str]) -> Any:
    from click.testing import CliRunner

    from pipeline.cli import cli

    return CliRunner().invoke(cli, ["compare", *args], catch_exceptions=False)


LEAD = "lead / oracle / local / news / released / paper"


def test_runs_of_two_benchmarks_are_refused(store: dict[str, str]) -> None:
    """Before: compared, metric by metric, as if they measured the same thing."""
    from pathlib import Path

    from pipeline.core.errors import LfbenchError
    from pipeline.results.compare import compare_runs

    with pytest.raises(LfbenchError, match="two benchmarks: summhay and crux"):
        compare_runs(Path.cwd(), store[LEAD], store[f"crux: {LEAD}"])


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--resamples", "0"], "--resamples"),
        (["--resamples", "-5"], "--resamples"),
        (["--resamples", "2"], "--resamples"),
        (["--resamples", "999"], "--resamples"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_a_bootstrap_that_cannot_give_a_sound_answer_is_refused(
    store: dict[str, str], args: list[str], why: str
) -> None:
    """Before: 0 or a negative count claimed a bootstrap and tested nothing, 2 resamples marked
    p 0.0000 significant, and seed -1 silently dropped every test."""
    other = "lead / bm25 / local / news / released / paper"
    done = _cli([store[LEAD], store[other], *args])
    assert done.exit_code == 2, done.output
    assert f"Invalid value for '{why}'" in done.output


def test_the_api_refuses_them_too(store: dict[str, str]) -> None:
    from pathlib import Path

    from pipeline.core.errors import LfbenchError
    from pipeline.results.compare import compare_runs

    other = store["lead / bm25 / local / news / released / paper"]
    with pytest.raises(LfbenchError, match="at least 1000 resamples"):
        compare_runs(Path.cwd(), store[LEAD], other, resamples=2)
    with pytest.raises(LfbenchError, match="seed"):
        compare_runs(Path.cwd(), store[LEAD], other, seed=-1)


def test_interval_bounds_are_not_compared_as_metrics(store: dict[str, str]) -> None:
    from pathlib import Path

    from pipeline.results.compare import compare_runs

    res = compare_runs(Path.cwd(), store[LEAD], store["lead / bm25 / local / news / released / "
                                                      "paper"], resamples=1000)  # fmt: skip
    assert "coverage" in res["metrics"] and "n_items" in res["metrics"]
    assert not [k for k in res["metrics"] if k.endswith(("_ci_low", "_ci_high"))]


def test_a_benchmarks_group_keys_name_the_runs(store: dict[str, str]) -> None:
    """`--domain`, `--collection`, `--mode` (SummHay's group keys, from its result model) narrow
    the runs; one value is both runs', two are A's and B's, as for --setting and --judge: two
    settings of one model by name. Before: "8 current runs of 'lead'" and no such options."""
    from pathlib import Path

    from pipeline.core.errors import LfbenchError
    from pipeline.results.compare import find_run

    root = Path.cwd()
    with pytest.raises(LfbenchError) as err:
        find_run(root, "summhay", "lead", "oracle", "local")
    msg = str(err.value)
    assert "4 current summhay runs of 'lead'" in msg
    assert "--domain (all, news)" in msg and "--collection (25k, released)" in msg
    assert "--mode" not in msg  # the same in every candidate
    assert find_run(root, "summhay", "lead", "oracle", "local",
                    {"domain": "news", "collection": "released"}) == store[LEAD]  # fmt: skip
    with pytest.raises(LfbenchError, match=r"--task: not a group key of summhay \(its keys: "
                       r"--domain, --collection, --mode\)"):  # fmt: skip
        find_run(root, "summhay", "lead", "oracle", "local", {"task": "x"})

    done = _cli(["--benchmark", "summhay", "lead", "lead", "--setting", "oracle", "--setting",
                 "bm25", "--domain", "news", "--judge", "local", "--collection=released",
                 "--json", "--resamples", "1000"])  # fmt: skip
    assert done.exit_code == 0, done.output
    res = json.loads(done.output)
    assert res["run_a"]["id"] == store[LEAD]
    assert res["run_b"]["id"] == store["lead / bm25 / local / news / released / paper"]
    assert res["params"] == {"setting": ["oracle", "bm25"]}
    done = _cli(["--benchmark", "summhay", "lead", "mine", "--domain", "news", "--domain", "x",
                 "--domain", "y"])  # fmt: skip
    assert done.exit_code == 2 and "--domain: give one value (both runs) or two" in done.output


def test_both_systems_are_shown_on_the_shared_items(store: dict[str, str]) -> None:
    """`mine` ran one item of lead's 42: A and B are both systems on that item (lead 5.0, mine
    10.0), not lead's whole run (10.857); the whole runs are shown apart. Wide numbers keep
    their columns apart. Before: lead's 10.857 beside mine's 10.0, and `33287.000     0.000-`
    run together."""
    mine = "mine / oracle / local / news / released / paper"
    done = _cli([store[LEAD], store[mine], "--resamples", "1000"])
    assert done.exit_code == 0, done.output
    text = done.output
    assert "on the 1 shared item" in text
    table = text[text.index("  metric") :].splitlines()
    header = table[0].split()
    coverage = next(line.split() for line in table if line.split()[:1] == ["coverage"])
    assert coverage[header.index("A")] == "5.000" and coverage[header.index("B")] == "10.000"
    assert coverage[header.index("delta")] == "5.000"
    whole = text[text.index("whole runs") :]
    assert re.search(r"coverage\s+10\.857\s+10\.000", whole), whole
    for line in text.splitlines():
        assert not re.search(r"\d\.\d{3}-?\d", line), line  # two numbers never touch
    res = json.loads(_cli([store[LEAD], store[mine], "--resamples", "1000", "--json"]).output)
    cov = res["metrics"]["coverage"]
    assert (cov["pooled_a"], cov["pooled_b"], cov["run_a"], cov["run_b"]) == pytest.approx(
        (5.0, 10.0, 10.857142857142858, 10.0)
    )
    assert "p_value" not in cov and "too few" in res["note"]


def test_the_benchmark_s_main_metric_comes_first(store: dict[str, str]) -> None:
    """The paired table lists the benchmark's metrics in its declared order, its main one first
    (SummHay: joint, coverage, citation, ...), then the others; the whole runs' other metrics
    follow the same order. Before: alphabetical (citation, coverage, joint)."""
    from pipeline.core import registry

    declared = [m.name for m in registry.get("summhay").metrics]
    other = "lead / bm25 / local / news / released / paper"
    done = _cli([store[LEAD], store[other], "--resamples", "1000"])
    assert done.exit_code == 0, done.output
    table = done.output[done.output.index("  metric") :].splitlines()[1:]
    listed = [line.split()[0] for line in table if line.startswith("  ") and line.split()]
    listed = [m for m in listed if m in declared]
    assert listed[:3] == ["joint", "coverage", "citation"], done.output
    assert listed == [m for m in declared if m in listed]
    from pathlib import Path

    from pipeline.results.compare import compare_runs

    names = list(compare_runs(Path.cwd(), store[LEAD], store[other], resamples=1000)["metrics"])
    assert names[:3] == ["joint", "coverage", "citation"], names
    rest = [n for n in names if n not in declared]
    assert rest == sorted(rest) and names == [n for n in declared if n in names] + rest
