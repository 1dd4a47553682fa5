"""What the stages of every benchmark share.

- Usage: the report of a stage that called no model, where the report lives beside an output,
  and the run-state counters MLflow gets (they depend on the cache, so they stay out of the
  metrics files).
- The LLM response cache and a stage's resumable journal, and the end of an LLM stage: log its
  usage, fail on failed items (the others are written and cached), else clear its journal.
- The lineage every MLflow run carries (git, data, runtime, a DVC stage's md5).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pipeline import __version__
from pipeline.errors import StageFailed
from pipeline.io import read_json
from pipeline.lineage import dvc_file_md5, dvc_lock_entry, git_info, runtime_tags, stage_md5
from pipeline.llm.client import UsageReport, clear_journal

log = logging.getLogger(__name__)

STAGE_USAGE_KEYS = (
    "requests_sent",
    "retries",
    "cache_hits",
    "cache_misses",
    "journal_hits",
    "errors",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "wall_s",
)


def no_usage(label: str) -> UsageReport:
    """The usage report of a stage that called no model (published outputs, baselines)."""
    return UsageReport(label=label, **dict.fromkeys(set(UsageReport.model_fields) - {"label"}, 0))


def usage_path(out: Path) -> Path:
    """Where a stage writes its usage and cost report, beside its output."""
    return out.with_name(out.stem + ".usage.json")


def llm_paths(root: Path, stage: str) -> tuple[Path, Path]:
    """The shared response cache and this stage's resumable journal."""
    safe = stage.replace("@", "_").replace("/", "_")
    return (
        root / ".lfbench" / "cache" / "llm.sqlite",
        root / ".lfbench" / "journal" / f"{safe}.jsonl",
    )


def finish_llm_stage(stage: str, root: Path, report: UsageReport, failed: Sequence[Any]) -> None:
    """Log the stage's usage; raise StageFailed if any item failed (its outputs are written and
    its successful calls cached, so a re-run retries only the failed ones); else clear the
    journal."""
    if report.items:
        log.info(
            "%s: %d items, %d requests sent (%d retries), cache %d hits / %d misses, journal %d,"
            " tokens %d in / %d out, $%.4f, %.1f s",
            stage,
            report.items,
            report.requests_sent,
            report.retries,
            report.cache_hits,
            report.cache_misses,
            report.journal_hits,
            report.input_tokens,
            report.output_tokens,
            report.cost_usd,
            report.wall_s,
        )
    if failed:
        first = failed[0]
        raise StageFailed(
            f"{stage}: {len(failed)} item(s) failed (first: {first.generation_id}: {first.error});"
            " the outputs of the others are written and cached; re-run to retry the failed ones"
        )
    clear_journal(llm_paths(root, stage)[1])


# ---------------------------------------------------------------- what MLflow gets


def read_usage(path: Path) -> dict[str, float]:
    """The run-state counters of a stage (requests sent, cache hits, ...), for MLflow only."""
    if not path.exists():
        return {}
    raw = read_json(path)
    return {k: float(raw[k]) for k in STAGE_USAGE_KEYS if isinstance(raw.get(k), int | float)}


StageUsage = dict[tuple[str, str, str], dict[str, float]]


def collect_usage(
    models: Iterable[str], judges: Sequence[str], generations_dir: Path, judgements_dir: Path
) -> StageUsage:
    """{("generate", model, ""): counters, ("judge", model, judge): counters}."""
    usage: StageUsage = {}
    for model in models:
        usage[("generate", model, "")] = read_usage(generations_dir / f"{model}.usage.json")
        for judge in judges:
            usage[("judge", model, judge)] = read_usage(
                judgements_dir / model / f"{judge}.usage.json"
            )
    return usage


def usage_metrics(usage: StageUsage, row: dict[str, Any]) -> dict[str, float]:
    """A result row's `generate.*` and `judge.*` counters."""
    out: dict[str, float] = {}
    for stage, u in (
        ("generate", usage.get(("generate", row["model"], ""), {})),
        ("judge", usage.get(("judge", row["model"], row["judge"]), {})),
    ):
        out |= {f"{stage}.{k}": v for k, v in u.items()}
    return out


class _Run(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def judge(self) -> str: ...
    @property
    def generations(self) -> Sequence[Any]: ...
    @property
    def judgements(self) -> Sequence[Any]: ...


def prompt_shas(runs: Iterable[_Run], generation_default: str) -> dict[tuple[str, str], list[str]]:
    """{(model, judge): judge prompt hashes, (model, ""): generation prompt hashes}."""
    runs = list(runs)
    out = {(r.model, r.judge): sorted({j.judge_prompt_sha for j in r.judgements}) for r in runs}
    for r in runs:
        out[(r.model, "")] = sorted(
            {str(g.meta.get("prompt_sha", generation_default)) for g in r.generations}
        )
    return out


def joined_sha(shas: dict[tuple[str, str], list[str]], model: str, judge: str = "") -> str:
    return ",".join(shas.get((model, judge), [])) or "none"


def stage_md5_of(root: Path, stage: str) -> str:
    """The md5 of a stage's dvc.lock entry (what the result was made from), or "unknown"."""
    entry = dvc_lock_entry(root, stage)
    return stage_md5(entry) if entry else "unknown"


def common_tags(root: Path) -> dict[str, str]:
    """The lineage every MLflow run carries: the code (lfbench version, git commit, dirty), the
    data (data.dvc's md5) and where it ran (runtime, image digest, container)."""
    git = git_info(root)
    return {
        "lfbench.version": __version__,
        "data.digest": dvc_file_md5(root / "data.dvc") or "unknown",
        "git.commit": git.commit,
        "git.dirty": "unknown" if git.dirty is None else str(git.dirty).lower(),
        **runtime_tags(),
    }
