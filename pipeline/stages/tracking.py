"""MLflow: one run per result row, with the lineage that makes it traceable.

The store lives under mlruns/ (SQLite database plus artifact folders) unless
MLFLOW_TRACKING_URI points elsewhere. Logging is idempotent: a row whose result and lineage are
unchanged is skipped; a row whose result changed gets a new run and the old one is marked
`lfbench.current=false` with a pointer to its successor, so history stays visible and the
"current" view never holds duplicates.

Several clones may sync into one store at once (a team's tracking server, or one SQLite file):
a run is made `current` only once it is complete, and after its writes each sync looks again at
the rows it touched: of two current runs of one row with the same result, the earlier stays and
the later is deleted; with different results, the later stays current and the earlier is
superseded. Every sync applies the same rule to what it sees, and the last one to write sees
every run, so the store converges to one current run per row. Syncs into one SQLite file are
also serialised by a lock beside it (and MLflow's first migration of a fresh file with them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.io import canonical_json
from pipeline.llm.cache import redact

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
    deduplicated: int = 0  # another sync's identical run of the same row, made at the same time


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock beside a SQLite store (no-op for a server or another database)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with db.with_name(db.name + ".lock").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    from mlflow.exceptions import MlflowException

    for _ in range(3):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if EXPERIMENT_KIND[0] not in exp.tags:
                _tag_experiment(client, exp.experiment_id)
            return str(exp.experiment_id)
        location = None
        uri = tracking_uri(root)
        if uri.startswith("sqlite:///"):
            # beside the database (also when MLFLOW_TRACKING_URI names one elsewhere, e.g. for
            # `dvc exp run --queue`, whose runs happen in scratch copies of the workspace)
            db = Path(uri[len("sqlite:///") :])
            location = (db.parent / "artifacts" / name).resolve().as_uri()
        try:
            return str(
                client.create_experiment(
                    name, artifact_location=location, tags=dict([EXPERIMENT_KIND])
                )
            )
        except MlflowException as e:  # another sync created it a moment ago
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    raise RuntimeError(f"MLflow experiment {name!r}: could not create or find it")


def _open(root: Path, experiment: str) -> tuple[Any, str]:
    """The client and the experiment's id. A database store that another process is creating
    (MLflow's schema migrations racing) is retried, not reported as a traceback."""
    from mlflow.exceptions import MlflowException

    last: Exception | None = None
    for attempt in range(6):
        try:
            client = _client(root)
            return client, _experiment_id(client, experiment, root)
        except MlflowException as e:
            if e.error_code in ("RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE"):
                raise
            last = e
        except Exception as e:  # SQLAlchemy's errors while the schema is being made
            if type(e).__module__.split(".")[0] != "sqlalchemy":
                raise
            last = e
        time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(
        f"MLflow store {redact(tracking_uri(root))}: could not open it after 6 tries: {last}"
    ) from last


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
class DatasetRef:
    """The dataset a run was scored on, as MLflow's Dataset column shows it (`log_inputs`)."""

    name: str
    digest: str
    source: str  # a path relative to the project, or a URL


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
    dataset: DatasetRef | None = None


def sync(experiment: str, specs: Sequence[RunSpec], root: Path) -> SyncReport:
    """Make the experiment's current runs match `specs` (create, skip or supersede)."""
    with _store_lock(tracking_uri(root)):
        client, exp_id = _open(root, experiment)
        report = _sync(client, exp_id, specs)
        touched = {s.row_key for s in specs}
        if report.created:
            report.deduplicated = _converge(client, exp_id, touched)
    return report


def _sync(client: Any, exp_id: str, specs: Sequence[RunSpec]) -> SyncReport:
    from mlflow.entities import Metric, Param, RunTag

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
            CURRENT: "pending",  # "true" once complete: a crash leaves no half-made current run
            "mlflow.runName": spec.name,
        }
        # MLflow's own source tags (the UI's Source column and commit link)
        if "git.commit" in spec.tags:
            tags["mlflow.source.git.commit"] = spec.tags["git.commit"]
        tags.setdefault("mlflow.source.name", spec.tags.get("dvc.stage", "lfbench"))
        tags.setdefault("mlflow.source.type", "PROJECT")
        run = client.create_run(exp_id, tags=tags, run_name=spec.name)
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(spec.metrics.items())],
            params=[Param(k, v) for k, v in sorted(spec.params.items())],
        )
        if spec.dataset is not None:
            _log_dataset(client, run_id, spec.dataset)
        _log_artifacts(
            client,
            run_id,
            {**spec.artifacts, **{f.name: f.read_bytes() for f in spec.files}},
        )
        client.set_terminated(run_id, "FINISHED")
        client.set_tag(run_id, CURRENT, "true")
        report.created += 1
        if old is not None:
            _set_tag(client, old.info.run_id, CURRENT, "false")
            _set_tag(client, old.info.run_id, "lfbench.superseded_by", run_id)
            report.superseded += 1
    return report


