"""DVC's internals, behind one door: every call lfbench makes into DVC beyond its command line.

DVC has no public API for what `lfbench repro` needs: `dvc repro`'s steps one stage at a time
(the plan, "changed?", the run-cache restore, saving and committing the outputs, the dvc.lock
entry) so that a driver can run the commands side by side and a cluster worker can run one
stage in its clone; outputs and one stage's run-cache entries moved by hash; dvc.lock written
with DVC's own YAML but atomically; `dvc repro --dry` that works on a project whose stages
have yet to make the inputs of others. Every such call is here, and nowhere else in
`pipeline/` (a test reads the source); each internal has a test in
tests/test_dvc_internals.py that fails when it changes shape.

The versions this door was written for are checked when it is imported (`WRITTEN_FOR`): with
another DVC installed, `lfbench repro` (and every command that needs the door) stops at once
with one line naming both versions, not an AttributeError in the middle of a run. To move to
a new DVC: install it, run tests/test_dvc_internals.py (and the repro tests), mend what fails
here, add the version.

Nothing here changes DVC for anyone but the objects lfbench makes: `Repository` (a `Repo`)
reads each params file once per text for the stages of its own index, hashes each file or
folder dependency of those stages once per state of its files, reads git's index once per
state of that file, and, when asked, opens each remote once; the dry run gives its own
repository a run cache that does not look up a stage whose dependency is missing. No module
of DVC is patched and no working directory is changed: another thread, or DVC itself in this
process, sees DVC as it is.

Names used from DVC 3.67 (dvc-data 3.18, scmrepo 3.6), each with its test:
  dvc.repo: Repo (cloud, stage_cache, index, scm, scm_context, stage.load_one, lock, push,
    reproduce, status, tmp_dir), Repo._reset, lock_repo
  dvc.repo.reproduce: collect_stages, get_active_graph, plan_repro
  dvc.stage: Stage.changed / remove_outs / save_deps / save / commit / checkout /
    get_used_objs, PipelineStage; dvc.stage.cache: StageCache (restore, transfer,
    _get_cache_dir), RunCacheNotFoundError, _can_hash, _get_stage_hash;
    dvc.stage.serialize: to_single_stage_lockfile
  dvc.dependency.param: ParamsDependency.read_params; dvc.output: Output._build
  dvc.data_cloud: DataCloud.get_remote / get_remote_odb / pull / push; dvc.config: Config
  dvc.utils.serialize: parse_yaml_for_update, dumps_yaml
  dvc.fs: LocalFileSystem, generic.copy
  dvc_data.hashfile: build, check, transfer
  scmrepo: Git._reset (its cached ignore rules), Git.is_tracked, Git.dulwich.repo
    (dulwich's index_path, open_index)
  .dvc/tmp/rwlock: the JSON DVC keeps of the paths its running commands hold
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from pipeline.core.errors import LfbenchError
from pipeline.core.io import atomic_write_text

# The distributions whose internals this module uses, and the versions it was written and
# tested for (requirements.lock pins them).
WRITTEN_FOR: dict[str, tuple[str, ...]] = {
    "dvc": ("3.67.1",),
    "dvc-data": ("3.18.3",),
    "scmrepo": ("3.6.2",),
}


class UnsupportedDvc(LfbenchError):
    """The installed DVC (or one of the libraries whose internals the door uses) is a version
    the door was not written for."""


def check_versions() -> None:
    """Each distribution of `WRITTEN_FOR` at a version it lists, else one clear error."""
    for dist, known in WRITTEN_FOR.items():
        try:
            have: str | None = metadata.version(dist)
        except metadata.PackageNotFoundError:
            have = None
        if have in known:
            continue
        wanted = " or ".join(known)
        raise UnsupportedDvc(
            f"{dist} {have} is installed, but lfbench's door to DVC's internals"
            f" (pipeline/dvc_internals.py) was written for {dist} {wanted}: install {dist}=="
            f"{known[-1]} (`make setup`; requirements.lock pins it). To move to {dist} {have},"
            " run tests/test_dvc_internals.py with it, mend what fails and add the version to"
            " WRITTEN_FOR"
            if have
            else f"{dist} is not installed; lfbench's door to DVC's internals"
            f" (pipeline/dvc_internals.py) was written for {dist} {wanted} (`make setup`)"
        )


check_versions()

# After the check: with another version, its error comes first, not an ImportError here.
from dvc.data_cloud import DataCloud  # noqa: E402
from dvc.dependency.param import ParamsDependency  # noqa: E402
from dvc.exceptions import DvcException, NoOutputOrStageError  # noqa: E402
from dvc.lock import LockError, LockNoop  # noqa: E402
from dvc.repo import Repo, lock_repo  # noqa: E402
from dvc.stage.cache import RunCacheNotFoundError, StageCache  # noqa: E402
from dvc.utils.objects import cached_property  # noqa: E402

log = logging.getLogger(__name__)

DvcError = DvcException  # what a DVC call raises (a missing dependency, a cache error, ...)


class ProjectLocked(LfbenchError):
    """Another DVC command holds the project's lock (.dvc/tmp/lock)."""


