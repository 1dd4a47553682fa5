"""What `lfbench ui` opens: each benchmark's runs, with its main metrics as columns.

MLflow's UI starts on its GenAI home page (a telemetry notice, an assistant panel, the
"Getting started" cards), in the GenAI view, where the experiments of a benchmark are one click
and a mode switch away; its runs table then shows attributes, not metrics, and its chart view
and the Compare page's plots start on the alphabetically first metric (`citation`, `cost_usd`).

What a server can choose is a *shared view*: an experiment tag `mlflow.sharedViewState.<key>`
holding the runs page's state as JSON (filter, sort, columns, charts), opened by the link
`#/experiments/<id>/runs?viewStateShareKey=<key>`; `workflowType=machine_learning` selects the
"Model training" view. `prepare_views` writes one such view per benchmark experiment (the
current runs, sorted by the main metric, its declared metrics, interval, items and cost as
columns, and bar charts of the main metrics first) and returns the links to print. The view is
state of the UI only: no run, metric or run tag changes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

VIEW_KEY = "lfbench"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
SECTION = "lfbench-main-metrics"
CURRENT = "tags.`lfbench.current` = 'true'"
# metrics of every result row beside the benchmark's own (pipeline/core/results.py)
COMMON = ("n_items", "cost_usd")
# the agreement experiment (judges against people): its rows are not a benchmark's
AGREEMENT = (("cohen_kappa", True), ("pearson", True), ("linking_accuracy", True))


@dataclass(frozen=True)
class View:
    experiment: str
    experiment_id: str
    metrics: tuple[str, ...]  # the main metric first
    columns: tuple[str, ...]
    runs_url: str
    charts_url: str


def _column(metric: str) -> str:
    return f"metrics.`{metric}`"


def view_state(metrics: Sequence[str], columns: Sequence[str], higher_is_better: bool) -> str:
    """The runs page's state as MLflow's UI stores it (its local storage format): the current
    runs, sorted by the first metric, `columns` shown in this order, bar charts of `metrics`."""
    charts = [
        {
            "uuid": f"lfbench-chart-{m}",
            "type": "BAR",
            "runsCountToCompare": 10,
            "metricSectionId": SECTION,
            "deleted": False,
            "isGenerated": True,
            "displayName": m,
            "metricKey": m,
        }
        for m in metrics
    ]
    state: dict[str, Any] = {
        "searchFilter": CURRENT,
        "orderByKey": _column(metrics[0]),
        "orderByAsc": not higher_is_better,
        "lifecycleFilter": "Active",
        "selectedColumns": [_column(c) for c in columns],
        "columnOrder": [_column(c) for c in columns],
        "compareRunCharts": charts,
        "compareRunSections": [
            {
                "uuid": SECTION,
                "name": "Main metrics (lfbench)",
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isGenerated": True,
            }
        ],
        "hideEmptyCharts": True,
    }
    return json.dumps(state, sort_keys=True)


def declared(experiment: str) -> tuple[tuple[str, ...], bool]:
    """The metrics a view shows for an experiment, the main one first, and whether higher is
    better: a benchmark's declared metrics (its first three), or the agreement's."""
    from pipeline.core import registry

    if experiment == "agreement":
        return tuple(m for m, _ in AGREEMENT), True
    if experiment not in registry.names():
        return (), True
    metrics = registry.get(experiment).metrics
    if not metrics:
        return (), True
    return tuple(m.name for m in metrics[:3]), metrics[0].higher_is_better is not False


def prepare_views(uri: str, base_url: str) -> list[View]:
    """Write the shared view of every benchmark experiment of the store at `uri` and return
    their links (on `base_url`, e.g. http://127.0.0.1:5000)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    views = []
    for exp in sorted(client.search_experiments(), key=lambda e: e.name):
        metrics, higher = declared(exp.name)
        if not metrics:
            continue  # not an lfbench experiment (Default, a user's own)
        main = metrics[0]
        ci = (f"{main}_ci_low", f"{main}_ci_high") if exp.name != "agreement" else ()
        columns = (*metrics, *ci, *(COMMON if exp.name != "agreement" else ("n",)))
        state = view_state(metrics, columns, higher)
        if exp.tags.get(VIEW_TAG) != state:
            client.set_experiment_tag(exp.experiment_id, VIEW_TAG, state)
        runs = (
            f"{base_url}/#/experiments/{exp.experiment_id}/runs"
            f"?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"
        )
        views.append(
            View(
                exp.name, exp.experiment_id, metrics, columns, runs, runs + "&compareRunsMode=CHART"
            )
        )
    return views


def display_host(host: str) -> str:
    """The host of a link to a server listening on `host` (all interfaces: this machine)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
