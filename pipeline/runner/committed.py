"""Committed code: a cluster's driver and workers run the commit, never an edit.

Code is never shipped with a stage: the driver refuses tracked files that differ from its
commit, and a worker refuses to run a stage in a clone whose tracked files differ from its own
(`clone_changes`: `git status` once per commit, then a stat of each tracked file per stage),
less what a repro itself changes (`uncommitted`): the files the driver sends (`SHIPPED`), DVC's
outputs (a metrics file kept in git) and DVC's own lines in .gitignore files.
"""

from __future__ import annotations

import contextlib
import posixpath
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import LfbenchError
from pipeline.runner.task import SHIPPED


def head_commit(clone: Path) -> str:
    """The clone's commit (`git rev-parse`; the task needs only this of `identity`, whose
    `git status` walks the whole tree: a second a stage on a busy worker)."""
    proc = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def modified(worker: str | None, clone: Path, head: str, files: Sequence[str]) -> str:
    who = f"worker {worker} ({clone})" if worker else str(clone)
    return (
        f"{who}: tracked files differ from its commit {head[:12]}: {shown(files)}; a worker"
        " runs committed code only: commit them (and run the repro from that commit) or"
        " restore them in the clone (`git checkout -- FILE`)"
    )


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(root), "--literal-pathspecs", *args], capture_output=True, check=False
    )


def tracked_changes(root: Path, paths: Sequence[str] | None = None) -> list[str]:
    """Tracked files (all, or of `paths`) whose working copy or index differs from the
    commit: `git status` without untracked files."""
    if paths is not None and not paths:
        return []
    args = ["status", "--porcelain", "-z", "--untracked-files=no"]
    proc = _git(root, *args, *(["--", *paths] if paths is not None else []))
    if proc.returncode != 0:
        raise LfbenchError(f"{root}: git status failed: {proc.stderr.decode(errors='replace')}")
    fields = proc.stdout.decode("utf-8", "surrogateescape").split("\0")
    changed: list[str] = []
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        changed.append(entry[3:])
        if entry[0] in "RC":  # a rename or copy: the next field is where it came from
            changed.append(fields[i])
            i += 1
    return changed


def _inside(path: str, outputs: Collection[str]) -> bool:
    """`path` is one of `outputs` or inside an output folder."""
    parts = path.split("/")
    return any("/".join(parts[:n]) in outputs for n in range(1, len(parts) + 1))


def _lock_outputs(root: Path) -> set[str]:
    """The outputs the committed and the current dvc.lock name (a stage pruned since: its
    .gitignore line was DVC's too)."""
    from pipeline.core.lineage import load_yaml_text

    texts = [_git(root, "show", "HEAD:dvc.lock").stdout.decode("utf-8", "replace")]
    with contextlib.suppress(OSError):
        texts.append((root / "dvc.lock").read_text(encoding="utf-8"))
    outs: set[str] = set()
    for text in texts:
        with contextlib.suppress(Exception):  # not YAML: nothing of it counts as DVC's
            for entry in ((load_yaml_text(text) or {}).get("stages") or {}).values():
                for out in entry.get("outs") or []:
                    if isinstance(out, Mapping) and out.get("path"):
                        outs.add(str(out["path"]))
    return outs


def _dvc_lines_only(root: Path, rel: str, outputs: Collection[str]) -> bool:
    """Whether the changes of the tracked .gitignore `rel` since the commit are only lines DVC
    writes for its outputs (`/NAME` for an output NAME of its folder, as scmrepo writes it),
    added for an output, or removed with one (`lfbench prune`): such a change is DVC's
    bookkeeping, not code. Any other line added or removed is a change of the user's."""
    from collections import Counter

    from pathspec.patterns.gitwildmatch import GitWildMatchPattern

    folder = posixpath.dirname(rel)
    before = _git(root, "show", f"HEAD:{rel}").stdout.decode("utf-8", "replace").splitlines()
    try:
        now = (root / rel).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:  # DVC deletes a .gitignore whose last line it removed
        now = []
    except (OSError, UnicodeDecodeError):
        return False
    a, b = Counter(x.strip() for x in now), Counter(x.strip() for x in before)
    lines = {x for x in (a - b) + (b - a) if x}
    if not lines:
        return True

    def ours(outs: Collection[str]) -> set[str]:
        return {
            GitWildMatchPattern.escape("/" + posixpath.basename(out))
            for out in outs
            if posixpath.dirname(out) == folder
        }

    return lines <= ours(outputs) or lines <= ours(set(outputs) | _lock_outputs(root))


def uncommitted(
    root: Path, outputs: Collection[str], paths: Sequence[str] | None = None
) -> list[str]:
    """The tracked files (all, or of `paths`) that differ from the commit, less what a repro
    itself changes: the files the driver sends its workers (`SHIPPED`), DVC's outputs (a
    metrics file kept in git) and DVC's own lines in .gitignore files. What is left is code or
    configuration a worker would not have."""
    if paths is not None:
        paths = [p for p in paths if p not in SHIPPED and not _inside(p, outputs)]
    left = []
    for rel in tracked_changes(root, paths):
        if rel in SHIPPED or _inside(rel, outputs):
            continue
        if posixpath.basename(rel) == ".gitignore" and _dvc_lines_only(root, rel, outputs):
            continue
        left.append(rel)
    return sorted(set(left))


def shown(files: Sequence[str], n: int = 10) -> str:
    more = f" (and {len(files) - n} more)" if len(files) > n else ""
    return ", ".join(files[:n]) + more


Sig = tuple[int, int, int, int] | None


def _sig(path: Path) -> Sig:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _Snapshot:
    """A clone's tracked files as they were when found equal to the commit `head`."""

    head: str
    sigs: dict[str, Sig]
    outputs: set[str] = field(default_factory=set)


_SNAPSHOTS: dict[str, _Snapshot] = {}


def clone_changes(clone: Path, head: str, outputs: Callable[[], Collection[str]]) -> list[str]:
    """The clone's tracked files that differ from the commit `head` (`uncommitted`), cheaply:
    `git status` over the whole tree once per commit (when the worker starts, and after the
    clone moves to another commit), then only the files whose size, times or inode changed
    since are looked at (a stat of each tracked file: a few milliseconds)."""
    key = str(clone)
    snap = _SNAPSHOTS.get(key)
    if snap is None or snap.head != head:
        listed = _git(clone, "ls-files", "-z").stdout.decode("utf-8", "surrogateescape")
        sigs = {p: _sig(clone / p) for p in listed.split("\0") if p}  # before git looks
        outs = set(outputs())
        dirty = uncommitted(clone, outs)
        if not dirty:
            _SNAPSHOTS[key] = _Snapshot(head, sigs, outs)
        return dirty
    changed = {p: now for p, was in snap.sigs.items() if (now := _sig(clone / p)) != was}
    if not changed:
        return []
    snap.outputs = set(outputs())
    dirty = uncommitted(clone, snap.outputs, sorted(changed))
    for p, now in changed.items():
        if p not in dirty:
            snap.sigs[p] = now
    return dirty


def known_outputs(clone: Path) -> set[str] | None:
    """The outputs of the clone as they were when it was last found equal to its commit (None:
    never checked yet)."""
    snap = _SNAPSHOTS.get(str(clone))
    return snap.outputs if snap is not None else None