def _log_dataset(client: Any, run_id: str, ref: DatasetRef) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag

    source_type = "http" if ref.source.startswith(("http://", "https://")) else "local"
    dataset = Dataset(
        name=ref.name,
        digest=ref.digest[:36],
        source_type=source_type,
        source=json.dumps({"uri": ref.source}),
    )
    inputs = [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "evaluation")])]
    # Two syncs of one experiment may insert the same dataset at once (one store row per
    # experiment, name and digest): the loser retries and links the row the winner made.
    _racing(lambda: client.log_inputs(run_id, inputs))


def _racing(call: Callable[[], Any], done: Callable[[], bool] | None = None) -> None:
    """Make a write that a concurrent sync may be making at the same moment.

    MLflow's SQL store reads, then inserts (a tag of a run, a dataset of an experiment); the loser
    of two simultaneous inserts fails on the primary key (PostgreSQL `UniqueViolation` on `tag_pk`
    or `dataset_pk`) and its transaction is rolled back. The write is then done if `done()` says
    the other sync wrote what we wanted; otherwise it is retried (the row exists now: the store
    updates or reuses it). Any other failure is raised after the last attempt.
    """
    from mlflow.exceptions import MlflowException

    for attempt in range(1, _RACE_ATTEMPTS + 1):
        try:
            call()
            return
        except MlflowException:
            if done is not None and done():
                return
            if attempt == _RACE_ATTEMPTS:
                raise
            time.sleep(0.2 * attempt)


_RACE_ATTEMPTS = 3


def _tag_experiment(client: Any, exp_id: str) -> None:
    """Mark an experiment as lfbench's (two syncs may find it unmarked at once)."""
    _racing(
        lambda: client.set_experiment_tag(exp_id, *EXPERIMENT_KIND),
        done=lambda: EXPERIMENT_KIND[0] in client.get_experiment(exp_id).tags,
    )


def _set_tag(client: Any, run_id: str, key: str, value: str) -> None:
    """Set a tag that another sync converging on the same row may be setting too."""
    _racing(
        lambda: client.set_tag(run_id, key, value),
        done=lambda: client.get_run(run_id).data.tags.get(key) == value,
    )


def _converge(client: Any, exp_id: str, row_keys: set[str]) -> int:
    """Leave one current run per row among `row_keys` (the rule in the module docstring);
    returns how many identical duplicates were deleted."""
    groups: dict[str, list[Any]] = {}
    token = None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string=f"tags.`{CURRENT}` = 'true'",
            max_results=1000,
            page_token=token,
        )
        for run in page:
            key = run.data.tags.get(ROW_KEY, "")
            if key in row_keys:
                groups.setdefault(key, []).append(run)
        token = page.token
        if not token:
            break
    deleted = 0
    for key, runs in groups.items():
        if len(runs) < 2:
            continue
        runs.sort(key=lambda r: (r.info.start_time or 0, r.info.run_id))
        fps = {r.data.tags.get(FINGERPRINT) for r in runs}
        if len(fps) == 1:
            keep, extra = runs[0], runs[1:]
            for r in extra:
                with contextlib.suppress(Exception):  # the other sync deleted it already
                    client.delete_run(r.info.run_id)
                    deleted += 1
        else:
            keep = runs[-1]
            for r in runs[:-1]:
                _set_tag(client, r.info.run_id, CURRENT, "false")
                _set_tag(client, r.info.run_id, "lfbench.superseded_by", keep.info.run_id)
        log.info(
            "row %s: %d current runs made at once by concurrent syncs; kept %s",
            key,
            len(runs),
            keep.info.run_id,
        )
    return deleted


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
