"""The stage layer's command line: `lfbench stage <verb>` (what `lfbench run` runs in the chosen
runtime: each dvc.yaml stage's work, in this process) and `lfbench agreement`.

Every dvc.yaml stage goes through this module and pipeline/cli.py: `lfbench check` follows the
imports of both at module level (pipeline/env/deps.py), so what they import there must be under
every stage's deps (pipeline/core, pipeline/stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.core.options import OutputFile, params_option, path_option
from pipeline.core.params import load_params

STAGES = (
    "construct",
    "retrieve",
    "generate",
    "judge",
    "aggregate",
    "results",
    "agreement",
    "train-local-judge",
)


class _StageGroup(click.Group):
    """Keeps the stage's own arguments (for the stage record) before click consumes them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["lfbench.stage_argv"] = list(args)
        return super().parse_args(ctx, args)


@click.group(cls=_StageGroup)
@click.pass_context
def stage(ctx: click.Context) -> None:
    """Run one pipeline stage in this process (normally called through `lfbench run`)."""
    argv = ctx.meta.get("lfbench.stage_argv") or []
    if ctx.invoked_subcommand and "--help" not in argv:
        from pipeline.data.verify import data_paths, verify_data
        from pipeline.stages.record import write_stage_record

        # before anything is written: the raw data it reads must be the pinned bytes
        verify_data(Path.cwd(), data_paths(Path.cwd(), argv[1:]))
        write_stage_record(Path.cwd(), ctx.invoked_subcommand, argv[1:])


def _bench(name: str, params_path: Path) -> tuple[Any, Any]:
    """The benchmark and the params, validated for it (the core and its own section)."""
    from pipeline.core import registry

    return registry.get(name), load_params(params_path, [name])


@stage.command("construct")
@click.option("--benchmark", required=True)
@path_option("--data", "data_dir")
@path_option("--out")
@params_option
def stage_construct(benchmark: str, data_dir: Path, out: Path, params_path: Path) -> None:
    """Raw data -> a validated, normalised dataset (and its usage file)."""
    from pipeline.stages.construct import construct

    construct(*_bench(benchmark, params_path), data_dir, out, Path.cwd())


@stage.command("retrieve")
@click.option("--benchmark", required=True)
@click.option("--retriever", required=True, help="a retrievers entry the benchmark lists")
@path_option("--dataset")
@path_option("--data", "data_dir")
@path_option("--out")
@params_option
def stage_retrieve(
    benchmark: str, retriever: str, dataset: Path, data_dir: Path, out: Path, params_path: Path
) -> None:
    """Dataset -> one ranking per query of the benchmark, by one of your retrievers."""
    from pipeline.stages.retrieve import retrieve

    retrieve(*_bench(benchmark, params_path), retriever, dataset, data_dir, out, Path.cwd())


@stage.command("generate")
@click.option("--benchmark", required=True)
@click.option("--model", required=True)
@path_option("--dataset")
@path_option("--data", "data_dir")
@path_option("--out")
@params_option
def stage_generate(
    benchmark: str, model: str, dataset: Path, data_dir: Path, out: Path, params_path: Path
) -> None:
    """Dataset -> one output per item for one model."""
    from pipeline.stages.generate import generate

    generate(*_bench(benchmark, params_path), model, dataset, data_dir, out, Path.cwd())


@stage.command("judge")
@click.option("--benchmark", required=True)
@click.option("--model", required=True)
@click.option("--judge", "judge_name", required=True)
@path_option("--dataset")
@path_option("--generations")
@path_option("--data", "data_dir")
@path_option("--out")
@params_option
def stage_judge(
    benchmark: str,
    model: str,
    judge_name: str,
    dataset: Path,
    generations: Path,
    data_dir: Path,
    out: Path,
    params_path: Path,
) -> None:
    """Outputs -> item-level judgements by one judge."""
    from pipeline.stages.judge import judge

    judge(
        *_bench(benchmark, params_path),
        model,
        judge_name,
        dataset,
        generations,
        data_dir,
        out,
        Path.cwd(),
    )


@stage.command("train-local-judge")
@click.option(
    "--benchmark", required=True, help="the benchmark whose released judgements it learns"
)
@click.option("--judge", "judge_name", required=True)
@path_option("--data", "data_dir")
@click.option(
    "--annotated",
    "eval_path",
    type=click.Path(path_type=Path),
    required=True,
    help="the human-annotated set; its haystacks are never trained on",
)
@path_option("--out")
@path_option("--metrics")
@params_option
def stage_train_local_judge(
    benchmark: str,
    judge_name: str,
    data_dir: Path,
    eval_path: Path,
    out: Path,
    metrics: Path,
    params_path: Path,
) -> None:
    """Released judgements -> the local judge's model file and its held-out evaluation."""
    from pipeline.stages.train_judge import train

    bench, params = _bench(benchmark, params_path)
    train(bench, params, judge_name, data_dir, eval_path, out, metrics, Path.cwd())


