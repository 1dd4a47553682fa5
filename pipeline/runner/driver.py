"""`lfbench repro --jobs N [--cluster ADDR] [TARGETS]`: `dvc repro`, independent stages at once.

DVC runs the stages of a `dvc repro` one after another (treeverse/dvc#755), and two `dvc repro`
in one workspace contend for its lock. This driver runs exactly the stages `dvc repro` would,
each as soon as the stages it depends on are done, up to N at once, on Dask's distributed
scheduler (a local cluster in this process, or a cluster's scheduler; perf/task_engine.py for
why Dask and not Ray), and leaves the workspace as a serial `dvc repro` leaves it:

- **DVC's own steps.** The driver holds the repository's lock for the whole run and takes
  DVC's plan (the same stages, in the same order). Around each stage's command it
  does the steps `dvc repro` does (`pipeline/runner/steps.py`: changed?, the run-cache restore,
  removing its outputs, saving and committing them, its dvc.lock entry), the same steps a
  cluster worker does in its clone (`pipeline/runner/worker.py`). Only the command runs
  elsewhere (`pipeline/runner/task.py`); on a cluster, the whole stage does, and the driver
  writes the entry the worker sends back and pulls its outputs.
- **Byte for byte.** Every output and every dvc.lock entry is what `dvc repro` writes; each
  stage's upstream entries are in dvc.lock before it starts, the file replaced atomically
  (`pipeline/runner/lockfile.py`).
- **Cores.** A stage whose model or judge is an endpoint (provider `openai`) waits on it and
  takes no core; any other stage takes the cores its dvc.yaml `meta: {lfbench: {cores: N|all}}`
  asks (default 1) and is told so (`LFBENCH_WORKERS`, `LFBENCH_EMBED_WORKERS`): N jobs never
  run more CPU-bound work than there are cores.
- **Failures.** A failing stage stops the stages that depend on it, never the others; the run
  ends non-zero naming each failed stage and its log. Ctrl-C: running stages get one SIGINT and
  finish their requests in flight into their journals; a second Ctrl-C abandons them.
- **Alone in the project.** Before anything, a DVC command running in the project (a `dvc
  repro` whose stage command runs while DVC's lock is let go) stops the run
  (`pipeline/runner/alone.py`).
- **Look while it runs.** The driver publishes its state (`.lfbench/repro-state.json`,
  pipeline/core/live.py, replaced atomically) when a stage changes state and every few seconds:
  `lfbench status` reads it, and `lfbench plan` reads the project without DVC's lock when the
  lock is this run's.
- **Removed stages.** Before the plan, the dvc.lock entries of stages no longer in dvc.yaml (a
  model or judge taken out of params.yaml) are dropped and their outputs removed from the
  workspace (they stay in the DVC cache), so the folders the aggregates read are as before the
  model came (`pipeline/runner/prune.py`; also `lfbench prune` alone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import dvc_internals as dvc
from pipeline.core import live
from pipeline.core.errors import LfbenchError
from pipeline.env.containers import forget
from pipeline.runner.alone import refuse_if_dvc_runs
from pipeline.runner.clock import (
    _cmds,
    _ncpu,
    downstream_counts,
    stage_cores,
    stage_resources,
    worker_resources,
)
from pipeline.runner.cluster import DRIVER_CONNECT_S, check_address
from pipeline.runner.committed import shown, uncommitted
from pipeline.runner.lockfile import Lockfile
from pipeline.runner.prune import prune
from pipeline.runner.steps import RESTORED, RUN, UNCHANGED, StageSteps, check_runnable
from pipeline.runner.task import (
    SHIPPED,
    TaskResult,
    TaskSpec,
    abandon_event,
    progress_topic,
    run_here,
    stop_event,
)
from pipeline.runner.worker import run_in_clone
from pipeline.stages.tracking import workspace_id

log = logging.getLogger(__name__)

# the states a stage goes through (unchanged and restored: what `StageSteps.decide` says of
# a stage)
WAITING, RUNNING, DONE, FAILED, SKIPPED, STOPPED = (
    "waiting",
    "running",
    "done",
    "failed",
    "skipped",
    "stopped",
)
FINISHED = (DONE, UNCHANGED, RESTORED)
PUBLISH_EVERY_S = 2.0  # the published state of running stages (their progress), at most this old


@dataclass
class StageState:
    name: str
    index: int  # its place in the serial plan
    upstream: list[str]
    cores: int
    state: str = WAITING
    # of the stages ready at once, those more stages wait on go first (Dask's priority): here
    # the count of stages downstream of it in this run
    priority: int = 0
    ready: float | None = None  # its upstream stages all finished
    started: float | None = None  # submitted to Dask
    # its task holds a worker's slot (Dask queues what is submitted beyond --jobs): running
    began: float | None = None
    ended: float | None = None
    settled: float | None = None  # the driver saved its outputs (its dependents may start)
    progress: dict[str, Any] = field(default_factory=dict)
    result: TaskResult | None = None
    why: str = ""  # failed / skipped: the reason


@dataclass
class ReproResult:
    stages: dict[str, StageState]
    interrupted: bool = False

    @property
    def failed(self) -> list[StageState]:
        return [s for s in self.stages.values() if s.state == FAILED]

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(s.state in FINISHED for s in self.stages.values())


# ---------------------------------------------------------------- resources


def local_cluster_options(jobs: int) -> dict[str, Any]:
    """The driver's own Dask cluster (one machine): one in-process worker with `--jobs` slots
    and the machine's cores (`worker_resources`), everything on 127.0.0.1. Over TCP, not
    in-process comms, so that the stages (subprocesses) reach its scheduler for their
    endpoints' shared slots (`pipeline/llm/shared_limit.py`); no dashboard, and the HTTP server
    Dask's scheduler starts anyway (its metrics) on a free port of 127.0.0.1, not 8787 on every
    interface (a second run warned "Port 8787 is already in use", and anyone on the network
    could read it)."""
    threads, resources = worker_resources(jobs, _ncpu())
    return {
        "n_workers": 1,
        "threads_per_worker": threads,
        "processes": False,
        "protocol": "tcp://",
        "host": "127.0.0.1",
        "dashboard_address": None,
        "worker_dashboard_address": None,
        "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
        "resources": resources,
        "silence_logs": logging.ERROR,
    }


# ---------------------------------------------------------------- the run


class Repro:
    def __init__(
        self,
        root: Path,
        targets: Sequence[str] = (),
        *,
        jobs: int = 4,
        cluster: str | None = None,
        force: bool = False,
        view: Any = None,
        env: Mapping[str, str] | None = None,
        shared_cache: bool = True,
        connect_timeout: float = DRIVER_CONNECT_S,
    ) -> None:
        self.root = root.resolve()
        self.targets = list(targets)
        self.jobs = max(1, jobs)
        # --cluster: the address checked before anything (never printed with credentials)
        self.cluster = check_address(cluster) if cluster is not None else None
        self.shared_cache = shared_cache  # --no-shared-cache: each worker its own cache
        self.connect_timeout = connect_timeout
        self._engine: Any = None  # --cluster: the client, connected when the run starts
        self.force = force
        self.view = view
        self.env = dict(env or {})
        self.run_id = uuid.uuid4().hex[:12]
        self.states: dict[str, StageState] = {}
        self._stopping = 0  # Ctrl-C count
        self._events: tuple[Any, Any] | None = None  # Dask's stop and abandon events
        self._commit = ""  # --cluster: the commit workers must be at
        self._uncached: set[str] = set()  # --cluster: outputs kept out of the DVC cache
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._pull_s: float | None = None  # --cluster: the driver's pulls of the outputs
        self._pull_last_s: float | None = None  # of which the one after the last stage
        self._started_at = time.time()
        self._published: tuple[float, Any] = (0.0, None)  # when, and the states then

    # -- engine

    def _prepare_cluster(self, repo: Any) -> None:
        """Before a cluster run: this workspace's commit (its code must be committed: workers
        run the commit), the uncached outputs stages may read, and everything its outputs and
        run history hold pushed to the team's remote, so any worker can pull what it needs."""
        self._commit = identity_commit(self.root)
        self._uncached = {
            str(Path(o.fs_path).relative_to(self.root))
            for s in dvc.stages(repo)
            for o in s.outs
            if not o.use_cache and self.root in Path(o.fs_path).parents
        }
        # what differs from the commit, less what a repro itself changes (dvc.lock, params and
        # dvc.yaml, which travel with each stage; outputs; DVC's lines in .gitignore files)
        dirty = uncommitted(self.root, dvc.output_paths(repo))
        if dirty:
            raise LfbenchError(
                "--cluster: workers run the committed code; commit these first: " + shown(dirty)
            )
        dvc.push_everything(repo)

    def _start_engine(self, stack: contextlib.ExitStack) -> Any:
        """Dask: a local cluster in this process, started when the first stage must run (a run
        with nothing to do never imports it); or the `--cluster` scheduler, reached and its
        workers checked before anything else is done."""
        from distributed import Client, Event, LocalCluster

        # Dask's own INFO lines (scheduler and worker start, comms) say nothing to a user
        for name in ("distributed", "tornado"):
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
        if self.cluster:
            from pipeline.runner.cluster import check_workers, connect_client, identity

            client = stack.enter_context(connect_client(self.cluster, self.connect_timeout))
            check_workers(client, identity(self.root), shared_cache=self.shared_cache)
        else:
            lc = stack.enter_context(LocalCluster(**local_cluster_options(self.jobs)))
            client = stack.enter_context(Client(lc))
        self._events = (
            Event(stop_event(self.run_id), client),
            Event(abandon_event(self.run_id), client),
        )
        client.subscribe_topic(progress_topic(self.run_id), self._on_progress)
        return client

    # -- main loop

    def run(self) -> ReproResult:
        if logging.getLogger().level > logging.DEBUG:  # the live view says what DVC would
            logging.getLogger("dvc").setLevel(logging.WARNING)
        self._t0 = time.monotonic()
        repo = dvc.open_repo(self.root)
        with contextlib.ExitStack() as held:
            held.enter_context(dvc.locked(repo))
            # the lock is this run's: say so before anything (`lfbench plan` reads without it)
            held.enter_context(self._published_run())
            refuse_if_dvc_runs(repo)
            if self.cluster:  # the scheduler and its workers, before anything is done
                self._engine = self._start_engine(held)
            prune(repo)
            dvc.reload(repo)
            steps, upstream = dvc.plan(repo, self.targets)
            params = _raw_params(self.root)
            ncpu = _ncpu()
            by_name = {s.addressing: s for s in steps}
            for i, s in enumerate(steps):
                self.states[s.addressing] = StageState(
                    s.addressing, i, upstream[s.addressing], stage_cores(s, params, ncpu)
                )
            _count_downstream(self.states)
            locked_before = _lock_names(self.root)
            lock = Lockfile(repo)
            stage_steps = StageSteps(repo, force=self.force)
            if self.cluster:
                self._prepare_cluster(repo)
            lock.ignore_new_outputs(steps, set(locked_before))
            try:
                with contextlib.ExitStack() as stack, self._signals():
                    self._loop(stack, stage_steps, lock, by_name)
            finally:
                try:
                    lock.flush()  # what finished before an error in the loop keeps its entry
                    self._pull_adopted(lock)
                finally:
                    lock.order(locked_before, steps)
                    self._write_timeline()
                forget(self.root, f"repro-{self.run_id}")
        return ReproResult(self.states, interrupted=self._stopping > 0)

    def _loop(
        self,
        stack: contextlib.ExitStack,
        steps: StageSteps,
        lock: Lockfile,
        by_name: dict[str, Any],
    ) -> None:
        futures: dict[Any, str] = {}
        engine: list[Any] = []  # the client, once started

        def client() -> Any:
            if not engine:
                engine.append(self._engine or self._start_engine(stack))
            return engine[0]

        signalled = 0
        self._show()
        while True:
            if self._stopping and signalled < self._stopping and self._events is not None:
                self._events[min(signalled, 1)].set()
                signalled += 1
            if not self._stopping:
                self._start_ready(client, steps, lock, by_name, futures)
            lock.flush()  # what finished while nothing new could start
            if not futures:
                break
            from distributed import wait

            with contextlib.suppress(TimeoutError):
                wait(list(futures), timeout=0.5, return_when="FIRST_COMPLETED")
            done = [f for f in futures if f.done()]
            for fut in done:
                name = futures.pop(fut)
                self._finished(steps, lock, by_name[name], fut)
                # read: Dask may forget it. A future still held (this loop's variable kept the
                # last one until another stage finished) is one Dask recomputes when its worker
                # dies, and a cluster worker re-running a finished stage restores its outputs
                # under the stage that is reading them there (issue 43's CI: "file not found")
                fut.release()
            if not done and lock.to_pull:
                # --cluster, nothing finished for a while: pull what the workers made so far
                # now rather than all at the end
                self._pull_adopted(lock)
            self._show()
        for st in self.states.values():
            if st.state == WAITING and self._stopping:
                st.state, st.why = STOPPED, "Ctrl-C"
        self._show(final=True)

    def _start_ready(
        self,
        client: Callable[[], Any],
        steps: StageSteps,
        lock: Lockfile,
        by_name: dict[str, Any],
        futures: dict[Any, str],
    ) -> None:
        progressed = True
        while progressed:  # a stage found unchanged may make the next one ready
            progressed = False
            for name, st in sorted(
                self.states.items(), key=lambda kv: (-kv[1].priority, kv[1].index)
            ):
                if st.state != WAITING:
                    continue
                ups = [self.states[u] for u in st.upstream]
                bad = [u for u in ups if u.state in (FAILED, SKIPPED, STOPPED)]
                if bad:
                    st.state = SKIPPED
                    st.why = (
                        f"{bad[0].name} {'failed' if bad[0].state == FAILED else 'did not run'}"
                    )
                    progressed = True
                    continue
                if any(u.state not in FINISHED for u in ups):
                    continue
                st.ready = st.ready or time.monotonic()
                stage = by_name[name]
                upstream = [by_name[u] for u in st.upstream]
                try:
                    decided = self._decide(steps, lock, stage, upstream, ups)
                except Exception as e:  # noqa: BLE001 - a missing dependency, a DVC error
                    st.state, st.why = FAILED, f"{type(e).__name__}: {e}"
                    st.ended = time.monotonic()
                    progressed = True
                    continue
                if decided != RUNNING:
                    st.state = decided
                    progressed = True
                    continue
                # its upstream's dvc.lock entries first: a serial run has written them when a
                # stage starts, and aggregates read them (each MLflow run's stage digests);
                # the entries of all stages finished meanwhile go in one rewrite of the file
                lock.flush()
                st.state, st.started = RUNNING, time.monotonic()
                fut = client().submit(
                    run_in_clone if self.cluster else run_here,
                    self._spec(stage, st),
                    key=f"lfbench-{self.run_id}-{name}",
                    pure=False,
                    priority=st.priority,
                    resources=stage_resources(st.cores),
                )
                futures[fut] = name

    def _decide(
        self,
        steps: StageSteps,
        lock: Lockfile,
        stage: Any,
        upstream: list[Any],
        ups: list[StageState],
    ) -> str:
        """What becomes of a ready stage: UNCHANGED, RESTORED (its entry to write) or RUNNING.
        On one machine the driver does DVC's steps before the command; on a cluster it only
        asks whether the stage changed (an upstream that ran on a worker has its outputs on
        the remote, not here: then the worker decides) and the worker does the rest."""
        if self.cluster:
            if all(u.result is None for u in ups) and steps.unchanged(stage, upstream):
                return UNCHANGED
            check_runnable(stage)
            return RUNNING
        decided = steps.decide(stage, upstream)
        if decided == RESTORED:
            lock.add(stage, steps.entry(stage))
        return RUNNING if decided == RUN else decided

    def _spec(self, stage: Any, st: StageState) -> TaskSpec:
        env = {
            **self.env,
            # one runtime decision (and one warning) for the whole run, as under one dvc repro
            "LFBENCH_REPRO_KEY": f"repro-{self.run_id}",
            # stages share the workspace's response cache at once: a request two of them need
            # is sent by one, the other waits for its answer (claims)
            "LFBENCH_CACHE_CLAIMS": "1",
        }
        if not self.cluster:
            return TaskSpec(
                run=self.run_id,
                stage=st.name,
                cmds=_cmds(stage),
                env=env,
                cores=st.cores,
                cwd=str(self.root),
            )
        # the runs a worker's aggregate logs are this workspace's (it retires what it replaces)
        env["LFBENCH_WORKSPACE"] = workspace_id(self.root)
        files = {n: (self.root / n).read_bytes() for n in SHIPPED if (self.root / n).exists()}
        uncached = {}
        for dep in stage.deps:
            path = Path(dep.fs_path)
            rel = path.relative_to(self.root) if self.root in path.parents else None
            if rel is not None and str(rel) in self._uncached and path.is_file():
                uncached[str(rel)] = path.read_bytes()
        return TaskSpec(
            run=self.run_id,
            stage=st.name,
            cmds=_cmds(stage),
            env=env,
            cores=st.cores,
            cluster={
                "commit": self._commit,
                "files": files,
                "uncached": uncached,
                "force": self.force,
            },
        )

    def _finished(self, steps: StageSteps, lock: Lockfile, stage: Any, fut: Any) -> None:
        st = self.states[stage.addressing]
        st.ended = time.monotonic()
        try:
            res: TaskResult = fut.result()
        except Exception as e:  # noqa: BLE001 - the task itself failed (a worker lost 3 times)
            st.state, st.why = FAILED, f"{type(e).__name__}: {e}"
            return
        st.result = res
        where = f"{res.host}:{res.log}" if self.cluster else res.log
        if res.rc != 0:
            st.state = STOPPED if res.stopped else FAILED
            st.why = f"exit status {res.rc}; log: {where}" + (
                f" ({res.error})" if res.error else ""
            )
            return
        try:
            if self.cluster:
                assert res.lock_entry is not None
                lock.adopt(stage, res.lock_entry, res.files)
            else:
                steps.save(stage)
                lock.add(stage, steps.entry(stage))
        except Exception as e:  # noqa: BLE001 - an output missing, a cache error
            st.state, st.why = FAILED, f"{type(e).__name__}: {e}"
            return
        st.state = DONE if res.how == "ran" else RESTORED if res.how == "restored" else UNCHANGED
        st.settled = time.monotonic()

    def _write_timeline(self) -> None:
        """`.lfbench/logs/repro-<run>.json`: each stage's state and when (seconds from the
        start) it became ready, started, ended and was saved by the driver: where the time
        went (`perf/parallel_models.py` reads it)."""
        t0 = self._t0
        if t0 is None:
            return

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 2)

        rows = [
            {
                "stage": st.name,
                "state": st.state,
                "cores": st.cores,
                "ready": rel(st.ready),
                "started": rel(st.started),
                "ended": rel(st.ended),
                "settled": rel(st.settled),
                "host": st.result.host if st.result else None,
                "phases": st.result.phases if st.result else {},
            }
            for st in sorted(self.states.values(), key=lambda s: s.index)
        ]
        path = self.root / ".lfbench" / "logs" / f"repro-{self.run_id}.json"
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "run": self.run_id,
                "stages": rows,
                "driver_pull_s": self._pull_s,
                "driver_last_pull_s": self._pull_last_s,
            }
            path.write_text(json.dumps(doc, indent=1) + "\n")

    def _pull_adopted(self, lock: Lockfile) -> None:
        t0 = time.monotonic()
        for name in lock.pull_adopted():
            st = self.states[name]
            st.state, st.why = FAILED, "its outputs could not be pulled from the DVC remote"
        self._pull_s = round((self._pull_s or 0.0) + time.monotonic() - t0, 2)
        if all(s.state not in (WAITING, RUNNING) for s in self.states.values()):
            self._pull_last_s = round(time.monotonic() - t0, 2)

    def _on_progress(self, event: Any) -> None:
        _, msg = event
        if isinstance(msg, dict) and msg.get("stage") in self.states:
            with self._lock:
                st = self.states[msg["stage"]]
                if msg.get("began"):
                    st.began = st.began or time.monotonic()
                else:
                    st.progress = msg

    def _show(self, final: bool = False) -> None:
        self._publish()
        if self.view is not None:
            self.view.update(self.states, final=final)

    @contextlib.contextmanager
    def _published_run(self) -> Iterator[None]:
        self._publish()
        try:
            yield
        finally:
            self._publish(final=True)

    def _publish(self, final: bool = False) -> None:
        """The run's state for `lfbench status` and `lfbench plan` (pipeline/core/live.py): on
        every change of a stage's state, and every PUBLISH_EVERY_S while stages run."""
        now = time.monotonic()
        states = tuple((st.name, st.state) for st in self.states.values())
        when, before = self._published
        if not final and states == before and now - when < PUBLISH_EVERY_S:
            return
        self._published = (now, states)
        t0 = self._t0 or now

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 2)

        doc = {
            "run": self.run_id,
            "pid": os.getpid(),
            "started_at": self._started_at,
            "updated_at": time.time(),
            "elapsed_s": round(now - t0, 2),
            "jobs": self.jobs,
            "cluster": self.cluster is not None,
            "targets": self.targets,
            "finished": ("interrupted" if self._stopping else "ended") if final else None,
            "stages": [
                {
                    "stage": st.name,
                    "state": st.state,
                    "started": rel(st.started),
                    "ended": rel(st.ended),
                    "progress": {
                        k: v for k, v in st.progress.items() if k in ("done", "total", "errors")
                    },
                    "why": st.why,
                }
                for st in sorted(self.states.values(), key=lambda s: s.index)
            ],
        }
        with contextlib.suppress(OSError):
            live.publish(self.root, doc)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """Ctrl-C (and SIGTERM): the first lets running stages finish their requests in flight;
        the second abandons them."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            self._stopping += 1
            if self._stopping == 1:
                log.warning(
                    "stopping: running stages finish their requests in flight (Ctrl-C again to"
                    " abandon them)"
                )
            else:
                log.warning("abandoning the running stages")

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


# ---------------------------------------------------------------- helpers


def _count_downstream(states: Mapping[str, StageState]) -> None:
    """Each stage's priority: how many stages of the run are downstream of it."""
    counts = downstream_counts({name: list(st.upstream) for name, st in states.items()})
    for name, st in states.items():
        st.priority = counts[name]


