"""The DVC steps around one stage's command, written once: what `dvc repro` does for a stage
(dvc/repo/reproduce.py, dvc/stage/__init__.py `Stage.run`), in one repository.

    decide   changed?  no: UNCHANGED
             yes: its outputs removed; restored from the run cache (then saved): RESTORED;
             else its dependencies saved: RUN
    (run)    its command, by the caller (`task.run_commands`)
    save     its outputs hashed, cached and committed, its run-cache entry written
    entry    its dvc.lock entry
    push     its outputs and run-cache entry to the team's DVC remote (`remote`)

Two callers, the same steps: the driver of `lfbench repro --jobs` in its workspace (each stage
decided when its upstream stages are done, the command a Dask task, saved and its entry written
when the task ends), and a cluster worker in its clone (`worker.run_in_clone`: the whole stage,
then pushed; the driver writes the entry it sends back). All DVC calls go through the door
(pipeline/dvc_internals.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline import dvc_internals as dvc
from pipeline.core.errors import ConfigError, LfbenchError

log = logging.getLogger(__name__)

UNCHANGED, RESTORED, RUN = "unchanged", "restored", "run"


def check_runnable(stage: Any) -> None:
    """A stage `lfbench repro` can run: not frozen, with a command."""
    if stage.frozen or not stage.cmd:
        raise ConfigError(f"stage {stage.addressing}: frozen or without a command")


@dataclass
class StageSteps:
    """`dvc repro`'s steps for the stages of one repository. `force`: run every stage, changed
    or not (`-f`). `remote`: the team's DVC remote takes part (a cluster worker): the run
    cache's entries of the stage are looked for there too, the restored outputs' objects
    pulled from it, and `push` sends what the stage made."""

    repo: Any
    force: bool = False
    remote: bool = False

    def unchanged(self, stage: Any, upstream: Sequence[Any] | None = None) -> bool:
        """Nothing to do: not forced, and its command, dependencies and outputs are its
        dvc.lock entry's (`upstream`: the stages it depends on, as `dvc repro` passes them)."""
        return not self.force and not dvc.changed(stage, upstream)

    def decide(
        self,
        stage: Any,
        upstream: Sequence[Any] | None = None,
        lap: Callable[[str], None] = lambda _: None,
    ) -> str:
        """Before the command: UNCHANGED, RESTORED (from the run cache, saved and committed) or
        RUN (its outputs removed and its dependencies saved: run its command, then `save`).
        `lap(part)` marks the end of each part (a worker's timeline)."""
        if self.unchanged(stage, upstream):
            return UNCHANGED
        check_runnable(stage)
        dvc.remove_outputs(stage)
        if not self.force and self.restore(stage, lap):
            self.save(stage)
            return RESTORED
        dvc.save_deps(stage)  # as DVC before it runs a stage's command
        return RUN

    def restore(self, stage: Any, lap: Callable[[str], None] = lambda _: None) -> bool:
        """The stage from the run cache, in DVC's order: asked with its dependencies as
        dvc.lock records them (unchanged, only the outputs missing: DVC takes the entry's own
        outputs; else it saves them and looks their hash up). Saving them first would make DVC
        take the lock entry's outputs, made from other inputs, as the result of the new ones.

        With the team's remote: when the local run cache has none, this stage's entries are
        pulled (keyed by the dependencies as they are now, known only once DVC saved them)
        and the stage, loaded afresh (its dependencies as recorded), asked once more."""
        if dvc.restore(self.repo, stage, pull=self.remote):
            return True
        if not self.remote:
            return False
        lap("restore")
        try:
            pulled = dvc.pull_run_cache(self.repo, stage)
        except Exception as e:  # noqa: BLE001 - then the stage runs: say why
            log.warning("stage %s: reading the remote's run cache: %s", stage.addressing, e)
            pulled = 0
        lap("run_cache")
        return bool(pulled) and dvc.restore(
            self.repo, dvc.loaded_again(self.repo, stage), pull=True
        )

    def save(self, stage: Any) -> None:
        """After the command (or a restore): outputs saved and committed, run cache written."""
        dvc.save(stage)

    def entry(self, stage: Any) -> dict[str, Any]:
        """The stage's dvc.lock entry."""
        return dvc.lock_entry(stage)

    def push(self, stage: Any, lap: Callable[[str], None] = lambda _: None) -> None:
        """Its cached outputs by their hashes, then its run-cache entry, to the team's remote
        (a failed run-cache push is a warning: the outputs are there)."""
        failed = dvc.push_outputs(self.repo, stage)
        if failed:
            raise LfbenchError(
                f"stage {stage.addressing}: {failed} outputs not pushed to the remote"
            )
        lap("push")
        try:
            dvc.push_run_cache(self.repo, stage)
        except Exception as e:  # noqa: BLE001 - the outputs are pushed: a warning
            log.warning("stage %s: pushing its run-cache entry: %s", stage.addressing, e)