class UnknownTarget(LfbenchError):
    """A target that names no stage or output of the project."""


# ---------------------------------------------------------------- the repository


class Repository(Repo):  # type: ignore[misc]
    """DVC's `Repo`, as lfbench opens it.

    - Params files read once per text: DVC reads and parses params.yaml again for every params
      dependency of a stage each time it asks whether the stage changed, saves it or keys its
      run cache (a cluster worker: some ten parses of the same text per stage). The stages of
      this repository's own index read each (file, text, keys) once; each caller gets its own
      copy, as a fresh read would give it.
    - `reuse_remotes`: each DVC remote opened once by this repository (DVC builds its S3
      filesystem with fsspec's instance cache off: a new boto session and client each time it
      opens a remote, 0.1-0.3 s, three or four times a stage on a worker). A new repository,
      new sessions: a worker makes one per stage, so no listing outlives it.
    """

    def __init__(self, root: str | Path, *, reuse_remotes: bool = False) -> None:
        super().__init__(str(root))
        self._params_read: dict[tuple[Any, ...], Any] = {}
        self._built: dict[str, tuple[tuple[Any, ...], tuple[Any, Any, Any]]] = {}
        self._memo_lock = threading.Lock()
        if reuse_remotes:
            self.cloud = _OneSessionCloud(self)

    @cached_property  # type: ignore[untyped-decorator]
    def scm(self) -> Any:
        """DVC's git repository object, its `is_tracked` answered from git's index file as
        read once per state of that file (scmrepo reads and parses it again on every call: each
        output DVC saves asks, 40 ms a call on a project of 500 tracked files)."""
        scm = Repo.__dict__["scm"].fget(self)  # DVC's own
        if hasattr(scm, "dulwich"):  # a git repository (not DVC's NoSCM)
            scm.is_tracked = _TrackedOnce(scm)
        return scm

    @cached_property  # type: ignore[untyped-decorator]
    def index(self) -> Any:
        """DVC's index (built once until `reload`), its stages' params read once per text."""
        built = Repo.__dict__["index"].fget(self)  # DVC's own (funcy's cached_property)
        for stage in built.stages:
            self._read_params_once(stage)
        return built

    def _read_params_once(self, stage: Any) -> None:
        for dep in stage.deps:
            if isinstance(dep, ParamsDependency):
                if "read_params" not in dep.__dict__:
                    dep.read_params = _ParamsOnce(self, dep)
            elif "_build" not in dep.__dict__ and dep.fs.protocol == "local":
                dep._build = _BuiltOnce(self, dep)


class _BuiltOnce:
    """`Output._build` of one file or folder dependency (what its hash is computed by), through
    its repository's memo keyed by what DVC's own state trusts a hash by: the inode, times and
    size of the path and, for a folder, of every file under it (and the project's .dvcignore).
    `lfbench repro` asks for the hash of each dependency four or five times a stage (changed?,
    the run-cache key, saved before the command, saved after it), and the same source folders
    are dependencies of every stage: DVC walks them and looks each file up in its state
    database every time. A path with a symbolic link in it is not kept (built each time)."""

    def __init__(self, repo: Repository, dep: Any) -> None:
        self.repo, self.dep = repo, dep

    def __call__(self, odb: Any, path: str, fs: Any, name: str, **kwargs: Any) -> Any:
        build = type(self.dep)._build.__get__(self.dep)
        extra = {k: v for k, v in kwargs.items() if k not in ("ignore", "dry_run")}
        seen = _stat_walk(path)
        if seen is None or extra:
            return build(odb, path, fs, name, **kwargs)
        ignore_file = _stat_walk(str(Path(self.repo.root_dir, ".dvcignore")))
        key = (path, odb.path, name, bool(kwargs.get("dry_run")), seen, ignore_file)
        with self.repo._memo_lock:
            kept = self.repo._built.get(path)
        if kept is not None and kept[0] == key:
            staging, meta, obj = kept[1]
            return staging, *_own_copy(meta, obj)
        staging, meta, obj = build(odb, path, fs, name, **kwargs)
        if _stat_walk(path) == seen:  # unchanged while DVC hashed it
            with self.repo._memo_lock:
                self.repo._built[path] = (key, (staging, *_own_copy(meta, obj)))
        return staging, meta, obj