def identity_commit(root: Path) -> str:
    from pipeline.core.lineage import git_info

    return git_info(root).commit


def _raw_params(root: Path) -> dict[str, Any]:
    from pipeline.core.config import load_yaml

    data = load_yaml(root / "params.yaml") if (root / "params.yaml").exists() else {}
    return data if isinstance(data, dict) else {}


def _lock_names(root: Path) -> list[str]:
    from pipeline.core.lineage import load_yaml_text as _load_yaml

    path = root / "dvc.lock"
    if not path.exists():
        return []
    data = _load_yaml(path.read_text(encoding="utf-8")) or {}
    return list((data.get("stages") or {}).keys())


def summary(result: ReproResult) -> list[str]:
    """The lines the command ends with: what ran, and each failure with its log."""
    counts: dict[str, int] = {}
    for st in result.stages.values():
        counts[st.state] = counts.get(st.state, 0) + 1
    order = [DONE, RESTORED, UNCHANGED, FAILED, SKIPPED, STOPPED, RUNNING, WAITING]
    lines = [
        "stages: " + ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)),
    ]
    for st in result.stages.values():
        if st.state == FAILED:
            lines.append(f"failed: {st.name}: {st.why}")
    for st in result.stages.values():
        if st.state == SKIPPED:
            lines.append(f"not run: {st.name} ({st.why})")
    return lines


def run_repro(
    root: Path,
    targets: Sequence[str] = (),
    *,
    jobs: int = 8,
    cluster: str | None = None,
    force: bool = False,
    view: Any = None,
    shared_cache: bool = True,
    connect_timeout: float = DRIVER_CONNECT_S,
) -> ReproResult:
    """`lfbench repro`: DVC's errors (an unknown target, the lock held by another DVC process)
    as one line each, not a traceback."""
    try:
        return Repro(
            root,
            targets,
            jobs=jobs,
            cluster=cluster,
            force=force,
            view=view,
            shared_cache=shared_cache,
            connect_timeout=connect_timeout,
        ).run()
    except dvc.DvcError as e:
        raise LfbenchError(f"dvc: {e}") from e


def failed_log_tail(st: StageState, n: int = 15) -> str:
    if st.result is None:
        return ""
    path = Path(st.result.log)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(f"    {line}" for line in lines[-n:])
