"""dvc.lock as `lfbench repro`'s driver writes it: the entries of finished stages, in one
atomic rewrite per batch, and new entries in dvc.yaml's order.

- **Before a stage starts**, the entries of the stages it depends on are in dvc.lock (an
  aggregate reads its upstream stages' entries for its MLflow lineage, as under `dvc repro`).
  The entries of all stages finished meanwhile go in one rewrite of the file (DVC rewrites the
  whole file per stage, a second or two once it holds a few hundred stages); the parsed file
  is kept between writes while nobody else changes it.
- **Atomically** (`dvc_internals.write_lock_doc`): running stages read the file; DVC's own
  writer truncates it and writes it over most of a second.
- **Byte for byte** what `dvc repro` writes: DVC's round-trip YAML, existing entries updated in
  place, new ones appended. New entries (a model added) and their outputs' .gitignore lines go
  in dvc.yaml's order (`declared`): a serial `dvc repro` appends them in an order that changes
  from one run to the next (its plan follows Python's string hashing), this one in the same
  order each time.
- **From a cluster's workers** (`adopt`): a stage's entry and its uncached outputs as the
  worker sent them; its cached outputs pulled from the team's remote by hash (`pull_adopted`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline import dvc_internals as dvc
from pipeline.core.errors import LfbenchError
from pipeline.core.io import write_if_changed

log = logging.getLogger(__name__)


def declared(repo: Any, stages: Sequence[Any]) -> list[Any]:
    """`stages` in the order dvc.yaml declares them (matrix items in their params' order).

    The order in which a serial `dvc repro` appends new stages to dvc.lock (and their outputs to
    .gitignore files) is its plan's, a depth-first walk of a graph whose iteration order follows
    Python's string hashing: two runs of the same `dvc repro` order new entries differently
    (PYTHONHASHSEED). `lfbench repro` writes them in this order instead, the same every time."""
    rank = {s.addressing: i for i, s in enumerate(dvc.stages(repo))}
    return sorted(stages, key=lambda s: rank.get(s.addressing, len(rank)))


def _file_sig(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Lockfile:
    """The dvc.lock entries of finished stages, written by the driver (under DVC's lock)."""

    def __init__(self, repo: Any) -> None:
        self.repo = repo
        self.root = Path(repo.root_dir)
        # finished stages' entries not written yet: (its dvc.lock, its key, the entry)
        self.pending: list[tuple[Path, str, Mapping[str, Any]]] = []
        self.to_pull: list[str] = []  # --cluster: stages whose outputs are pulled from the remote
        # each dvc.lock as last written (DVC's round-trip YAML) and its stat signature then
        self._docs: dict[Path, tuple[Any, tuple[int, int, int] | None]] = {}
        # each dvc.lock's entries as YAML text, dumped once each (DVC's emitter is slow)
        self._texts: dict[Path, dvc.LockText] = {}

    def add(self, stage: Any, entry: Mapping[str, Any]) -> None:
        """A finished stage's entry, written by the next `flush` into the dvc.lock beside its
        dvc.yaml (as DVC writes it)."""
        path, key = dvc.lock_file(stage)
        self.pending.append((path, key, entry))

    def adopt(self, stage: Any, entry: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
        """A stage a worker ran (--cluster): its uncached outputs as they came, its dvc.lock
        entry, and its cached outputs pulled from the remote later (`pull_adopted`)."""
        for rel, data in files.items():
            path = (self.root / rel).resolve()
            if self.root not in path.parents:
                raise LfbenchError(
                    f"stage {stage.addressing}: a worker sent {rel}, outside the workspace"
                )
            write_if_changed(path, data)
        self.add(stage, entry)
        self.to_pull.append(stage.addressing)

    def flush(self) -> None:
        """Write the entries of the stages finished since the last flush, in one rewrite of
        each dvc.lock."""
        by_lock: dict[Path, dict[str, Any]] = {}
        for path, key, entry in self.pending:
            by_lock.setdefault(path, {})[key] = entry
        self.pending = []
        for path, entries in by_lock.items():
            self._write(entries, path)

    def pull_adopted(self) -> list[str]:
        """--cluster: the outputs of the stages workers ran so far, pulled from the remote into
        this workspace: their objects by hash in one transfer, then each stage checked out (as
        DVC's run-cache restore does; `dvc pull <stages>` builds an index per target, tens of
        seconds for fifty stages). Returns the names of stages whose outputs could not be
        pulled."""
        names, self.to_pull = self.to_pull, []
        if not names:
            return []
        self.flush()  # their entries first: the checkout follows them
        dvc.reload(self.repo)  # the stages as their adopted dvc.lock entries say
        stages = {s.addressing: s for s in dvc.stages(self.repo)}
        return dvc.pull_outputs(self.repo, [stages[name] for name in names])

    def _path(self) -> Path:
        return self.root / "dvc.lock"

    def _read(self, path: Path | None = None) -> Any:
        """dvc.lock parsed as DVC's round-trip YAML ({} when absent), the copy kept from the
        last write while nobody else changed the file: parsing a 200-kB dvc.lock takes DVC
        longer than writing it."""
        path = path or self._path()
        kept = self._docs.get(path)
        if kept is not None and kept[1] == _file_sig(path):
            return kept[0]
        return dvc.read_lock_doc(path)

    def _dump(self, data: Any, path: Path | None = None) -> None:
        path = path or self._path()
        dvc.write_lock_doc(path, data, self._texts.setdefault(path, dvc.LockText()))
        self._docs[path] = (data, _file_sig(path))

    def _write(self, entries: Mapping[str, Any], path: Path | None = None) -> None:
        """These entries into dvc.lock, as DVC's `Lockfile.dump_stages` writes them (its
        round-trip YAML, entries updated in place or appended), but atomically."""
        if not entries:
            return
        path = path or self._path()
        data = self._read(path)
        if not data:
            data.update({"schema": "2.0"})
            log.info("Generating lock file '%s'", path.relative_to(self.root))
        data["stages"] = data.get("stages", {})
        changed = any(data["stages"].get(k, {}) != v for k, v in entries.items())
        data["stages"].update(entries)
        self._dump(data, path)
        if changed:
            dvc.track_file(self.repo, str(path.relative_to(self.root)))

    def ignore_new_outputs(self, stages: Sequence[Any], locked: set[str]) -> None:
        """Write the .gitignore lines of new stages' outputs, in `declared` order (a serial run
        writes them as each stage saves its outputs, in its plan's order)."""
        new = [s for s in declared(self.repo, stages) if s.addressing not in locked]
        dvc.ignore_outputs(self.repo, new)

    def order(self, before: Sequence[str], stages: Sequence[Any]) -> None:
        """Entries new to dvc.lock in `declared` order; entries that were there keep their
        places (as under `dvc repro`, which updates them in place). The file is rewritten only
        when the order differs. Nothing to do (and dvc.lock not parsed again) when this run
        wrote no entry."""
        if not self._docs or not self._path().exists():
            return
        rank = {s.addressing: i for i, s in enumerate(declared(self.repo, stages))}
        data = self._read()
        entries = data.get("stages") or {}
        new = [k for k in entries if k not in set(before)]
        want = sorted(new, key=lambda k: rank.get(k, len(rank)))
        if new != want:
            for k in want:
                entries[k] = entries.pop(k)
            self._dump(data)