def _own_copy(meta: Any, obj: Any) -> tuple[Any, Any]:
    """A caller's own `Meta` and object, its own `HashInfo` (what a dependency keeps and DVC
    may set); a folder's entries (never changed once built) are shared."""
    mine = copy.copy(obj)
    mine.hash_info = copy.copy(obj.hash_info)
    return copy.copy(meta), mine


def _stat_walk(path: str) -> tuple[Any, ...] | None:
    """(inode, mtime, ctime, size, mode) of a file, or of every entry under a folder with its
    relative name; None for a missing path or one that holds a symbolic link."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return None
    seen: list[tuple[Any, ...]] = []
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return None
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return None
            rel = os.path.relpath(entry.path, path)
            seen.append((rel, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode))
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return tuple(seen)


class _ParamsOnce:
    """`ParamsDependency.read_params` of one dependency, through its repository's memo keyed by
    the file's text (a changed file is read again)."""

    def __init__(self, repo: Repository, dep: Any) -> None:
        self.repo, self.dep = repo, dep

    def __call__(self, flatten: bool = True, **kwargs: Any) -> Any:
        dep = self.dep
        read = type(dep).read_params.__get__(dep)
        text = _digest(Path(dep.fs_path))
        if text is None or kwargs:
            return read(flatten=flatten, **kwargs)
        key = (dep.fs_path, text, tuple(dep.params or ()), flatten)
        with self.repo._memo_lock:
            kept = self.repo._params_read.get(key)
        if kept is None:
            kept = read(flatten=flatten)
            if _digest(Path(dep.fs_path)) == text:  # unchanged while DVC read it
                with self.repo._memo_lock:
                    self.repo._params_read[key] = kept
        return copy.deepcopy(kept)


class _TrackedOnce:
    """`Git.is_tracked` of one repository (a path, or a folder holding one, in git's index),
    from the index's paths as read once per state of the index file (git replaces the file on
    every write: a new inode, so a changed index is read again)."""

    def __init__(self, scm: Any) -> None:
        self.scm = scm
        self._kept: tuple[tuple[int, int, int], frozenset[bytes]] | None = None
        self._lock = threading.Lock()

    def _tracked(self) -> frozenset[bytes] | None:
        repo = self.scm.dulwich.repo
        try:
            st = Path(repo.index_path()).stat()
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if self._kept is not None and self._kept[0] == key:
                return self._kept[1]
        names: set[bytes] = set()
        for path in repo.open_index():
            names.add(path)
            parts = path.split(b"/")
            names.update(b"/".join(parts[:i]) for i in range(1, len(parts)))
        with self._lock:
            self._kept = (key, frozenset(names))
        return self._kept[1]

    def __call__(self, path: str) -> bool:
        rel = os.path.relpath(path, self.scm.root_dir).replace(os.path.sep, "/").encode()
        tracked = self._tracked()
        if tracked is None:  # no index (nothing added yet), or unreadable: scmrepo's answer
            return bool(type(self.scm).is_tracked(self.scm, path))
        return rel in tracked


