"""`lfbench track <benchmark>`: re-log a benchmark's MLflow runs from the pipeline's outputs
(e.g. after `dvc pull` on another machine), with nothing else changed.

The stage commands of dvc.yaml are the one source of paths: the `<benchmark>-aggregate` stage's
command is run again in this process with its metrics, summary and report sent to a scratch
folder, and when an `<benchmark>-agreement` stage exists and its metrics file does, its rows are
re-logged with the plot file the stage wrote.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import Any

from pipeline.core import dvcfile
from pipeline.core.errors import ConfigError
from pipeline.core.io import read_json
from pipeline.core.params import load_params


def stage_args(dvc_file: Path, stage: str) -> list[str] | None:
    """The arguments after `lfbench run <verb>` of a dvc.yaml stage, or None if it has none."""
    spec = dvcfile.stages(dvc_file).get(stage)
    if spec is None:
        return None
    argv = shlex.split(str(spec.get("cmd", "")))
    if argv[:2] != ["lfbench", "run"] or len(argv) < 3:
        raise ConfigError(f"{dvc_file}: stage {stage} does not run `lfbench run ...`")
    return argv[3:]


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def track(benchmark: str, params_path: Path, dvc_file: Path, root: Path) -> Any:
    from pipeline.core import registry
    from pipeline.stages.aggregate import aggregate
    from pipeline.stages.agreement import log_runs
    from pipeline.stages.common import context
    from pipeline.stages.mlflow_store import preflight

    bench = registry.get(benchmark)
    preflight(root)  # before the aggregate's work, not after it
    args = stage_args(dvc_file, f"{benchmark}-aggregate")
    if args is None:
        raise ConfigError(f"{dvc_file} has no stage {benchmark}-aggregate")

    def path(flag: str) -> Path:
        value = option(args, flag)
        if value is None:
            raise ConfigError(f"{dvc_file}: stage {benchmark}-aggregate has no {flag}")
        return Path(value)

    with tempfile.TemporaryDirectory() as tmp:
        # the aggregate stage's own work, its files written to a scratch folder, its runs logged
        agreement_path = option(args, "--agreement")
        aggregate(
            bench,
            load_params(params_path, [benchmark]),
            path("--dataset"),
            path("--generations"),
            path("--judgements"),
            Path(tmp) / "metrics.out",
            Path(tmp) / "summary.out",
            Path(tmp) / "report.out",
            root,
            track=True,
            agreement_path=Path(agreement_path) if agreement_path else None,
        )
    agreement = stage_args(dvc_file, f"{benchmark}-agreement")
    out = option(agreement or [], "--out")
    labels = option(agreement or [], "--labels")
    if bench.agreement is not None and out and labels and (root / out).exists():
        plot = option(agreement or [], "--plot")
        params = load_params(params_path, [benchmark])
        log_runs(
            bench,
            context(bench, params, root),
            read_json(root / out)["rows"],
            root / labels,
            root / plot if plot else None,
            root,
        )
