"""`lfbench repro --jobs N [--cluster ADDR] [TARGETS]`: `dvc repro`, independent stages at once.

DVC runs the stages of a `dvc repro` one after another (treeverse/dvc#755), and two `dvc repro`
in one workspace contend for its lock. This driver runs exactly the stages `dvc repro` would,
each as soon as the stages it depends on are done, up to N at once, on Dask's distributed
scheduler (a local cluster in this process, or a cluster's scheduler; perf/task_engine.py for
why Dask and not Ray), and leaves the workspace as a serial `dvc repro` leaves it:

- **DVC's own steps, in one process.** The driver holds the repository's lock for the whole run
  and makes, for every stage, the calls `dvc repro` makes (dvc/repo/reproduce.py,
  dvc/stage/__init__.py): the plan (`plan_repro`: the same stages, in the same order), whether
  a stage changed once its upstream stages are done, the run-cache restore, removing its
  outputs, saving and committing them, its dvc.lock entry. Only the stage's command runs
  elsewhere (pipeline/runner/task.py).
- **Byte for byte.** Every output and every dvc.lock entry is what `dvc repro` writes. A
  stage's entry is written as soon as it is done (an aggregate reads its upstream stages'
  entries for its MLflow lineage, as under `dvc repro`); existing entries are updated in place,
  and the file is replaced atomically (running stages read it: never a half-written file).
  Entries new to dvc.lock (a model added) and their outputs' .gitignore lines go in dvc.yaml's
  order (`declared`): a serial `dvc repro` appends them in an order that changes from one run
  to the next (its plan follows Python's string hashing), this one in the same order each time.
- **Cores.** A stage whose model or judge is an endpoint (provider `openai`) waits on it and
  takes no core; any other stage takes the cores its dvc.yaml `meta: {lfbench: {cores: N|all}}`
  asks (default 1) and is told so (`LFBENCH_WORKERS`, `LFBENCH_EMBED_WORKERS`): N jobs never
  run more CPU-bound work than there are cores.
- **Failures.** A failing stage stops the stages that depend on it, never the others; the run
  ends non-zero naming each failed stage and its log. Ctrl-C: running stages get one SIGINT and
  finish their requests in flight into their journals; a second Ctrl-C abandons them.
- **Alone in the project.** Before anything, a DVC command running in the project (a `dvc
  repro` whose stage command runs while DVC's lock is let go) stops the run (`running_dvc`).
- **Removed stages.** Before the plan, the dvc.lock entries of stages no longer in dvc.yaml (a
  model or judge taken out of params.yaml) are dropped and their outputs removed from the
  workspace (they stay in the DVC cache), so the folders the aggregates read are as before the
  model came (`prune`; also `lfbench prune` alone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import ConfigError, LfbenchError
from pipeline.core.io import atomic_write_text, write_if_changed
from pipeline.env.containers import forget
from pipeline.runner.cluster import (
    DRIVER_CONNECT_S,
    SHIPPED,
    check_address,
    dvc_outputs,
    pull_outputs,
    shown,
    uncommitted,
)
from pipeline.runner.task import (
    TaskResult,
    TaskSpec,
    abandon_event,
    progress_topic,
    run_stage,
    stop_event,
)
from pipeline.stages.tracking import workspace_id

log = logging.getLogger(__name__)

ENDPOINT_PROVIDERS = ("openai",)
# the states a stage goes through, in the order the live view sorts them
WAITING, RUNNING, DONE, UNCHANGED, RESTORED, FAILED, SKIPPED, STOPPED = (
    "waiting",
    "running",
    "done",
    "unchanged",
    "restored",
    "failed",
    "skipped",
    "stopped",
)
FINISHED = (DONE, UNCHANGED, RESTORED)


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
    started: float | None = None
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


def stage_cores(stage: Any, params: Mapping[str, Any], ncpu: int) -> int:
    """The cores a stage takes: 0 for one that waits on an endpoint (its model or judge has
    provider `openai`), else its dvc.yaml `meta.lfbench.cores` (`all` or N; default 1)."""
    argv = shlex.split(" ".join(_cmds(stage)))
    for flag, section in (("--model", "models"), ("--judge", "judges")):
        if flag in argv[:-1]:
            name = argv[argv.index(flag) + 1]
            entry = (params.get(section) or {}).get(name) or {}
            endpoint = isinstance(entry, Mapping) and entry.get("provider") in ENDPOINT_PROVIDERS
            if endpoint and ("generate" in argv or flag == "--judge"):
                return 0
    meta = getattr(stage, "meta", None) or {}
    want = (meta.get("lfbench") or {}).get("cores", 1) if isinstance(meta, Mapping) else 1
    if want == "all":
        return ncpu
    try:
        return max(1, min(ncpu, int(want)))
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"dvc.yaml: stage {stage.addressing}: meta.lfbench.cores {want!r}: use all or a number"
        ) from e


def _cmds(stage: Any) -> list[str]:
    cmd = stage.cmd
    return list(cmd) if isinstance(cmd, list) else str(cmd).splitlines()


# ---------------------------------------------------------------- the DVC side


class DvcSide:
    """What `dvc repro` does around a stage's command, done by the driver (under the lock)."""

    def __init__(self, repo: Any, force: bool = False, remote: bool = False) -> None:
        self.repo = repo
        self.force = force
        self.remote = remote  # the stages run in workers' clones (--cluster)
        # finished stages whose dvc.lock entries are not written yet: `flush` writes them in one
        # rewrite of dvc.lock (DVC rewrites the whole file per stage, about a second for 100 kB)
        self.pending: list[Any] = []
        self.adopted: dict[str, Mapping[str, Any]] = {}  # --cluster: entries to write
        self.to_pull: list[str] = []  # --cluster: stages whose outputs are pulled at the end
        # each dvc.lock as last written (DVC's round-trip YAML) and its stat signature then
        self._lock_docs: dict[Path, tuple[Any, tuple[int, int, int] | None]] = {}

    def prepare(self, stage: Any, upstream: list[Any]) -> str:
        """Before the command: UNCHANGED (nothing to do), RESTORED (from the run cache, saved,
        committed, dumped) or RUNNING (outputs removed, dependencies saved: run the command;
        on a cluster the worker does both in its clone)."""
        from dvc.stage.cache import RunCacheNotFoundError

        if not self.force and not stage.changed(False, upstream):
            log.debug("stage %s did not change", stage.addressing)
            return UNCHANGED
        if stage.frozen or not stage.cmd:
            raise ConfigError(f"stage {stage.addressing}: frozen or without a command")
        if not self.remote:
            stage.remove_outs(ignore_remove=False, force=False)
        if not self.force:
            try:
                self.repo.stage_cache.restore(stage, pull=self.remote)
            except RunCacheNotFoundError:
                pass
            else:
                self.finish(stage)
                return RESTORED
        if not self.remote:
            stage.save_deps()
        return RUNNING

    def check_runnable(self, stage: Any) -> str:
        if stage.frozen or not stage.cmd:
            raise ConfigError(f"stage {stage.addressing}: frozen or without a command")
        return RUNNING

    def adopt(self, name: str, entry: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
        """A stage a worker ran (--cluster): its uncached outputs as they came, its dvc.lock
        entry, and its cached outputs pulled from the remote into this workspace."""

        root = Path(self.repo.root_dir)
        for rel, data in files.items():
            path = (root / rel).resolve()
            if root not in path.parents:
                raise LfbenchError(f"stage {name}: a worker sent {rel}, outside the workspace")
            write_if_changed(path, data)
        self.adopted[name] = dict(entry[name]) if name in entry else dict(entry)

    def finish(self, stage: Any) -> None:
        """After a successful command (or a restore): what `Stage.run` does next. Its dvc.lock
        entry is written by the next `flush`."""
        no_cache_outs = any(
            not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot)
        )
        stage.save(allow_missing=False, run_cache=not no_cache_outs)
        stage.commit(allow_missing=False)
        self.pending.append(stage)

    def flush(self) -> None:
        """Write the dvc.lock entries of the stages finished since the last flush (and, on a
        cluster, adopted from workers) in one rewrite of the file (of each dvc.lock: a stage of
        a dvc.yaml in a subfolder goes into the dvc.lock beside it, as DVC writes it)."""
        from dvc.stage.serialize import to_lockfile

        if self.pending:
            by_lock: dict[Path, dict[str, Any]] = {}
            for stage in self.pending:
                path = Path(stage.dvcfile.path).with_suffix(".lock")
                by_lock.setdefault(path, {}).update(to_lockfile(stage))
            for path, entries in by_lock.items():
                self._write_lock(entries, path)
            self.pending = []
        if self.adopted:
            adopted, self.adopted = self.adopted, {}
            self._write_lock(adopted)
            self.to_pull += list(adopted)

    def pull_adopted(self) -> list[str]:
        """--cluster: the outputs of the stages workers ran so far, pulled from the remote into
        this workspace: their objects by hash in one transfer, then each stage checked out (as
        DVC's run-cache restore does; `dvc pull <stages>` builds an index per target, tens of
        seconds for fifty stages). Returns the names of stages whose outputs could not be
        pulled."""
        names, self.to_pull = self.to_pull, []
        if not names:
            return []
        self.repo._reset()  # the stages as their adopted dvc.lock entries say
        stages = {s.addressing: s for s in self.repo.index.stages}
        return pull_outputs(self.repo, [stages[name] for name in names])

    def _lock_path(self) -> Path:
        return Path(self.repo.root_dir) / "dvc.lock"

    def _read_lock(self, path: Path | None = None) -> Any:
        """dvc.lock parsed as DVC's round-trip YAML ({} when absent), the copy kept from the
        last write while nobody else changed the file: parsing a 200-kB dvc.lock takes DVC
        longer than writing it."""
        path = path or self._lock_path()
        kept = self._lock_docs.get(path)
        if kept is not None and kept[1] == _file_sig(path):
            return kept[0]
        return read_lock_doc(path)

    def _dump_lock(self, data: Any, path: Path | None = None) -> None:
        path = path or self._lock_path()
        write_lock_doc(path, data)
        self._lock_docs[path] = (data, _file_sig(path))

    def _write_lock(self, entries: Mapping[str, Any], path: Path | None = None) -> None:
        """These entries into dvc.lock, as DVC's `Lockfile.dump_stages` writes them (its
        round-trip YAML, entries updated in place or appended), but atomically: stages that
        are running read it (an aggregate's lineage), and DVC's own writer rewrites it in
        place, so a reader could find it half-written."""
        if not entries:
            return
        path = path or self._lock_path()
        data = self._read_lock(path)
        if not data:
            data.update({"schema": "2.0"})
            log.info("Generating lock file '%s'", path.relative_to(self.repo.root_dir))
        data["stages"] = data.get("stages", {})
        changed = any(data["stages"].get(k, {}) != v for k, v in entries.items())
        data["stages"].update(entries)
        self._dump_lock(data, path)
        if changed:
            self.repo.scm_context.track_file(str(path.relative_to(self.repo.root_dir)))

    def ignore_new_outputs(self, stages: Sequence[Any], locked: set[str]) -> None:
        """Write the .gitignore lines of new stages' outputs, in `declared` order (a serial run
        writes them as each stage saves its outputs, in its plan's order)."""
        for stage in declared(self.repo, stages):
            if stage.addressing in locked:
                continue
            for out in stage.outs:
                if out.use_scm_ignore and not _is_tracked(out):
                    Path(out.fspath).parent.mkdir(parents=True, exist_ok=True)
                    out.ignore()
        # scmrepo caches git's ignore rules (dulwich's IgnoreFilterManager): without a reset,
        # the stage's own save would not see these lines and append them again
        for backend in self.repo.scm.backends.values():
            if not isinstance(backend, type):
                backend.__dict__.pop("ignore_manager", None)

    def order_lock(self, before: Sequence[str], stages: Sequence[Any]) -> None:
        """Entries new to dvc.lock in `declared` order; entries that were there keep their
        places (as under `dvc repro`, which updates them in place). The file is rewritten only
        when the order differs."""
        if not (Path(self.repo.root_dir) / "dvc.lock").exists():
            return
        rank = {s.addressing: i for i, s in enumerate(declared(self.repo, stages))}
        data = self._read_lock()
        entries = data.get("stages") or {}
        new = [k for k in entries if k not in set(before)]
        want = sorted(new, key=lambda k: rank.get(k, len(rank)))
        if new != want:
            for k in want:
                entries[k] = entries.pop(k)
            self._dump_lock(data)


