"""What every stage of every benchmark shares.

- Stage names (as in dvc.yaml: `<benchmark>-construct`, `<benchmark>-generate@<model>`,
  `<benchmark>-judge@<model>-<judge>`, ...), the benchmark's `Context` (its params section, its
  prompt files loaded, read access to the project's files) and the dataset file read back.
- Usage: the report of a stage that called no model, where the report lives beside an output,
  and the run-state counters MLflow gets (they depend on the cache, so they stay out of the
  metrics files).
- The LLM response cache and a stage's resumable journal, and the end of an LLM stage: log its
  usage, fail on failed items (the others are written and cached), else clear its journal.
- The lineage every MLflow run carries (git, data, runtime, a DVC stage's md5).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline import __version__
from pipeline.core.benchmark import AnyBenchmark, Context, Run
from pipeline.core.config import Params
from pipeline.core.errors import DataError, StageFailed
from pipeline.core.io import (
    canonical_json,
    iter_lines,
    read_json,
    read_jsonl,
    read_jsonl_lines,
    read_text,
)
from pipeline.core.lineage import dvc_file_md5, dvc_lock_entry, git_info, runtime_tags, stage_md5
from pipeline.core.prompts import load_prompt
from pipeline.core.types import UsageReport
from pipeline.llm.client import read_wall
from pipeline.llm.journal import clear_journal

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
    "truncated",
    "cache_corrupt",
    "journal_corrupt",
    "usage_missing",
)


# ---------------------------------------------------------------- names and context


def construct_stage(benchmark: str) -> str:
    return f"{benchmark}-construct"


def generate_stage(benchmark: str, model: str) -> str:
    return f"{benchmark}-generate@{model}"


def judge_stage(benchmark: str, model: str, judge: str) -> str:
    return f"{benchmark}-judge@{model}-{judge}"


def agreement_stage(benchmark: str, judge: str | None = None) -> str:
    return f"{benchmark}-agreement" + (f"@{judge}" if judge else "")


def retrieve_stage(benchmark: str, retriever: str) -> str:
    return f"{benchmark}-retrieve@{retriever}"


def retrieval_path(root: Path, benchmark: str, retriever: str) -> Path:
    """Where a retrieval stage writes its rankings (`pipeline/stages/retrieve.py`)."""
    return root / "retrievals" / benchmark / f"{retriever}.jsonl"


def retrieval_lineage_path(root: Path, benchmark: str, retriever: str) -> Path:
    """Where a retrieval stage writes what made its rankings (provider, model, entry and code or
    file digests): the aggregate's MLflow lineage; the same bytes however the requests were
    answered (a forced re-run from the cache changes nothing downstream)."""
    return root / "retrievals" / "lineage" / benchmark / f"{retriever}.json"


def retrieval_usage_path(root: Path, benchmark: str, retriever: str) -> Path:
    """Where a retrieval stage writes its usage and the retriever's lineage: apart from the
    rankings (the generate stages depend on those only, so a re-run answered by the cache,
    whose usage differs, re-runs nothing downstream)."""
    return root / "retrievals" / "usage" / benchmark / f"{retriever}.json"


class FileInputs:
    """The `Inputs` a benchmark reads through: files under the project root, named in errors as
    they were asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.root / p

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def json(self, path: str) -> Any:
        p = self._path(path)
        if not p.exists():
            raise DataError("file not found", file=path)
        try:
            return json.loads(read_text(p, path))
        except json.JSONDecodeError as e:
            raise DataError(
                f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", file=path
            ) from e

    def text(self, path: str) -> str:
        p = self._path(path)
        if not p.is_file():
            raise DataError("file not found", file=path)
        return read_text(p, path)

    def glob(self, folder: str, pattern: str) -> list[str]:
        p = self._path(folder)
        if not p.is_dir():
            raise DataError("folder not found", file=folder)
        return sorted(str(Path(folder) / f.name) for f in p.glob(pattern) if f.is_file())

    def jsonl(self, path: str) -> list[tuple[str, Any]]:
        p = self._path(path)
        if not p.exists():
            raise DataError("file not found", file=path)
        out = []
        for lineno, line in iter_lines(p, path):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                out.append((where, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"not valid JSON ({e.msg})", file=where) from e
        return out


def context(
    bench: AnyBenchmark, params: Params, root: Path, data_dir: str | Path = ""
) -> Context[Any]:
    """The benchmark's context: its section, its prompt files (loaded: a missing one is an error
    naming it), read access to the project, and the raw-data folder of the stage."""
    section = params.section(bench.name, bench.params_model)
    prompts = {
        name: load_prompt(path, root)
        for name, path in section.prompts.model_dump().items()
        if isinstance(path, str)
    }
    rankings = rankings_reader(root, bench.name)
    return Context(params, section, prompts, FileInputs(root), str(data_dir), rankings=rankings)


def rankings_reader(root: Path, benchmark: str) -> Callable[[str], Mapping[str, Any]]:
    """`Context.rankings`: a retriever's rankings by query id, read once from its retrieval
    stage's output (an error naming the file and the stage when it is not there)."""
    loaded: dict[str, dict[str, Any]] = {}

    def read(retriever: str) -> Mapping[str, Any]:
        if retriever not in loaded:
            path = retrieval_path(root, benchmark, retriever)
            shown = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
            if not path.is_file():
                raise DataError(
                    f"no rankings by retriever {retriever!r}: run its retrieval stage"
                    f" (`dvc repro {retrieve_stage(benchmark, retriever)}`)",
                    file=shown,
                )
            out: dict[str, Any] = {}
            for lineno, line in iter_lines(path, shown):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    out[str(row["query_id"])] = [(str(p), s) for p, s in row["ranking"]]
                except (ValueError, KeyError, TypeError) as e:
                    raise DataError(f"not a ranking line ({e})", file=f"{shown}:{lineno}") from e
            loaded[retriever] = out
        return loaded[retriever]

    return read


def read_dataset(bench: AnyBenchmark, path: Path) -> list[BaseModel]:
    """The dataset file, every line validated as the benchmark's record type."""
    records = read_jsonl(path, bench.record)
    if not records:
        raise DataError("the dataset is empty", file=str(path))
    return records


def not_judged(params: Params, model: str, judge: str) -> str | None:
    """Why `judge` does not judge `model`'s outputs, by design or by the user's choice (None: it
    judges them). Such a pair's judge stage sends nothing and writes no judgements; the
    aggregate lists it under `not_judged` with this reason.

    - a judge that replays released judgements only knows the released outputs;
    - an LLM judge judges the models its entry's `models` lists; without a list (the default),
      the models with calls only: a judge added to a benchmark does not also judge the published
      systems' thousands of released outputs, or the baselines, unless asked (`models: all`)."""
    from pipeline.core.config import OpenAIJudge

    spec, mspec = params.judges[judge], params.models[model]
    if spec.provider == "published" and mspec.provider != "published":
        return f"{judge} replays released judgements: it only knows the released outputs"
    if isinstance(spec, OpenAIJudge):
        if spec.models == "all":
            return None
        if isinstance(spec.models, list):
            if model in spec.models:
                return None
            return f"judges.{judge}.models does not list {model}"
        if mspec.provider != "openai":
            return (
                f"an LLM judge judges the models with calls unless judges.{judge}.models lists"
                f" others ({model} is provider {mspec.provider}; models: all for every model)"
            )
    return None


def applies(params: Params, model: str, judge: str) -> bool:
    """`judge` judges `model`'s outputs (see `not_judged`)."""
    return not_judged(params, model, judge) is None


def read_runs(
    params: Params,
    models: Sequence[str],
    judges: Sequence[str],
    generations_dir: Path,
    judgements_dir: Path,
) -> list[Run]:
    """The generations of each model and the judgements of each judge that applies to them."""
    from pipeline.core.records import Generation, Judgement

    runs = []
    for model in models:
        gens, gen_lines = read_jsonl_lines(generations_dir / f"{model}.jsonl", Generation)
        for judge in judges:
            if applies(params, model, judge):
                path = judgements_dir / model / f"{judge}.jsonl"
                js, j_lines = read_jsonl_lines(path, Judgement)
                runs.append(Run(model, judge, gens, js, gen_lines, j_lines))
    return runs


# ---------------------------------------------------------------- usage, cache, journal


def no_usage(label: str) -> UsageReport:
    """The usage report of a stage that called no model (published outputs, baselines)."""
    return UsageReport(label=label, **dict.fromkeys(set(UsageReport.model_fields) - {"label"}, 0))


# Fields of a model or judge entry that say how it is reached, paced or priced, not what it
# answers (a new port for the same server, a higher rate limit: the same rows).
_TRANSPORT = frozenset(
    {
        "base_url",
        "api_key_env",
        "max_concurrency",
        "requests_per_minute",
        "tokens_per_minute",
        "timeout_s",
        "max_retries",
        "price_input_per_1m",
        "price_output_per_1m",
        "embedding_cache",
        "batch_size",
        "price_per_1k_requests",
    }
)


def entry_sha(entry: BaseModel, benchmark: str) -> str:
    """A digest of a model or judge entry's settings that determine its rows on `benchmark`
    (temperature, max_tokens, settings, mode, its slice of this benchmark, ...; not
    `_TRANSPORT`, nor its slices of other benchmarks): part of a row's provenance, so that
    changing one model's entry makes new runs of its rows only."""
    fields = {k: v for k, v in entry.model_dump(mode="json").items() if k not in _TRANSPORT}
    if isinstance(fields.get("slice"), dict):
        fields["slice"] = fields["slice"].get(benchmark)
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:16]


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