def _digest(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


class _OneSessionCloud(DataCloud):  # type: ignore[misc]
    """DVC's DataCloud of one repository, each remote opened once (by name; None is the
    default remote, as DVC resolves it)."""

    def __init__(self, repo: Any) -> None:
        super().__init__(repo)
        self._opened: dict[str | None, Any] = {}

    def get_remote(self, name: str | None = None, command: str = "<command>") -> Any:
        name = name or self.repo.config["core"].get("remote")
        if name not in self._opened:
            self._opened[name] = super().get_remote(name=name, command=command)
        return self._opened[name]


def open_repo(root: str | Path, *, reuse_remotes: bool = False) -> Repository:
    return Repository(root, reuse_remotes=reuse_remotes)


def reload(repo: Any) -> None:
    """Forget what the repository read (its index, dvc.yaml, dvc.lock, git's ignore rules): the
    next question reads the files again."""
    repo._reset()


@contextlib.contextmanager
def locked(repo: Any) -> Iterator[Any]:
    """The project's DVC lock held (and DVC's git bookkeeping, quiet), as around a DVC
    command; another DVC command holding it is `ProjectLocked`."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(lock_repo(repo))
        except LockError as e:
            raise ProjectLocked(
                "another DVC command holds this project's lock (.dvc/tmp/lock), e.g. a running"
                " `dvc repro`: nothing was done; run this once it is done (a lock left by a"
                " killed DVC command goes by itself)"
            ) from e
        held.enter_context(repo.scm_context(quiet=True))
        yield repo


def rwlock_holders(repo: Any) -> list[tuple[int, str]]:
    """The (pid, command line) of each DVC command that holds paths of this project in DVC's
    rwlock file (.dvc/tmp/rwlock): a `dvc repro` keeps its stage's paths there, with its pid
    and command line, while the stage's command runs and the project's lock is let go."""
    import json
    import time

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
    return [
        (info["pid"], str(info.get("cmd", "")))
        for info in infos
        if isinstance(info, dict) and isinstance(info.get("pid"), int)
    ]


# ---------------------------------------------------------------- the pipeline


def stages(repo: Any) -> list[Any]:
    """Every stage (and .dvc file) of the project, in dvc.yaml's order (matrix items in their
    params' order)."""
    return list(repo.index.stages)


def pipeline_stage_names(repo: Any) -> list[str]:
    """The names of dvc.yaml's stages (not .dvc files)."""
    from dvc.stage import PipelineStage

    return [s.addressing for s in repo.index.stages if isinstance(s, PipelineStage)]


def plan(repo: Any, targets: Sequence[str]) -> tuple[list[Any], dict[str, list[str]]]:
    """What `dvc repro TARGETS` runs, in its order (dvc/repo/reproduce.py), and each planned
    stage's upstream stages among them (by name). TARGETS as `dvc repro` reads them; none: the
    repository's dvc.yaml."""
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    graph = get_active_graph(repo.index.graph)
    chosen = collect_stages(repo, list(targets) or [str(Path(repo.root_dir) / "dvc.yaml")])
    steps = list(plan_repro(graph, chosen))
    if isinstance(repo, Repository):
        for stage in steps:
            repo._read_params_once(stage)
    names = {s.addressing for s in steps}
    upstream = {
        s.addressing: [u.addressing for u in graph.successors(s) if u.addressing in names]
        for s in steps
    }
    return steps, upstream


def status(repo: Any, targets: Sequence[str] = (), *, lock: bool = True) -> dict[str, Any]:
    """`dvc status --with-deps [TARGETS]`: the changed stages among the targets and every stage
    they depend on (what `dvc repro TARGETS` checks and runs), by name. `lock=False`: read
    without taking the project's lock (`without_lock`)."""
    try:
        with contextlib.nullcontext() if lock else without_lock(repo):
            return dict(repo.status(targets=list(targets) or None, with_deps=True))
    except NoOutputOrStageError as e:
        raise UnknownTarget(str(e)) from e
    except LockError as e:
        raise ProjectLocked(str(e)) from e


@contextlib.contextmanager
def without_lock(repo: Any) -> Iterator[Any]:
    """This repository reads the project while another process (a running `lfbench repro`)
    holds its lock, taking neither the lock nor DVC's per-path read locks:

    - DVC's `locked` commands take the lock only at depth 0 (`repo._lock_depth`,
      dvc/repo/__init__.py `lock_repo`): this repository is told it holds it already, and its
      own `lock` is a held no-op lock (a stage's `rwlocked` methods assert `is_locked`);
    - a stage's `rwlocked` methods record read locks in `<tmp_dir>/rwlock`: a reader's entry
      there would make the holder's next save of that stage's outputs fail ("is busy"), so
      this repository's `tmp_dir` is a folder of its own for the duration.

    It reads dvc.yaml, params, dvc.lock (which the driver replaces atomically) and the
    workspace's files, and writes nothing of the project (DVC's hash cache is its own, shared
    safely); a stage running meanwhile reads as changed. Everything is put back after."""
    import tempfile

    saved_lock, saved_depth = repo.lock, repo._lock_depth
    saved_tmp = repo.__dict__.get("tmp_dir", _MISSING)
    with tempfile.TemporaryDirectory(prefix="lfbench-read-") as private:
        held = LockNoop()
        held.lock()
        repo.lock, repo._lock_depth = held, saved_depth + 1
        repo.__dict__["tmp_dir"] = private
        try:
            yield repo
        finally:
            repo.lock, repo._lock_depth = saved_lock, saved_depth
            if saved_tmp is _MISSING:
                repo.__dict__.pop("tmp_dir", None)
            else:
                repo.__dict__["tmp_dir"] = saved_tmp


_MISSING = object()


def producers(repo: Any, stage: Any) -> list[str]:
    """The stages (and .dvc files) whose outputs `stage` depends on: an output that is the
    dependency, a folder holding it, or a file inside it (an aggregate's folder of generations
    is made by every generate stage writing in it)."""
    owners: list[str] = []
    for dep in stage.deps:
        for out in repo.index.outs:
            if out.stage is stage:
                continue
            if (
                out.fs_path == dep.fs_path
                or out.fs.isin(out.fs_path, dep.fs_path)
                or out.fs.isin(dep.fs_path, out.fs_path)
            ):
                target = out.stage.addressing
                if target not in owners:
                    owners.append(target)
    return owners


def output_paths(repo: Any) -> set[str]:
    """The paths (relative, posix) of every output DVC knows in this repository: the stages'
    and the .dvc files' (data/)."""
    root = Path(repo.root_dir)
    outs = set()
    for out in repo.index.outs:
        path = Path(out.fs_path)
        if root in path.parents:
            outs.add(path.relative_to(root).as_posix())
    return outs


# ---------------------------------------------------------------- one stage's steps


def changed(stage: Any, upstream: Sequence[Any] | None = None) -> bool:
    """Whether `dvc repro` would run (or restore) the stage: its command, dependencies or
    outputs differ from its dvc.lock entry."""
    return bool(stage.changed(False, list(upstream) if upstream is not None else None))


def remove_outputs(stage: Any) -> None:
    """Its outputs removed, as before DVC runs its command (persistent ones kept)."""
    stage.remove_outs(ignore_remove=False, force=False)


def save_deps(stage: Any) -> None:
    """Its dependencies hashed as they are now (what its lock entry and run-cache key say)."""
    stage.save_deps()


def restore(repo: Any, stage: Any, *, pull: bool = False) -> bool:
    """The stage from the run cache, as `dvc repro` restores it (dvc/stage/run.py): True when
    restored. Asked with the stage's dependencies as dvc.lock records them: unchanged (only the
    outputs missing), DVC takes the lock entry's outputs; otherwise it saves the dependencies
    and looks their hash up. `pull`: the outputs' objects from the remote."""
    try:
        repo.stage_cache.restore(stage, pull=pull)
    except RunCacheNotFoundError:
        return False
    return True


def loaded_again(repo: Any, stage: Any) -> Any:
    """The stage loaded afresh from dvc.yaml and dvc.lock (its dependencies as recorded)."""
    fresh = repo.stage.load_one(stage.dvcfile.path, stage.name)
    if isinstance(repo, Repository):
        repo._read_params_once(fresh)
    return fresh


def save(stage: Any) -> None:
    """After its command (or a restore): what `Stage.run` does next. Its outputs hashed and in
    the cache, its run-cache entry written (not when an output is kept out of the cache, as
    DVC decides), its outputs committed."""
    no_cache_outs = any(
        not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot)
    )
    dvc_log = logging.getLogger("dvc.output")
    dvc_log.addFilter(_no_records_is_not_empty)
    try:
        stage.save(allow_missing=False, run_cache=not no_cache_outs)
    finally:
        dvc_log.removeFilter(_no_records_is_not_empty)
    stage.commit(allow_missing=False)


