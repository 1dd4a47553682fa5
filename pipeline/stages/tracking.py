"""MLflow: one run per result row, with the lineage that makes it traceable.

The store lives under mlruns/ (SQLite database plus artifact folders) unless
MLFLOW_TRACKING_URI points elsewhere. Logging is idempotent: a row whose result and lineage are
unchanged is skipped; a row whose result changed gets a new run and the old one is marked
`lfbench.current=false` with a pointer to its successor, so history stays visible and the
"current" view never holds duplicates.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.io import canonical_json

log = logging.getLogger(__name__)

CURRENT = "lfbench.current"
ROW_KEY = "lfbench.row_key"
FINGERPRINT = "lfbench.fingerprint"
# Lineage that may change without changing what a result means (re-tagged, not re-logged).
_VOLATILE = ("git.commit", "git.dirty")
# Digests of artifacts drawn from several rows (a system's plot across settings): when one
# changes without the run's own result changing, the artifacts are re-logged into the same run.
_REFRESHED = ("lfbench.plots_sha",)


def tracking_uri(root: Path) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    store = root / "mlruns"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


@dataclass
class SyncReport:
    created: int = 0
    skipped: int = 0
    superseded: int = 0
    retagged: int = 0
    refreshed: int = 0


def _client(root: Path) -> Any:
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


# The MLflow UI opens an experiment of this kind on its runs table (metrics, params, tags),
# not on the GenAI traces overview.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def _experiment_id(client: Any, name: str, root: Path) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND[0] not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
        return str(exp.experiment_id)
    location = None
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        location = (root / "mlruns" / "artifacts" / name).resolve().as_uri()
    return str(
        client.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND]))
    )


def _current_runs(client: Any, experiment_id: str) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{CURRENT}` = 'true'",
            max_results=1000,
            page_token=token,
        )
        for run in page:
            runs[run.data.tags.get(ROW_KEY, "")] = run
        token = page.token
        if not token:
            return runs


def fingerprint(metrics: Mapping[str, float], tags: Mapping[str, str]) -> str:
    stable = {k: v for k, v in tags.items() if k not in _VOLATILE and k not in _REFRESHED}
    blob = canonical_json({"metrics": dict(metrics), "tags": stable})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunSpec:
    row_key: str
    name: str
    metrics: dict[str, float]
    params: dict[str, str]
    tags: dict[str, str]
    # name -> JSON lines (list), a JSON document (dict) or raw bytes (e.g. a PNG plot); a name
    # may hold a folder ("plots/joint.png").
    artifacts: Mapping[str, list[dict[str, Any]] | dict[str, Any] | bytes]
    files: Sequence[Path] = ()  # files logged as they are (plots, reports)


def sync(experiment: str, specs: Sequence[RunSpec], root: Path) -> SyncReport:
    """Make the experiment's current runs match `specs` (create, skip or supersede)."""
    from mlflow.entities import Metric, Param, RunTag

    client = _client(root)
    exp_id = _experiment_id(client, experiment, root)
    current = _current_runs(client, exp_id)
    report = SyncReport()
    for spec in specs:
        fp = fingerprint(spec.metrics, spec.tags)
        old = current.get(spec.row_key)
        if old is not None and old.data.tags.get(FINGERPRINT) == fp:
            stale = {
                k: spec.tags[k]
                for k in _VOLATILE
                if k in spec.tags and old.data.tags.get(k) != spec.tags[k]
            }
            if stale:
                # Same result, newer commit: record where it was last re-made.
                client.log_batch(
                    old.info.run_id, tags=[RunTag(f"{k}.latest", v) for k, v in stale.items()]
                )
                report.retagged += 1
            refresh = {
                k: spec.tags[k]
                for k in _REFRESHED
                if k in spec.tags and old.data.tags.get(k) != spec.tags[k]
            }
            if refresh:
                # Same result, new plots (another row of the plot changed): overwrite them.
                binary = {n: b for n, b in spec.artifacts.items() if isinstance(b, bytes)}
                _log_artifacts(client, old.info.run_id, binary)
                client.log_batch(old.info.run_id, tags=[RunTag(k, v) for k, v in refresh.items()])
                report.refreshed += 1
            report.skipped += 1
            continue
        tags = {
            **spec.tags,
            ROW_KEY: spec.row_key,
            FINGERPRINT: fp,
            CURRENT: "true",
            "mlflow.runName": spec.name,
        }
        run = client.create_run(exp_id, tags=tags, run_name=spec.name)
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(spec.metrics.items())],
            params=[Param(k, v) for k, v in sorted(spec.params.items())],
        )
        _log_artifacts(
            client,
            run_id,
            {**spec.artifacts, **{f.name: f.read_bytes() for f in spec.files}},
        )
        client.set_terminated(run_id, "FINISHED")
        report.created += 1
        if old is not None:
            client.set_tag(old.info.run_id, CURRENT, "false")
            client.set_tag(old.info.run_id, "lfbench.superseded_by", run_id)
            report.superseded += 1
    return report


def _log_artifacts(
    client: Any,
    run_id: str,
    artifacts: Mapping[str, list[dict[str, Any]] | dict[str, Any] | bytes],
) -> None:
    if not artifacts:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for fname, payload in artifacts.items():
            path = Path(tmp) / fname
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(payload, bytes):
                path.write_bytes(payload)
            elif isinstance(payload, list):
                path.write_text(
                    "".join(json.dumps(r, sort_keys=True) + "\n" for r in payload),
                    encoding="utf-8",
                )
            else:
                path.write_text(
                    json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8"
                )
        client.log_artifacts(run_id, tmp)