def log_usage(stage: str, report: UsageReport) -> None:
    """The stage's usage line, and one warning when answers came without token usage."""
    if report.usage_missing:
        log.warning(
            "%s: %d answers came without token usage from the server: their tokens are"
            " unknown and the stage's cost is unknown (cost_usd null in its usage file, MLflow"
            " metric cost_unknown=1), not $0",
            stage,
            report.usage_missing,
        )
    if report.items:
        # a stage that called no model (the local judge, a baseline) has nothing to say here
        called = report.requests_sent or report.cache_hits or report.cache_misses
        log.log(
            logging.INFO if called or report.journal_hits else logging.DEBUG,
            "%s: %d items, %d requests sent (%d retries), cache %d hits / %d misses, journal %d,"
            " tokens %d in / %d out, %s, %.1f s",
            stage,
            report.items,
            report.requests_sent,
            report.retries,
            report.cache_hits,
            report.cache_misses,
            report.journal_hits,
            report.input_tokens,
            report.output_tokens,
            report.cost_text(),
            report.wall_s,
        )


def finish_llm_stage(stage: str, root: Path, report: UsageReport, failed: Sequence[Any]) -> None:
    """Log the stage's usage; raise StageFailed if any item failed (its outputs are written and
    its successful calls cached, so a re-run retries only the failed ones); else clear the
    journal."""
    log_usage(stage, report)
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
    out = {k: float(raw[k]) for k in STAGE_USAGE_KEYS if isinstance(raw.get(k), int | float)}
    wall = read_wall(path)  # run state of this workspace, when the stage ran here
    if wall is not None:
        out["wall_s"] = wall
    if "cost_usd" in raw and raw["cost_usd"] is None:  # answers without usage: unknown, not $0
        out["cost_unknown"] = 1.0
    return out


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


def usage_metrics(usage: StageUsage, model: str, judge: str) -> dict[str, float]:
    """A result row's `generate.*` and `judge.*` counters."""
    out: dict[str, float] = {}
    for stage, u in (
        ("generate", usage.get(("generate", model, ""), {})),
        ("judge", usage.get(("judge", model, judge), {})),
    ):
        out |= {f"{stage}.{k}": v for k, v in u.items()}
    return out


def prompt_shas(runs: Iterable[Run], params: Params) -> dict[tuple[str, str], list[str]]:
    """{(model, judge): judge prompt hashes, (model, ""): generation prompt hashes}. A
    generation without a prompt hash is a replayed release ("published") or "none"."""
    runs = list(runs)
    out = {(r.model, r.judge): sorted({j.judge_prompt_sha for j in r.judgements}) for r in runs}
    for r in runs:
        default = "published" if params.models[r.model].provider == "published" else "none"
        out[(r.model, "")] = sorted({str(g.meta.get("prompt_sha", default)) for g in r.generations})
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