def declared(repo: Any, stages: Sequence[Any]) -> list[Any]:
    """`stages` in the order dvc.yaml declares them (matrix items in their params' order).

    The order in which a serial `dvc repro` appends new stages to dvc.lock (and their outputs to
    .gitignore files) is its plan's, a depth-first walk of a graph whose iteration order follows
    Python's string hashing: two runs of the same `dvc repro` order new entries differently
    (PYTHONHASHSEED). `lfbench repro` writes them in this order instead, the same every time."""
    rank = {s.addressing: i for i, s in enumerate(repo.index.stages)}
    return sorted(stages, key=lambda s: rank.get(s.addressing, len(rank)))


def _is_tracked(out: Any) -> bool:
    try:
        return bool(out.repo.scm.is_tracked(out.fspath))
    except Exception:  # noqa: BLE001
        return False


# ---------------------------------------------------------------- pruning


def prune(repo: Any, *, force: bool = False) -> list[str]:
    """Drop the dvc.lock entries of stages no longer in dvc.yaml (a model or judge removed from
    params.yaml) and remove their outputs from the workspace and .gitignore (they stay in the
    DVC cache), unless a stage of dvc.yaml still declares them. An output whose content is not
    in the DVC cache (edited by hand since its stage made it, or made with `cache: false`)
    would be lost: nothing is pruned and the error names it, unless `force`, which saves it in
    the cache first (and logs where). Returns the stages pruned."""
    from pipeline.core.config import load_yaml

    root = Path(repo.root_dir)
    lock = root / "dvc.lock"
    if not lock.exists():
        return []
    names = {s.addressing for s in repo.index.stages}
    declared = {str(Path(out.fs_path).resolve()) for s in repo.index.stages for out in s.outs}
    entries = (load_yaml(lock) or {}).get("stages") or {}
    doomed: list[tuple[str, Path]] = []
    for name, entry in entries.items():
        if name in names:
            continue
        for out in entry.get("outs") or []:
            path = (root / str(out.get("path", ""))).resolve()
            if not out.get("path") or str(path) in declared or root not in path.parents:
                continue
            doomed.append((name, path))
    unsaved = [(name, path) for name, path in doomed if not _in_cache(repo, path)]
    if unsaved and not force:
        shown = ", ".join(f"{p.relative_to(root)} (stage {n})" for n, p in unsaved)
        raise LfbenchError(
            f"prune: {shown}: its content is not in the DVC cache (edited by hand since its"
            " stage made it?), so removing it would lose it; nothing pruned. Move it out of the"
            " way, or `lfbench prune --force` to save it in the DVC cache first and remove it"
        )
    for name, path in unsaved:
        kept = _save_in_cache(repo, path)
        log.warning(
            "prune: %s (stage %s) was not in the DVC cache: saved there as %s before removing it",
            path.relative_to(root),
            name,
            kept.relative_to(root) if root in kept.parents else kept,
        )
    gone: list[str] = []
    data = read_lock_doc(lock)
    data_entries = data.get("stages") or {}
    for name in [k for k in data_entries if k not in names]:
        data_entries.pop(name)
        gone.append(name)
    if gone:
        write_lock_doc(lock, data)
    for _, path in doomed:
        _remove_output(repo, root, path)
    for name in gone:
        log.info("pruned stage %s (no longer in dvc.yaml): its lock entry and outputs", name)
    return gone