def _no_records_is_not_empty(record: logging.LogRecord) -> bool:
    """DVC's "'X' is empty." on saving an output, but not for a JSONL file of no records: a
    stage that writes none by design (a judge stage of a pair not judged, by choice: its
    judgements file) is not a problem to warn of (the stage's own log says why)."""
    if record.msg == "'%s' is empty." and record.args:
        out = record.args[0] if isinstance(record.args, tuple) else record.args
        path = Path(str(getattr(out, "fs_path", out)))
        return not (path.suffix == ".jsonl" and path.is_file() and path.stat().st_size == 0)
    return True


def lock_entry(stage: Any) -> dict[str, Any]:
    """Its dvc.lock entry, as DVC writes it (plain dicts and lists)."""
    from dvc.stage.serialize import to_single_stage_lockfile

    return _plain(to_single_stage_lockfile(stage))  # type: ignore[no-any-return]


def lock_file(stage: Any) -> tuple[Path, str]:
    """The dvc.lock its entry goes in (beside its dvc.yaml) and the entry's key."""
    return Path(stage.dvcfile.path).with_suffix(".lock"), str(stage.name)


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def outputs_differ(stage: Any) -> bool:
    """Whether the workspace's outputs of the stage (or .dvc file) are not the ones its lock
    entry names (missing or different)."""
    return any(not o.hash_info or o.workspace_status() for o in stage.outs)


