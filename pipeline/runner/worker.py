"""A stage on a cluster worker (`lfbench worker`), in the worker's own clone: the Dask task of
`lfbench repro --cluster`.

The worker owns one clone of the project at the driver's commit, configured like every machine
of the team (README, "Team scale": the team's DVC remote, MLflow server and response cache in
its environment). For a stage the driver sends (`TaskSpec.cluster`): the driver's params.yaml,
dvc.yaml and dvc.lock (with the entries of the stages finished so far; each replaced whole in
the clone, where other stages may be reading it) and the bytes of the uncached outputs the
stage reads (metrics files kept in git). In its clone the worker then does what `dvc repro
--pull` would do for that one stage: it pulls the outputs the stage depends on from the remote,
then the DVC steps around the command that the one-machine driver does too
(`pipeline/runner/steps.py`: decide, restore from the run cache, run, save, commit), with the
team's remote taking part (the run cache's entries of the stage looked for there, its outputs
and entry pushed), and returns its dvc.lock entry and its uncached outputs. Several stages of
one clone run at once: the DVC steps under the repository's lock, the commands outside it, as
DVC does. A stage sent to a clone whose tracked files are not its commit is refused
(`committed.clone_changes`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline import dvc_internals as dvc
from pipeline.core.errors import LfbenchError
from pipeline.core.io import write_if_changed
from pipeline.runner.committed import clone_changes, head_commit, modified
from pipeline.runner.steps import RUN, StageSteps
from pipeline.runner.task import (
    SHIPPED,
    TaskResult,
    TaskSpec,
    began,
    log_path,
    run_commands,
)

ENV_CLONE = "LFBENCH_WORKER_CLONE"
_CLONE_LOCKS: dict[str, threading.Lock] = {}


def _thread_lock(clone: Path) -> threading.Lock:
    return _CLONE_LOCKS.setdefault(str(clone), threading.Lock())


@contextlib.contextmanager
def _locked(clone: Path, repo: Any) -> Iterator[Any]:
    """This clone's DVC repository, locked: one task at a time does DVC steps in it (a task
    keeps its own repository between its two locked parts: the index is built once per
    task)."""
    with _thread_lock(clone), dvc.locked(repo):
        yield repo


def _worker_label(host: str) -> str:
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return host
    return f"{worker.name} on {host}" if worker.name != worker.address else worker.address


def _stale(repo: Any, targets: list[str]) -> list[Any]:
    """Of these stages and .dvc files, those whose outputs in this clone are not the ones the
    lock says (missing or different): only they are pulled (a `dvc pull` of all of them asks
    the remote and walks every file again, seconds a stage)."""
    by_name = {s.addressing: s for s in dvc.stages(repo)}
    stale = []
    for target in targets:
        owner = by_name.get(target)
        if owner is None:
            raise LfbenchError(f"{target}: not a stage of this clone's dvc.yaml")
        if dvc.outputs_differ(owner):
            stale.append(owner)
    return stale


def run_in_clone(spec: TaskSpec) -> TaskResult:
    """The cluster task: one stage, in this worker's clone, as `dvc repro --pull` would run it,
    then pushed."""
    started = time.monotonic()
    began(spec)
    host = socket.gethostname()
    clone = Path(os.environ.get(ENV_CLONE, ""))
    if not clone.is_dir():
        return TaskResult(spec.stage, 2, host, "", 0.0, error="not an lfbench worker (no clone)")
    payload = spec.cluster
    log = log_path(clone, spec.stage)
    log.unlink(missing_ok=True)
    phases: dict[str, float] = {}
    mark = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - mark[0], 2)
        mark[0] = now

    def result(rc: int, **kw: Any) -> TaskResult:
        return TaskResult(
            spec.stage, rc, host, str(log), time.monotonic() - started, phases=phases, **kw
        )

    head = head_commit(clone)
    if head != payload["commit"]:
        return result(2, error=f"{clone} is at {head}, the driver at {payload['commit']}")
    with _thread_lock(clone):
        repo = dvc.open_repo(clone, reuse_remotes=True)
    steps = StageSteps(repo, force=bool(payload.get("force")), remote=True)
    with repo:  # one per task: its index is built once
        with _locked(clone, repo):
            lap("wait")
            # other stages of this clone may be running and reading these (params.yaml,
            # an aggregate's dvc.lock lineage): each file replaced whole, and only if it changed
            for name in SHIPPED:
                if name in payload["files"]:
                    write_if_changed(clone / name, payload["files"][name])
            for rel, data in payload["uncached"].items():
                write_if_changed(clone / rel, data)
            dvc.reload(repo)
            stage = next(s for s in dvc.stages(repo) if s.addressing == spec.stage)
            lap("load")
            # the stage runs this clone's code: refused if its tracked files are not the commit
            dirty = clone_changes(clone, head, lambda: dvc.output_paths(repo))
            lap("check")
            if dirty:
                return result(2, error=modified(_worker_label(host), clone, head, dirty))
            owners = dvc.producers(repo, stage)
            if (clone / "data.dvc").exists():
                # stages read data/ but depend on data.sources.yaml (its pins, checked by the
                # stage): the clone's data/ is the one data.dvc records, from the remote if it
                # is not here
                owners.append("data.dvc")
            lap("load")
            failed = dvc.pull_outputs(repo, _stale(repo, owners))
            if failed:
                raise LfbenchError(
                    f"stage {spec.stage}: the outputs of {', '.join(failed)} it depends on are"
                    " neither in this clone nor on the DVC remote"
                )
            lap("pull")
            decided = steps.decide(stage, lap=lap)  # `lfbench repro -f`: run, as `dvc repro -f`
            lap("restore")
        stopped = False
        if decided == RUN:
            env = {**os.environ, **spec.env, "DVC_ROOT": str(clone), "DVC_STAGE": spec.stage}
            rc, stopped = run_commands(spec, clone, log, env)
            lap("run")
            if rc != 0:
                return result(rc, stopped=stopped)
        with _locked(clone, repo):
            lap("wait")
            if decided == RUN:
                steps.save(stage)
            lap("save")
            steps.push(stage, lap)
            entry = steps.entry(stage)
            files = {
                str(Path(out.fs_path).relative_to(clone)): Path(out.fs_path).read_bytes()
                for out in stage.outs
                if not out.use_cache and Path(out.fs_path).is_file()
            }
            lap("run_cache")
        how = "ran" if decided == RUN else decided  # or unchanged, restored
        return result(0, stopped=stopped, lock_entry=entry, files=files, how=how)
