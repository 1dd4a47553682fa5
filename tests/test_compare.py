"""`lfbench compare`'s paired bootstrap over declared metrics (pure part): ratio metrics as
ratios of resampled sums, a run against itself, too few items."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.results import ItemScore, Metric, item_record, pool
from pipeline.tools.compare import bootstrap_declared

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
    from pipeline.stages.tracking import CURRENT, tracking_uri
    from pipeline.tools.compare import find_run

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