@stage.command("aggregate")
@click.option("--benchmark", required=True)
@path_option("--dataset")
@path_option("--generations", "generations_dir")
@path_option("--judgements", "judgements_dir")
@path_option("--metrics")
@click.option(
    "--summary",
    type=OutputFile(),
    required=True,
    help="The headline numbers nested for dvc metrics diff.",
)
@path_option("--report")
@params_option
@click.option(
    "--track/--no-track", default=True, show_default=True, help="Log one MLflow run per result row."
)
@click.option(
    "--agreement",
    "agreement_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The agreement stage's metrics: adds judge.kappa_vs_human to each run.",
)
@click.option(
    "--released",
    "released_path",
    type=OutputFile(),
    default=None,
    help="Also write the rows of the released systems (models with provider `published`)"
    " here: what another benchmark compares with (CRUX), apart from your models' rows.",
)
@click.option(
    "--results",
    "results_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The per-model results stages' folder: each model's early rows, checked against these.",
)
def stage_aggregate(
    benchmark: str,
    dataset: Path,
    generations_dir: Path,
    judgements_dir: Path,
    metrics: Path,
    summary: Path,
    report: Path,
    params_path: Path,
    track: bool,
    agreement_path: Path | None,
    released_path: Path | None,
    results_dir: Path | None,
) -> None:
    """Judgements -> metrics, report and MLflow runs."""
    from pipeline.stages.aggregate import aggregate

    aggregate(
        *_bench(benchmark, params_path),
        dataset,
        generations_dir,
        judgements_dir,
        metrics,
        summary,
        report,
        root=Path.cwd(),
        track=track,
        agreement_path=agreement_path,
        released_path=released_path,
        results_dir=results_dir,
    )


@stage.command("results")
@click.option("--benchmark", required=True)
@click.option("--model", required=True)
@path_option("--dataset")
@path_option("--generations", "generations_dir")
@path_option("--judgements", "judgements_dir")
@path_option("--out")
@params_option
@click.option(
    "--track/--no-track", default=True, show_default=True, help="Log one MLflow run per result row."
)
@click.option(
    "--agreement",
    "agreement_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The agreement stage's metrics: adds judge.kappa_vs_human to each run.",
)
def stage_results(
    benchmark: str,
    model: str,
    dataset: Path,
    generations_dir: Path,
    judgements_dir: Path,
    out: Path,
    params_path: Path,
    track: bool,
    agreement_path: Path | None,
) -> None:
    """One model's judgements -> its rows and MLflow runs (before the other models' are done)."""
    from pipeline.stages.aggregate import model_results

    bench, params = _bench(benchmark, params_path)
    model_results(
        bench,
        params,
        model,
        dataset,
        generations_dir,
        judgements_dir,
        out,
        root=Path.cwd(),
        track=track,
        agreement_path=agreement_path,
    )


def _agreement_options(f):  # type: ignore[no-untyped-def]
    for opt in reversed(
        [
            click.option("--benchmark", required=True),
            click.option(
                "--labels",
                type=click.Path(path_type=Path),
                required=True,
                help="The human labels (SummHay: eval_benchmark_data.json).",
            ),
            path_option("--out"),
            click.option(
                "--judgements",
                "judgements_dir",
                type=click.Path(path_type=Path),
                default=None,
                help="The pipeline's judgements, for judge-vs-judge agreement.",
            ),
            click.option("--report", type=OutputFile(), default=None),
            click.option("--plot", type=OutputFile(), default=None),
            click.option(
                "--project-judges/--published-only",
                default=True,
                show_default=True,
                help="Also score the annotated outputs with the judges of params.yaml.",
            ),
            click.option(
                "--track/--no-track", default=True, show_default=True, help="Log MLflow runs."
            ),
            params_option,
        ]
    ):
        f = opt(f)
    return f


def _run_agreement(
    benchmark: str,
    labels: Path,
    out: Path,
    judgements_dir: Path | None,
    report: Path | None,
    plot: Path | None,
    project_judges: bool,
    track: bool,
    params_path: Path,
) -> None:
    from pipeline.stages.agreement import agreement

    agreement(
        *_bench(benchmark, params_path),
        labels,
        out,
        judgements_dir=judgements_dir,
        report_path=report,
        plot_path=plot,
        root=Path.cwd(),
        track=track,
        project_judges=project_judges,
    )


@stage.command("agreement")
@_agreement_options  # type: ignore[untyped-decorator]
def stage_agreement(**kwargs: Any) -> None:
    """Judges vs human labels (and vs each other) -> agreement rows, report, MLflow runs."""
    from pipeline.stages.agreement import refuse_unlisted

    refuse_unlisted(*_bench(kwargs["benchmark"], kwargs["params_path"]), Path.cwd())
    _run_agreement(**kwargs)


@click.command("agreement")
@_agreement_options  # type: ignore[untyped-decorator]
def agreement_command(**kwargs: Any) -> None:
    """How far each judge agrees with people: kappa, correlation, linking accuracy.

    Writes {"rows": [...]}, one row per judge (and per pair of judges with --judgements).
    Runs in this process; `lfbench run agreement` (the DVC stage) picks the runtime.
    """
    from pipeline.data.verify import data_paths, verify_data

    verify_data(Path.cwd(), data_paths(Path.cwd(), [str(kwargs["labels"])]))
    _run_agreement(**kwargs)