# ---------------------------------------------------------------- the remote


def pull_outputs(repo: Any, stages: Sequence[Any]) -> list[str]:
    """These stages' outputs as their lock entries say, from the DVC remote: their objects by
    hash in one transfer, then each stage checked out (as DVC's run-cache restore does; `dvc
    pull <stages>` builds two indexes per call, seconds each on a busy machine). Returns the
    stages that could not be checked out (their objects are on no remote)."""
    objs: set[Any] = set()
    for stage in stages:
        for used in stage.get_used_objs().values():
            objs |= used
    try:
        got = repo.cloud.pull(objs)
        missing = len(got.failed)
    except Exception as e:  # noqa: BLE001 - a remote error: each stage's checkout says
        log.error("pulling from the DVC remote: %s", e)
        missing = 0
    failed: list[str] = []
    for stage in stages:
        try:
            stage.checkout()
        except Exception as e:  # noqa: BLE001 - its objects are not in the cache
            log.error("stage %s: checking out its outputs: %s", stage.addressing, e)
            failed.append(stage.addressing)
    if missing and not failed:
        log.warning("%d objects not pulled, though every stage checked out", missing)
    return failed


def push_outputs(repo: Any, stage: Any) -> int:
    """The stage's cached outputs to the remote by their hashes (DVC's `push <stage>` would
    first need its entry in dvc.lock and the whole index rebuilt). Returns those not pushed."""
    failed = 0
    for objs in stage.get_used_objs(push=True).values():
        failed += len(repo.cloud.push(objs).failed)
    return failed


def push_everything(repo: Any) -> None:
    """`dvc push` of the workspace, and the run-cache entries either side lacks copied both
    ways (DVC's `push/pull --run-cache` copies every entry again, each time)."""
    try:
        repo.push()
    except Exception as e:  # noqa: BLE001 - outputs not made yet are reported, not fatal
        log.debug("push: %s", e)
    with contextlib.suppress(Exception):
        odb = _run_cache_odb(repo)
        repo.stage_cache.transfer(repo.cache.legacy, odb, force=False)
        repo.stage_cache.transfer(odb, repo.cache.legacy, force=False)


def _run_cache_odb(repo: Any) -> Any:
    return repo.cloud.get_remote_odb(None, "run cache", hash_name="md5-dos2unix")


def _run_cache_dirs(repo: Any, stage: Any) -> tuple[Any, str, Path] | None:
    """The remote's ODB, and the remote and local folders of `stage`'s run-cache entries (its
    dependencies hashed), or None when DVC cannot key the stage (no run cache for it)."""
    from dvc.stage.cache import _can_hash, _get_stage_hash

    if not _can_hash(stage):
        return None
    key = _get_stage_hash(stage)
    odb = _run_cache_odb(repo)
    remote = odb.fs.join(odb.path, "runs", key[:2], key)
    return odb, remote, Path(repo.stage_cache._get_cache_dir(key))


def pull_run_cache(repo: Any, stage: Any) -> int:
    """The remote's run-cache entries of this one stage, keyed by its dependencies as saved
    (`dvc pull --run-cache` copies every entry of every stage, each time). Returns the number
    copied."""
    from dvc.fs import LocalFileSystem, generic

    where = _run_cache_dirs(repo, stage)
    if where is None:
        return 0
    odb, remote, local = where
    if not odb.fs.exists(remote):
        return 0
    n = 0
    for src in odb.fs.find(remote):
        dst = local / odb.fs.name(src)
        if not dst.exists():
            local.mkdir(parents=True, exist_ok=True)
            generic.copy(odb.fs, src, LocalFileSystem(), str(dst))
            n += 1
    return n