def _built(repo: Any, path: Path) -> tuple[Any, Any, Any]:
    """The workspace content at `path` as DVC's cache would hold it (staging, odb, object)."""
    from dvc_data.hashfile.build import build

    odb = repo.cache.local
    staging, _, obj = build(odb, str(path), repo.fs, odb.hash_name)
    return staging, odb, obj


def _in_cache(repo: Any, path: Path) -> bool:
    """Whether the content at `path` (a file, or every file of a folder) is in the DVC cache,
    so removing it from the workspace loses nothing (`dvc checkout` brings it back)."""
    from dvc_data.hashfile import check

    if not path.exists():
        return True  # nothing to lose
    _, odb, obj = _built(repo, path)
    try:
        check(odb, obj, check_hash=False)
    except (FileNotFoundError, OSError, ValueError):
        return False
    return True


def _save_in_cache(repo: Any, path: Path) -> Path:
    """Copy the content at `path` into the DVC cache; the path of its cache object."""
    from dvc_data.hashfile.transfer import transfer

    staging, odb, obj = _built(repo, path)
    transfer(staging, odb, {obj.hash_info}, shallow=False, hardlink=False)
    return Path(odb.oid_to_path(obj.oid))


def _remove_output(repo: Any, root: Path, path: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    with contextlib.suppress(Exception):  # not ignored, or ignored by hand: leave it
        repo.scm_context.ignore_remove(str(path))
    folder = path.parent
    # a model's judgement folder left empty (its .gitignore gone with the last line)
    while folder != root and folder.exists() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


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

    # -- engine

    def _prepare_cluster(self, repo: Any, steps: Sequence[Any]) -> None:
        """Before a cluster run: this workspace's commit (its code must be committed: workers
        run the commit), the uncached outputs stages may read, and everything its outputs and
        run history hold pushed to the team's remote, so any worker can pull what it needs."""
        self._commit = identity_commit(self.root)
        self._uncached = {
            str(Path(o.fs_path).relative_to(self.root))
            for s in repo.index.stages
            for o in s.outs
            if not o.use_cache and self.root in Path(o.fs_path).parents
        }
        # what differs from the commit, less what a repro itself changes (dvc.lock, params and
        # dvc.yaml, which travel with each stage; outputs; DVC's lines in .gitignore files)
        dirty = uncommitted(self.root, dvc_outputs(repo))
        if dirty:
            raise LfbenchError(
                "--cluster: workers run the committed code; commit these first: " + shown(dirty)
            )
        try:
            repo.push()
        except Exception as e:  # noqa: BLE001 - outputs not made yet are reported, not fatal
            log.debug("push before the cluster run: %s", e)
        with contextlib.suppress(Exception):  # the keys the other side lacks (DVC's own
            # push and pull of the run cache copy every entry again, each time)
            odb = repo.cloud.get_remote_odb(None, "run cache", hash_name="md5-dos2unix")
            repo.stage_cache.transfer(repo.cache.legacy, odb, force=False)
            repo.stage_cache.transfer(odb, repo.cache.legacy, force=False)

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
            lc = stack.enter_context(
                LocalCluster(
                    n_workers=1,
                    threads_per_worker=self.jobs,
                    processes=False,
                    dashboard_address=None,
                    resources={"cores": _ncpu()},
                    silence_logs=logging.ERROR,
                )
            )
            client = stack.enter_context(Client(lc))
        self._events = (
            Event(stop_event(self.run_id), client),
            Event(abandon_event(self.run_id), client),
        )
        client.subscribe_topic(progress_topic(self.run_id), self._on_progress)
        return client

    # -- main loop

    def run(self) -> ReproResult:
        from dvc.repo import Repo
        from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

        if logging.getLogger().level > logging.DEBUG:  # the live view says what DVC would
            logging.getLogger("dvc").setLevel(logging.WARNING)
        self._t0 = time.monotonic()
        repo = Repo(str(self.root))
        with contextlib.ExitStack() as held:
            held.enter_context(_locked(repo))
            held.enter_context(repo.scm_context(quiet=True))
            refuse_if_dvc_runs(repo)
            if self.cluster:  # the scheduler and its workers, before anything is done
                self._engine = self._start_engine(held)
            prune(repo)
            repo._reset()
            graph = get_active_graph(repo.index.graph)
            chosen = collect_stages(repo, self.targets or ["dvc.yaml"])
            steps = plan_repro(graph, chosen)
            params = _raw_params(self.root)
            ncpu = _ncpu()
            by_name = {s.addressing: s for s in steps}
            for i, s in enumerate(steps):
                up = [u.addressing for u in graph.successors(s) if u.addressing in by_name]
                self.states[s.addressing] = StageState(
                    s.addressing, i, up, stage_cores(s, params, ncpu)
                )
            _count_downstream(self.states)
            locked_before = _lock_names(self.root)
            dvc = DvcSide(repo, force=self.force, remote=bool(self.cluster))
            if self.cluster:
                self._prepare_cluster(repo, steps)
            dvc.ignore_new_outputs(steps, set(locked_before))
            try:
                with contextlib.ExitStack() as stack, self._signals():
                    self._loop(stack, dvc, by_name)
            finally:
                try:
                    dvc.flush()  # what finished before an error in the loop keeps its entry
                    self._pull_adopted(dvc)
                finally:
                    dvc.order_lock(locked_before, steps)
                    self._write_timeline()
                forget(self.root, f"repro-{self.run_id}")
        return ReproResult(self.states, interrupted=self._stopping > 0)

    def _loop(self, stack: contextlib.ExitStack, dvc: DvcSide, by_name: dict[str, Any]) -> None:
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
                self._start_ready(client, dvc, by_name, futures)
            self._flush(dvc)  # what finished while nothing new could start
            if not futures:
                break
            from distributed import wait

            with contextlib.suppress(TimeoutError):
                wait(list(futures), timeout=0.5, return_when="FIRST_COMPLETED")
            done = [f for f in futures if f.done()]
            for fut in done:
                name = futures.pop(fut)
                self._finished(dvc, by_name[name], fut)
            if not done and dvc.to_pull:
                # --cluster, nothing finished for a while: pull what the workers made so far
                # now rather than all at the end
                self._pull_adopted(dvc)
            self._show()
        for st in self.states.values():
            if st.state == WAITING and self._stopping:
                st.state, st.why = STOPPED, "Ctrl-C"
        self._show(final=True)

    def _start_ready(
        self,
        client: Callable[[], Any],
        dvc: DvcSide,
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
                    if self.cluster and any(u.result is not None for u in ups):
                        # an upstream ran on a worker: its outputs are on the remote, not here
                        # (pulled at the end); the worker decides (unchanged, restored or run)
                        decided = dvc.check_runnable(stage)
                    else:
                        decided = dvc.prepare(stage, upstream)
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
                self._flush(dvc)
                st.state, st.started = RUNNING, time.monotonic()
                fut = client().submit(
                    run_stage,
                    self._spec(stage, st),
                    key=f"lfbench-{self.run_id}-{name}",
                    pure=False,
                    priority=st.priority,
                    resources={"cores": st.cores} if st.cores else None,
                )
                futures[fut] = name

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

    def _finished(self, dvc: DvcSide, stage: Any, fut: Any) -> None:
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
                dvc.adopt(stage.addressing, res.lock_entry, res.files)
            else:
                dvc.finish(stage)
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

    def _flush(self, dvc: DvcSide) -> None:
        dvc.flush()

    def _pull_adopted(self, dvc: DvcSide) -> None:
        t0 = time.monotonic()
        for name in dvc.pull_adopted():
            st = self.states[name]
            st.state, st.why = FAILED, "its outputs could not be pulled from the DVC remote"
        self._pull_s = round((self._pull_s or 0.0) + time.monotonic() - t0, 2)
        if all(s.state not in (WAITING, RUNNING) for s in self.states.values()):
            self._pull_last_s = round(time.monotonic() - t0, 2)

    def _on_progress(self, event: Any) -> None:
        _, msg = event
        if isinstance(msg, dict) and msg.get("stage") in self.states:
            with self._lock:
                self.states[msg["stage"]].progress = msg

    def _show(self, final: bool = False) -> None:
        if self.view is not None:
            self.view.update(self.states, final=final)

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


def read_lock_doc(path: Path) -> Any:
    """A dvc.lock parsed as DVC's round-trip YAML (its comments and order kept; {} when
    absent or empty)."""
    from dvc.utils.serialize import parse_yaml_for_update

    if not path.exists():
        return {}
    return parse_yaml_for_update(path.read_text(encoding="utf-8"), str(path)) or {}


def write_lock_doc(path: Path, data: Any) -> None:
    """A dvc.lock written with the bytes DVC's `dump_yaml` writes, but atomically (a temporary
    file in the same folder, fsync, rename): a stage reading it meanwhile finds the old file or
    the new one, never a part (DVC truncates the file and writes it over most of a second)."""
    from dvc.utils.serialize import dumps_yaml

    atomic_write_text(path, dumps_yaml(data))


def _file_sig(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _count_downstream(states: Mapping[str, StageState]) -> None:
    """Each stage's priority: how many stages of the run are downstream of it."""
    below: dict[str, set[str]] = {n: set() for n in states}
    for st in states.values():
        for u in st.upstream:
            below[u].add(st.name)
    for name, st in states.items():
        seen: set[str] = set()
        todo = list(below[name])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(below[n])
        st.priority = len(seen)


def identity_commit(root: Path) -> str:
    from pipeline.core.lineage import git_info

    return git_info(root).commit


@contextlib.contextmanager
def _locked(repo: Any) -> Iterator[None]:
    """The project's DVC lock, held: another DVC command holding it is one clear line."""
    from dvc.lock import LockError
    from dvc.repo import lock_repo

    try:
        cm = lock_repo(repo)
        cm.__enter__()
    except LockError as e:
        raise LfbenchError(
            "another DVC command holds this project's lock (.dvc/tmp/lock), e.g. a running"
            " `dvc repro`: nothing was done; run this once it is done (a lock left by a killed"
            " DVC command goes by itself)"
        ) from e
    try:
        yield
    finally:
        cm.__exit__(None, None, None)


def running_dvc(repo: Any) -> list[tuple[int, str]]:
    """The DVC commands running in this project now (pid, command line), other than this
    process: the live processes that DVC's rwlock file (.dvc/tmp/rwlock) names. A `dvc repro`
    holds the project's lock only around its own steps and lets go of it while a stage's
    command runs; all that while, the stage's dependencies and outputs stay in the rwlock
    file with its pid and command line. A pid reused by another program since is told apart
    by its command line."""
    path = Path(repo.tmp_dir) / "rwlock"
    data: Any = {}
    for _ in range(5):  # DVC rewrites it in place (under its own guard): read it whole
        try:
            data = json.loads(path.read_text(encoding="utf-8") or "{}")
            break
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            time.sleep(0.05)
    if not isinstance(data, dict):
        return []
    infos: list[Any] = list((data.get("write") or {}).values())
    for readers in (data.get("read") or {}).values():
        infos += list(readers) if isinstance(readers, list) else [readers]
    found: dict[int, str] = {}
    for info in infos:
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            continue
        pid, cmd = info["pid"], str(info.get("cmd", ""))
        if pid == os.getpid() or pid in found:
            continue
        argv = _command_line(pid)
        if argv is None:
            continue
        if cmd and argv and not _same_command(argv, cmd):
            continue  # the pid is another program's now
        found[pid] = cmd
    return sorted(found.items())


def _command_line(pid: int) -> str | None:
    """A live process's command line ("" when it cannot be read), None when there is no
    such process (or a zombie, whose command line is empty)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return None
        try:  # no /proc: alive or not is all one can know
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    except OSError:  # another user's: it holds the paths all the same
        return ""
    if not raw:
        return None
    return " ".join(raw.rstrip(b"\0").decode("utf-8", "replace").split("\0"))


def _same_command(argv: str, cmd: str) -> bool:
    """Whether a process's command line is the one DVC recorded (its `sys.argv`): the same
    words at the end, the program's path aside (`python -m dvc repro` records
    `.../dvc/__main__.py repro`)."""
    if argv.endswith(cmd):
        return True
    want, have = cmd.split()[1:], argv.split()
    return bool(want) and have[-len(want) :] == want


def refuse_if_dvc_runs(repo: Any) -> None:
    """Stop, before doing anything, when another DVC command is running in this project (a
    `dvc repro` between two of its own steps): both would fail, and its stage's finished work
    would not be recorded."""
    running = running_dvc(repo)
    if running:
        pid, cmd = running[0]
        raise LfbenchError(
            f"a DVC command is running in this project (PID {pid}: {cmd or 'dvc'}); nothing"
            " was done: run this once it is done, or stop it first"
            + (f" ({len(running) - 1} more DVC processes)" if len(running) > 1 else "")
        )


def _ncpu() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


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
    from dvc.exceptions import DvcException

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
    except DvcException as e:
        raise LfbenchError(f"dvc: {e}") from e


def prune_workspace(root: Path, *, force: bool = False) -> list[str]:
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        repo = Repo(str(root))
        with _locked(repo), repo.scm_context(quiet=True):
            refuse_if_dvc_runs(repo)
            return prune(repo, force=force)
    except DvcException as e:
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
