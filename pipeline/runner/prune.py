"""`lfbench prune` (and the first step of `lfbench repro`): what stages no longer in dvc.yaml
left behind, removed.

A model or judge taken out of params.yaml takes its stages out of dvc.yaml, but DVC keeps their
dvc.lock entries, and their outputs stay in the folders the aggregates read (whose hashes then
differ from a workspace that never had the model). Pruning drops those entries and removes the
outputs from the workspace and .gitignore; they stay in the DVC cache.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from pipeline import dvc_internals as dvc
from pipeline.core.errors import LfbenchError
from pipeline.runner.alone import refuse_if_dvc_runs

log = logging.getLogger(__name__)


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
    stages = dvc.stages(repo)
    names = {s.addressing for s in stages}
    declared = {str(Path(out.fs_path).resolve()) for s in stages for out in s.outs}
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
    unsaved = [(name, path) for name, path in doomed if not dvc.in_cache(repo, path)]
    if unsaved and not force:
        shown = ", ".join(f"{p.relative_to(root)} (stage {n})" for n, p in unsaved)
        raise LfbenchError(
            f"prune: {shown}: its content is not in the DVC cache (edited by hand since its"
            " stage made it?), so removing it would lose it; nothing pruned. Move it out of the"
            " way, or `lfbench prune --force` to save it in the DVC cache first and remove it"
        )
    for name, path in unsaved:
        kept = dvc.save_in_cache(repo, path)
        log.warning(
            "prune: %s (stage %s) was not in the DVC cache: saved there as %s before removing it",
            path.relative_to(root),
            name,
            kept.relative_to(root) if root in kept.parents else kept,
        )
    gone: list[str] = []
    if any(name not in names for name in entries):
        # read again as DVC's round-trip YAML (several times slower) only to write it
        data = dvc.read_lock_doc(lock)
        data_entries = data.get("stages") or {}
        for name in [k for k in data_entries if k not in names]:
            data_entries.pop(name)
            gone.append(name)
        if gone:
            dvc.write_lock_doc(lock, data)
    for _, path in doomed:
        _remove_output(repo, root, path)
    for name in gone:
        log.info("pruned stage %s (no longer in dvc.yaml): its lock entry and outputs", name)
    return gone


def _remove_output(repo: Any, root: Path, path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    dvc.unignore(repo, path)  # not ignored, or ignored by hand: left as it is
    folder = path.parent
    # a model's judgement folder left empty (its .gitignore gone with the last line)
    while folder != root and folder.exists() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def prune_workspace(root: Path, *, force: bool = False) -> list[str]:
    """`lfbench prune`: under DVC's lock, and refused while another DVC command runs."""
    try:
        repo = dvc.open_repo(root)
        with dvc.locked(repo):
            refuse_if_dvc_runs(repo)
            return prune(repo, force=force)
    except dvc.DvcError as e:
        raise LfbenchError(f"dvc: {e}") from e