def push_run_cache(repo: Any, stage: Any) -> int:
    """This one stage's run-cache entries not on the remote yet. Returns the number copied."""
    from dvc.fs import LocalFileSystem, generic

    where = _run_cache_dirs(repo, stage)
    if where is None or not where[2].is_dir():
        return 0
    odb, remote, local = where
    have = {odb.fs.name(p) for p in odb.fs.find(remote)} if odb.fs.exists(remote) else set()
    n = 0
    for path in sorted(local.iterdir()):
        if path.name not in have:
            generic.copy(LocalFileSystem(), str(path), odb.fs, odb.fs.join(remote, path.name))
            n += 1
    return n


def remote_folder(root: Path, name: str | None, folder: str) -> tuple[Any, str]:
    """A DVC remote's filesystem (the project's default, or `name`) and the path of `folder`
    on it (the image archives)."""
    repo = Repo(str(root))
    try:
        remote = repo.cloud.get_remote(name=name)
    except Exception as e:
        raise LfbenchError(f"DVC remote {name or '(default)'}: {e}") from e
    return remote.fs, remote.fs.join(remote.path, folder)


def default_remote_url(root: Path) -> str | None:
    """The URL of the project's default DVC remote, DVC's config levels merged (a local path
    made absolute), as `dvc remote default` and `dvc config remote.<name>.url` give it; None
    without one."""
    from dvc.config import Config

    conf = Config(dvc_dir=str(root / ".dvc"))
    name = conf["core"].get("remote")
    if not name:
        return None
    url = conf["remote"].get(name, {}).get("url")
    return str(url) if url else None


# ---------------------------------------------------------------- dvc.lock and git


def read_lock_doc(path: Path) -> Any:
    """A dvc.lock parsed as DVC's round-trip YAML (its comments and order kept; {} when
    absent or empty)."""
    from dvc.utils.serialize import parse_yaml_for_update

    if not path.exists():
        return {}
    return parse_yaml_for_update(path.read_text(encoding="utf-8"), str(path)) or {}


def write_lock_doc(path: Path, data: Any, memo: LockText | None = None) -> None:
    """A dvc.lock written with the bytes DVC's `dump_yaml` writes, but atomically (a temporary
    file in the same folder, fsync, rename): a stage reading it meanwhile finds the old file or
    the new one, never a part (DVC truncates the file and writes it over most of a second).
    `memo`: the text of entries written before, kept (see `LockText`)."""
    atomic_write_text(path, (memo or LockText()).dumps(data))


def _shape(obj: Any) -> Any:
    """What an entry's YAML text depends on, as a value to compare: its types, keys in order,
    scalars as their repr (a round-trip float keeps its own formatting: another type)."""
    if isinstance(obj, Mapping):
        return (type(obj).__name__, tuple((repr(k), _shape(v)) for k, v in obj.items()))
    if isinstance(obj, list | tuple):
        return (type(obj).__name__, tuple(_shape(v) for v in obj))
    return (type(obj).__name__, repr(obj))


def _no_comments(obj: Any) -> bool:
    ca = getattr(obj, "ca", None)
    if ca is not None and (ca.comment or ca.items or ca.end):
        return False
    fa = getattr(obj, "fa", None)
    return not (fa is not None and fa.flow_style())


class LockText:
    """dvc.lock's text as DVC's round-trip YAML dumps it, each stage's entry dumped once.

    DVC rewrites the whole file after each stage, and its pure-Python YAML emitter took most of
    `lfbench repro`'s own CPU time on the default DAG (41 entries, 150 kB, 37 rewrites). An
    entry's text depends only on the entry (the column it starts at is always the same), so
    the file is its `schema` line, `stages:` and each entry's text under it, an entry dumped
    again only when it is another object or its contents changed. A file this cannot cut so
    (comments or flow style around the entries, other top-level keys) is dumped whole.
    tests/test_dvc_internals.py checks the bytes against DVC's own dump."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Any, Any, str]] = {}

    def dumps(self, data: Any) -> str:
        from dvc.utils.serialize import dumps_yaml

        stages = data.get("stages") if isinstance(data, Mapping) else None
        if (
            list(data) != ["schema", "stages"]
            or not isinstance(stages, Mapping)
            or not stages
            or not (_no_comments(data) and _no_comments(stages))
        ):
            return str(dumps_yaml(data))
        head = "stages:\n"
        parts = [str(dumps_yaml({"schema": data["schema"]})), head]
        kept: dict[str, tuple[Any, Any, str]] = {}
        for key, entry in stages.items():
            shape = _shape(entry)
            old = self._entries.get(key)
            if old is not None and old[0] is entry and old[1] == shape:
                text = old[2]
            else:
                text = str(dumps_yaml({"stages": {key: entry}}))
                if not text.startswith(head):  # not a block under `stages:`: the whole file
                    return str(dumps_yaml(data))
                text = text[len(head) :]
            kept[key] = (entry, shape, text)
            parts.append(text)
        self._entries = kept
        return "".join(parts)


def track_file(repo: Any, rel: str) -> None:
    """A file DVC changed, for DVC's "To track the changes with git" note (or autostage)."""
    repo.scm_context.track_file(rel)


