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

What a row's result is: its fingerprint hashes its metrics and its provenance tags (the dataset
digest, the benchmark and its version, the row's own model and judge entries and prompt hashes,
the image recipe, the row's own tags), not its bookkeeping (`_VOLATILE`: the DVC stage digests,
which change when an unrelated model's entry or a stage's code changes, the git commit, the
lfbench version, the data folder's digest, where it ran), nor its usage counters
(`RunSpec.counters`: a stage re-run from the cache sends nothing). A row whose bookkeeping alone
changed keeps its run; the new values are recorded as `<tag>.latest`, the new counters logged
again in it. A run logged under an older fingerprint rule is recognised from its stored metrics
and tags, and re-tagged, not re-made.

Which runs are current: every run carries the stage that produced it (`lfbench.producer`, e.g.
`summhay-aggregate`, `summhay-agreement`) and the workspace that last made or confirmed it
(`lfbench.workspace`: `$LFBENCH_WORKSPACE`, else a random id kept in `.lfbench/workspace`). A
sync is one producer's complete output in one workspace, so after it, of that producer's current
runs owned by this workspace, exactly the rows it was given stay current; the others (a model
removed from params, a slice changed) are retired: `lfbench.current=false`,
`lfbench.retired=true`, `lfbench.superseded_by=none`. Runs of another producer (the agreement
stage shares its experiment between benchmarks) or owned by another workspace (a teammate's
models in a shared store, another queued experiment) are never retired: their own syncs decide.
A row both produce belongs to the last that synced it. A retired row produced again with the
same result makes its retired run current again (same run id). Runs logged before these tags
existed are adopted by the first sync that confirms them, and never retired otherwise.

Every sync, even one that creates nothing, converges the rows it was given: a sync killed
between making a new run current and superseding the old one is healed by the next.

