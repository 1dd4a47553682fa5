"""Stage `<benchmark>-construct`: raw data -> `datasets/<benchmark>.jsonl` (+ its usage file).

The benchmark builds and validates the records; when its construction needs a model (e.g.
Long²RAG's key points for a user's own questions) it is handed an `Asker` bound to the judges
entry it names, which sends its asks through the judge loop (cache, journal, one repair).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.benchmark import Answer, AnyBenchmark, Ask
from pipeline.core.config import OpenAIJudge, Params
from pipeline.core.errors import ConfigError, StageFailed
from pipeline.core.io import write_json, write_jsonl
from pipeline.core.types import UsageReport
from pipeline.llm.client import resolve_api_key, write_usage
from pipeline.llm.journal import clear_journal
from pipeline.stages.common import (
    construct_stage,
    context,
    llm_paths,
    log_usage,
    no_usage,
    usage_path,
)

log = logging.getLogger(__name__)


class StageAsker:
    """An `Asker` for one stage: one endpoint, the stage's cache and journal, the judge loop;
    it sums the usage of every batch."""

    def __init__(self, name: str, spec: OpenAIJudge, stage: str, root: Path) -> None:
        self.name = name
        self.endpoint = spec.endpoint()
        self.repair = spec.repair
        self.stage = stage
        self.cache, self.journal = llm_paths(root, stage)
        self.report: UsageReport | None = None

    def __call__(self, asks: Sequence[Ask], step: str) -> list[Answer]:
        from pipeline.llm_judge.loop import ask_all

        if not asks:
            return []
        resolve_api_key(self.endpoint, f"judges.{self.name}")  # only when a model is needed
        answers, report = ask_all(
            self.endpoint,
            asks,
            repair=self.repair,
            cache_path=self.cache,
            journal_path=self.journal,
            label=f"{self.stage} ({step})",
        )
        self.report = report if self.report is None else self.report.merged(report)
        return answers


def files_dir(out: Path) -> Path:
    """Where a dataset's side files go: `datasets/<name>.jsonl` -> `datasets/<name>/`."""
    return out.with_suffix("")


def construct(bench: AnyBenchmark, params: Params, data_dir: Path, out: Path, root: Path) -> int:
    stage = construct_stage(bench.name)
    ctx = context(bench, params, root, data_dir)
    asker = None
    llm = ctx.section.construction_llm()
    if llm is not None:
        spec = params.judges.get(llm)
        if not isinstance(spec, OpenAIJudge):
            raise ConfigError(f"{bench.name}: construction needs judges.{llm}, an openai entry")
        asker = StageAsker(llm, spec, stage, root)
    built = bench.construct(ctx, asker)
    report = asker.report if asker is not None and asker.report is not None else no_usage(stage)
    report = report.model_copy(update={"label": stage})
    n = write_jsonl(out, built.records)
    write_usage(usage_path(out), report)
    if built.files:
        # the dataset's side files (e.g. CRUD-RAG's question caches), in a folder beside it
        folder = files_dir(out)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*"):
            if stale.is_file() and stale.name not in built.files:
                stale.unlink()
        for name, content in built.files.items():
            write_json(folder / name, content)
    log.info("wrote %s: %d records%s", out, n, f"; {built.summary}" if built.summary else "")
    log_usage(stage, report)
    if built.failures:
        item, error = built.failures[0]
        raise StageFailed(
            f"{stage}: {len(built.failures)} item(s) failed (first: {item}: {error}); the others"
            " are written; their calls are cached"
        )
    clear_journal(llm_paths(root, stage)[1])
    return n