def ignore_outputs(repo: Any, stages: Iterable[Any]) -> None:
    """The .gitignore lines of these stages' outputs (those git does not track), as DVC writes
    them when it saves an output; then git's ignore rules read again (scmrepo keeps them: a
    stage's own save would not see these lines and append them again)."""
    for stage in stages:
        for out in stage.outs:
            if out.use_scm_ignore and not _is_tracked(repo, out.fspath):
                Path(out.fspath).parent.mkdir(parents=True, exist_ok=True)
                out.ignore()
    repo.scm._reset()


def _is_tracked(repo: Any, path: str) -> bool:
    try:
        return bool(repo.scm.is_tracked(path))
    except Exception:  # noqa: BLE001
        return False


def unignore(repo: Any, path: Path) -> None:
    """The .gitignore line DVC wrote for an output removed (the file deleted with its last
    line); a path DVC did not ignore is left as it is."""
    with contextlib.suppress(Exception):
        repo.scm_context.ignore_remove(str(path))


# ---------------------------------------------------------------- the DVC cache


def _built(repo: Any, path: Path) -> tuple[Any, Any, Any]:
    """The workspace content at `path` as DVC's cache would hold it (staging, odb, object)."""
    from dvc_data.hashfile.build import build

    odb = repo.cache.local
    staging, _, obj = build(odb, str(path), repo.fs, odb.hash_name)
    return staging, odb, obj


def in_cache(repo: Any, path: Path) -> bool:
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


def save_in_cache(repo: Any, path: Path) -> Path:
    """Copy the content at `path` into the DVC cache; the path of its cache object."""
    from dvc_data.hashfile.transfer import transfer

    staging, odb, obj = _built(repo, path)
    transfer(staging, odb, {obj.hash_info}, shallow=False, hardlink=False)
    return Path(odb.oid_to_path(obj.oid))


# ---------------------------------------------------------------- dvc repro --dry


class _DryRunCache(StageCache):  # type: ignore[misc]
    """A run cache that does not look up a stage whose local dependency does not exist yet:
    it cannot be in the run cache (DVC's dry run would hash the missing file and fail,
    treeverse/dvc#9818; DVC's own check skips dependencies it cannot hash)."""

    def restore(self, stage: Any, *args: Any, **kwargs: Any) -> Any:
        if any(d.protocol == "local" and not d.exists for d in stage.deps):
            raise RunCacheNotFoundError(stage)
        return super().restore(stage, *args, **kwargs)


def dry_run(root: Path, targets: Sequence[str], out: TextIO) -> list[str]:
    """`dvc repro --dry [TARGETS]` in `root`, its lines (each stage and its commands, in the
    order it would run them) written to `out`, on a project whose stages have yet to make the
    inputs of others. Returns the stages it would run."""
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    dvc_log = logging.getLogger("dvc")
    level, propagate = dvc_log.level, dvc_log.propagate
    dvc_log.addHandler(handler)
    dvc_log.setLevel(logging.INFO)
    dvc_log.propagate = False  # its lines once, as DVC prints them
    try:
        with Repo(str(root)) as repo:
            repo.stage_cache = _DryRunCache(repo)
            try:
                done = repo.reproduce(list(targets) or str(root / "dvc.yaml"), dry=True)
            except LockError as e:
                raise ProjectLocked(str(e)) from e
    finally:
        dvc_log.removeHandler(handler)
        dvc_log.setLevel(level)
        dvc_log.propagate = propagate
    if not done:
        out.write("Data and pipelines are up to date.\n")
    return [s.addressing for s in done]