A run is `lfbench.current=pending` while its sync writes it. A sync stopped then (Ctrl-C, a kill)
leaves it pending for good, so every sync first deletes the pending runs of its experiment whose
sync is over (`_clean_abandoned`), and only those: in a SQLite store every one (all syncs hold
the store's lock for all their writes, so none is in progress); in a server store those of a
process of this machine that is gone (a pending run records its writer: boot id, PID namespace,
PID and start time), and any other once it is `PENDING_STALE_S` old (another machine's or
container's sync writes one run in seconds, not an hour).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core import procs
from pipeline.core.drawing import Plot, draw_all, drawn
from pipeline.core.io import canonical_json
from pipeline.llm.cache import redact
from pipeline.stages.mlflow_store import sqlite_file
from pipeline.stages.mlflow_store import tracking_uri as tracking_uri

log = logging.getLogger(__name__)

CURRENT = "lfbench.current"
ROW_KEY = "lfbench.row_key"
FINGERPRINT = "lfbench.fingerprint"
PRODUCER = "lfbench.producer"
WORKSPACE = "lfbench.workspace"
RETIRED = "lfbench.retired"
SUPERSEDED_BY = "lfbench.superseded_by"
WRITER = "lfbench.writer"  # the process writing a pending run (see `_writer`)
# A pending run older than this, whose writer cannot be checked here, is taken as abandoned.
PENDING_STALE_S = 3600.0
# Bookkeeping: lineage that may change without changing what a result is (re-tagged as
# `<tag>.latest`, not re-logged). Also every `dvc.*md5` tag (see `bookkeeping`).
_VOLATILE = (
    "git.commit",
    "git.dirty",
    "lfbench.version",
    "data.digest",
    "runtime",
    "image.digest",
)
# What `lfbench audit` logs on a run (pipeline/results/audit.py): metrics and tags of this prefix
# are not the row's result; a new run of an audited row is tagged `audit.pending`.
AUDIT = "audit."
AUDIT_PENDING = "audit.pending"
# Digests of artifacts drawn from several rows (a system's plot across settings): when one
# changes without the run's own result changing, the artifacts are re-logged into the same run.
_REFRESHED = ("lfbench.plots_sha",)


@dataclass
class SyncReport:
    created: int = 0
    skipped: int = 0
    superseded: int = 0
    retagged: int = 0
    refreshed: int = 0
    deduplicated: int = 0  # another sync's identical run of the same row, made at the same time
    healed: int = 0  # an older current run of a row with another result, superseded late
    retired: int = 0  # current runs of this producer and workspace whose row is not produced
    adopted: int = 0  # unchanged runs last confirmed by another workspace (or untagged)
    revived: int = 0  # retired runs whose row is produced again with the same result
    recounted: int = 0  # unchanged runs whose usage counters were re-logged (a stage re-ran)
    abandoned: int = 0  # pending runs of syncs that stopped half-way (Ctrl-C, kill): deleted


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock beside a SQLite store (no-op for a server or another database)."""
    db = sqlite_file(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with db.with_name(db.name + ".lock").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _client(root: Path) -> Any:
    """A client of the project's store, once the store is known to answer (`mlflow_store`:
    quick failure, bounded retries)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipeline.stages.mlflow_store import bounded_http, check_reachable, seed_sqlite_store

    uri = tracking_uri(root)
    bounded_http()
    check_reachable(uri)
    seed_sqlite_store(uri)
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
        db = sqlite_file(uri)
        if db is not None:
            # beside the database (also when MLFLOW_TRACKING_URI names one elsewhere, e.g. for
            # `dvc exp run --queue`, whose runs happen in scratch copies of the workspace)
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

    from pipeline.core.errors import LfbenchError
    from pipeline.stages.mlflow_store import scrub

    uri = tracking_uri(root)
    last: Exception | None = None
    for attempt in range(6):
        try:
            client = _client(root)
            return client, _experiment_id(client, experiment, root)
        except MlflowException as e:
            if e.error_code in ("RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE"):
                raise
            if uri.startswith(("http://", "https://")):
                raise  # a server's own retries are done: no migration to wait for
            last = e
        except Exception as e:  # SQLAlchemy's errors while the schema is being made
            if type(e).__module__.split(".")[0] != "sqlalchemy":
                raise
            last = e
        time.sleep(0.5 * (attempt + 1))
    raise LfbenchError(
        scrub(f"MLflow store {redact(uri)}: could not open it after 6 tries: {last}", uri)
    ) from None


def _current_runs(client: Any, experiment_id: str) -> list[Any]:
    """Every current run of the experiment (one search, paged)."""
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{CURRENT}` = 'true'",
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def bookkeeping(tag: str) -> bool:
    """A tag that records where and when a row was made, not what it is (kept out of the
    fingerprint): `_VOLATILE`, every DVC stage digest (`dvc.stage_md5`, `dvc.*_stage_md5`) and
    the `.latest` values recorded for them."""
    return (
        tag in _VOLATILE
        or (tag.startswith("dvc.") and tag.endswith("md5"))
        or tag.endswith(".latest")
    )


def fingerprint(metrics: Mapping[str, float], tags: Mapping[str, str]) -> str:
    """What a row's result is: its metrics and its provenance tags (not its bookkeeping)."""
    stable = {k: v for k, v in tags.items() if not bookkeeping(k) and k not in _REFRESHED}
    numbers = {k: float(v) for k, v in metrics.items()}
    blob = canonical_json({"metrics": numbers, "tags": stable})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stored_fingerprint(run: Any, spec: RunSpec | None = None) -> str:
    """The fingerprint of a logged run, recomputed from its stored metrics and tags (the tags
    sync adds, `lfbench.*` and `mlflow.*`, left out: no spec tag of lfbench's is both of those
    and part of the fingerprint). Recognises a run logged under an older fingerprint rule. Given
    the spec it is compared with, the spec's counters are left out of the stored metrics, and a
    tag the spec has and the run lacks (added by a newer lfbench, e.g. `model.entry_sha`) is
    taken as the spec's (the sync then adds it to the run). A people's audit of the run
    (`lfbench audit`: `audit.*` metrics and tags) is not part of what the row is."""
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith(("lfbench.", "mlflow."))}
    tags = {k: v for k, v in tags.items() if not k.startswith(AUDIT)}
    skip: set[str] = set()
    if spec is not None:
        skip = set(spec.counters)
        tags |= {k: v for k, v in spec.tags.items() if k not in run.data.tags}
    metrics = {k: v for k, v in run.data.metrics.items() if not k.startswith(AUDIT)}
    return fingerprint({k: v for k, v in metrics.items() if k not in skip}, tags)


def workspace_id(root: Path) -> str:
    """This workspace's name in the runs it owns: `$LFBENCH_WORKSPACE`, else a random id made
    once and kept in `.lfbench/workspace` (not in git: each clone, and each scratch copy of a
    queued experiment, is its own workspace)."""
    env = os.environ.get("LFBENCH_WORKSPACE")
    if env:
        return env
    path = root / ".lfbench" / "workspace"
    if path.exists():
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    path.parent.mkdir(parents=True, exist_ok=True)
    made = uuid.uuid4().hex[:16]
    # written whole, then linked into place: two stages starting at once agree on one id
    tmp = path.with_name(f".workspace.{made}")
    tmp.write_text(made + "\n", encoding="utf-8")
    try:
        os.link(tmp, path)
    except FileExistsError:
        made = path.read_text(encoding="utf-8").strip()
    finally:
        tmp.unlink()
    if not made:
        raise RuntimeError(
            f"{path}: empty; delete it (a new workspace id is made) or set LFBENCH_WORKSPACE"
        )
    return made


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
    # PNG files, as bytes or drawn when the run is logged (created, or its plots re-logged):
    # their digest is the spec's `lfbench.plots_sha` tag
    plots: Mapping[str, bytes | Plot] = field(default_factory=dict)
    dataset: DatasetRef | None = None
    # metrics that say how the row was made this time (its stages' usage: requests sent, cache
    # hits, wall time), not what it is: logged, kept out of the fingerprint, re-logged in place
    counters: Mapping[str, float] = field(default_factory=dict)


# rows logged side by side to a tracking server or database (a SQLite file takes one writer)
SYNC_THREADS = 8


def sync(
    experiment: str,
    specs: Sequence[RunSpec],
    root: Path,
    *,
    producer: str,
    retire: bool = True,
) -> SyncReport:
    """Make the experiment's current runs of `producer` in this workspace match `specs` (create,
    skip or supersede; retire the rows it no longer produces; heal what a killed sync left).
    `retire=False`: `specs` are part of the producer's rows (one model's, logged early), so no
    other row is retired; the producer's complete sync does that.

    In a stage's process, done by the warm sync server when one runs (`warm_sync`: the same
    `sync_here`, without importing MLflow here)."""
    from pipeline.stages import warm_sync

    return warm_sync.call(sync_here, experiment, specs, root, producer=producer, retire=retire)


def sync_here(
    experiment: str,
    specs: Sequence[RunSpec],
    root: Path,
    *,
    producer: str,
    retire: bool = True,
) -> SyncReport:
    """`sync` in this process."""
    keys = [s.row_key for s in specs]
    if len(set(keys)) != len(keys):
        twice = sorted(k for k in set(keys) if keys.count(k) > 1)
        raise ValueError(f"MLflow experiment {experiment}: {producer} gives rows twice: {twice}")
    from pipeline.stages.mlflow_store import store_errors

    workspace = workspace_id(root)
    uri = tracking_uri(root)
    with _store_lock(uri), store_errors(uri, f"logging the runs of {producer}"):
        client, exp_id = _open(root, experiment)
        abandoned = _clean_abandoned(client, exp_id, locked=uri.startswith("sqlite:///"))
        current = _of(producer, _current_runs(client, exp_id))
        threads = 1 if uri.startswith("sqlite:") else SYNC_THREADS
        report = _sync(client, exp_id, specs, current, producer, workspace, threads)
        report.abandoned = abandoned
        if report.created:
            current = _of(producer, _current_runs(client, exp_id))  # and a concurrent sync's
        touched = set(keys)
        report.deduplicated, report.healed = _converge(client, current, touched)
        if retire:
            report.retired = _retire(client, current, touched, producer, workspace)
    return report


def _of(producer: str, runs: Sequence[Any]) -> list[Any]:
    """The runs of one producer (and those logged before runs named theirs): another stage's
    row is never superseded, converged or retired by this one, whatever its key."""
    return [r for r in runs if r.data.tags.get(PRODUCER, producer) == producer]


def _sync(
    client: Any,
    exp_id: str,
    specs: Sequence[RunSpec],
    current: Sequence[Any],
    producer: str,
    workspace: str,
    threads: int = 1,
) -> SyncReport:
    by_row: dict[str, list[Any]] = {}
    for run in current:
        by_row.setdefault(run.data.tags.get(ROW_KEY, ""), []).append(run)
    retired: dict[str, list[Any]] = {}
    if any(s.row_key not in by_row for s in specs):  # a row back: is its retired run the same?
        for run in _retired_runs(client, exp_id, producer):
            retired.setdefault(run.data.tags.get(ROW_KEY, ""), []).append(run)

    def one(spec: RunSpec) -> SyncReport:
        return _sync_one(client, exp_id, spec, by_row, retired, producer, workspace)

    # the plots of the runs to be logged, drawn at once on every core (the others are not drawn)
    draw_all(p for s in specs if _logs_plots(s, by_row, retired) for p in s.plots.values())

    if threads <= 1 or len(specs) < 2:
        parts = [one(spec) for spec in specs]
    else:
        # a tracking server (or database) takes the rows' runs side by side: each run is several
        # round trips (create, log, upload, finish), seconds a row over a busy network
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            parts = list(pool.map(one, specs))
    report = SyncReport()
    for part in parts:
        for f in dataclasses.fields(SyncReport):
            setattr(report, f.name, getattr(report, f.name) + getattr(part, f.name))
    return report


def _sync_one(
    client: Any,
    exp_id: str,
    spec: RunSpec,
    by_row: Mapping[str, list[Any]],
    retired: Mapping[str, list[Any]],
    producer: str,
    workspace: str,
) -> SyncReport:
    """One row: its current run kept (updated in place) or a new run made (the old one
    superseded). Touches only this row's runs."""
    from mlflow.entities import Metric, Param, RunTag

    report = SyncReport()
    fp = fingerprint(spec.metrics, spec.tags)
    old, same = _match(by_row.get(spec.row_key, []), fp, spec)
    revive = False
    if old is None:
        old, revive = _revivable(retired.get(spec.row_key, []), fp, spec)
    if old is not None and (same or revive):
        recorded = old.data.tags
        updates = {
            f"{k}.latest": v
            for k, v in spec.tags.items()
            if bookkeeping(k) and recorded.get(f"{k}.latest", recorded.get(k, v)) != v
        }
        if updates:
            report.retagged += 1
        if old.data.tags.get(FINGERPRINT) != fp:  # logged under an older fingerprint rule
            updates[FINGERPRINT] = fp
            updates |= {k: v for k, v in spec.tags.items() if k not in recorded}
        owner = {PRODUCER: producer, WORKSPACE: workspace}
        if any(old.data.tags.get(k) != v for k, v in owner.items()):
            updates |= owner
            report.adopted += 1
        if updates:
            # Same result: record where it was last re-made, and who owns it now.
            client.log_batch(
                old.info.run_id, tags=[RunTag(k, v) for k, v in sorted(updates.items())]
            )
        added = {k: v for k, v in spec.params.items() if k not in old.data.params}
        if added:
            # Same result, params a newer lfbench shows (e.g. the sampling settings)
            client.log_batch(
                old.info.run_id, params=[Param(k, v) for k, v in sorted(added.items())]
            )
        recount = {
            k: float(v) for k, v in spec.counters.items() if old.data.metrics.get(k) != float(v)
        }
        if recount:
            # Same result, made again (its stage re-ran): its latest usage, in the same run.
            now = int(time.time() * 1000)
            client.log_batch(
                old.info.run_id,
                metrics=[Metric(k, v, now, 0) for k, v in sorted(recount.items())],
            )
            report.recounted += 1
        refresh = {
            k: spec.tags[k]
            for k in _REFRESHED
            if k in spec.tags and old.data.tags.get(k) != spec.tags[k]
        }
        if refresh:
            # Same result, new plots (another row of the plot changed): overwrite them.
            binary = {n: b for n, b in spec.artifacts.items() if isinstance(b, bytes)}
            binary |= drawn(spec.plots)
            _log_artifacts(client, old.info.run_id, binary)
            client.log_batch(old.info.run_id, tags=[RunTag(k, v) for k, v in refresh.items()])
            report.refreshed += 1
        if revive:
            # Its row is produced again with the same result: the retired run is current.
            _set_tag(client, old.info.run_id, RETIRED, "false")
            _delete_tag(client, old.info.run_id, SUPERSEDED_BY)
            _set_tag(client, old.info.run_id, CURRENT, "true")
            report.revived += 1
        else:
            report.skipped += 1
        return report
    tags = {
        **spec.tags,
        ROW_KEY: spec.row_key,
        FINGERPRINT: fp,
        PRODUCER: producer,
        WORKSPACE: workspace,
        CURRENT: "pending",  # "true" once complete: a crash leaves no half-made current run
        WRITER: _writer(),  # a later sync deletes the run if this process stops before
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
        metrics=[
            Metric(k, float(v), now, 0)
            for k, v in sorted({**spec.counters, **spec.metrics}.items())
        ],
        params=[Param(k, v) for k, v in sorted(spec.params.items())],
    )
    if spec.dataset is not None:
        _log_dataset(client, run_id, spec.dataset)
    _log_artifacts(
        client,
        run_id,
        {**spec.artifacts, **drawn(spec.plots), **{f.name: f.read_bytes() for f in spec.files}},
    )
    client.set_terminated(run_id, "FINISHED")
    client.set_tag(run_id, CURRENT, "true")
    report.created += 1
    for prior in by_row.get(spec.row_key, []):
        _set_tag(client, prior.info.run_id, CURRENT, "false")
        _set_tag(client, prior.info.run_id, SUPERSEDED_BY, run_id)
        report.superseded += 1
        t = prior.data.tags
        audited = t.get("audit.sample") or t.get("audit.samples") or t.get(AUDIT_PENDING)
        if audited:
            # its audit stays with it; `lfbench audit score` checks that the labels still
            # apply (same judge, same outputs) and computes it on this run
            _set_tag(client, run_id, AUDIT_PENDING, audited)
    return report


_proc_start = procs.start_time
_writer = procs.this_process
_writer_gone = procs.process_gone


def _clean_abandoned(client: Any, exp_id: str, *, locked: bool) -> int:
    """Delete the experiment's pending runs whose sync is over (the module docstring says which);
    `locked`: this sync holds the SQLite store's lock. Returns how many were deleted."""
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string=f"tags.`{CURRENT}` = 'pending'",
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    now_ms = time.time() * 1000
    deleted = 0
    for run in runs:
        tags = run.data.tags
        gone = True if locked else _writer_gone(tags.get(WRITER, ""))
        if gone is None:
            gone = now_ms - (run.info.start_time or 0) > PENDING_STALE_S * 1000
        if not gone:
            continue  # another process's sync is writing it now
        with contextlib.suppress(Exception):  # another sync cleaned it a moment ago
            client.delete_run(run.info.run_id)
            deleted += 1
            log.info(
                "row %s: deleted run %s, left pending (%s) by a sync that stopped half-way",
                tags.get(ROW_KEY),
                run.info.run_id,
                run.info.status,
            )
    return deleted


def _retired_runs(client: Any, exp_id: str, producer: str) -> list[Any]:
    """The producer's retired runs (one search, paged)."""
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string=f"tags.`{RETIRED}` = 'true' and tags.`{PRODUCER}` = '{producer}'",
            max_results=1000,
            page_token=token,
        )
        runs.extend(r for r in page if r.data.tags.get(CURRENT) == "false")
        token = page.token
        if not token:
            return runs


def _logs_plots(
    spec: RunSpec, by_row: Mapping[str, list[Any]], retired: Mapping[str, list[Any]]
) -> bool:
    """Whether the sync logs this spec's plots: a new run, or a kept one whose plots differ (what
    `_sync_one` decides, without touching the store)."""
    if not spec.plots:
        return False
    fp = fingerprint(spec.metrics, spec.tags)
    old, same = _match(by_row.get(spec.row_key, []), fp, spec)
    if old is None:
        old, same = _revivable(retired.get(spec.row_key, []), fp, spec)
    if old is None or not same:
        return True
    return any(old.data.tags.get(k) != spec.tags[k] for k in _REFRESHED if k in spec.tags)


def _revivable(runs: Sequence[Any], fp: str, spec: RunSpec) -> tuple[Any | None, bool]:
    """Of a row's retired runs, the latest with this result, if any."""
    same = [
        r for r in runs if r.data.tags.get(FINGERPRINT) == fp or stored_fingerprint(r, spec) == fp
    ]
    if not same:
        return None, False
    return max(same, key=lambda r: (r.info.start_time or 0, r.info.run_id)), True


def _match(runs: Sequence[Any], fp: str, spec: RunSpec) -> tuple[Any | None, bool]:
    """Of a row's current runs (one, or more after a killed or concurrent sync), the latest (the
    one convergence keeps), and whether it has this result (its fingerprint tag, or recomputed
    from its stored metrics and tags for a run logged under an older rule). An older current run
    with this result does not count: convergence would supersede it by the latest."""
    if not runs:
        return None, False
    latest = max(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))
    same = latest.data.tags.get(FINGERPRINT) == fp or stored_fingerprint(latest, spec) == fp
    return latest, same


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


def _delete_tag(client: Any, run_id: str, key: str) -> None:
    """Delete a tag that another sync reviving the same run may be deleting too."""
    _racing(
        lambda: client.delete_tag(run_id, key),
        done=lambda: key not in client.get_run(run_id).data.tags,
    )


def _converge(client: Any, current: Sequence[Any], row_keys: set[str]) -> tuple[int, int]:
    """Leave one current run per row among `row_keys` (the rule in the module docstring);
    returns how many identical duplicates were deleted and how many runs with another result
    were superseded."""
    groups: dict[str, list[Any]] = {}
    for run in current:
        key = run.data.tags.get(ROW_KEY, "")
        if key in row_keys:
            groups.setdefault(key, []).append(run)
    deleted = superseded = 0
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
                _set_tag(client, r.info.run_id, SUPERSEDED_BY, keep.info.run_id)
                superseded += 1
        log.info(
            "row %s: %d current runs (concurrent syncs, or a sync that stopped half-way); kept %s",
            key,
            len(runs),
            keep.info.run_id,
        )
    return deleted, superseded


def _retire(
    client: Any, current: Sequence[Any], row_keys: set[str], producer: str, workspace: str
) -> int:
    """Mark not current the runs of `producer` owned by this workspace whose row is not among
    `row_keys` (this sync's complete output): their row is no longer produced here."""
    retired = 0
    for run in current:
        tags = run.data.tags
        if tags.get(ROW_KEY, "") in row_keys:
            continue
        if tags.get(PRODUCER) != producer or tags.get(WORKSPACE) != workspace:
            continue
        run_id = run.info.run_id
        if client.get_run(run_id).data.tags.get(CURRENT) != "true":
            continue  # superseded by a concurrent sync meanwhile: its pointer stays
        _set_tag(client, run_id, RETIRED, "true")
        _set_tag(client, run_id, SUPERSEDED_BY, "none")
        _set_tag(client, run_id, CURRENT, "false")
        log.info(
            "row %s: no longer produced by %s; run %s retired", tags.get(ROW_KEY), producer, run_id
        )
        retired += 1
    return retired


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
