"""The `lfbench` command.

    lfbench data fetch [--mirror DIR]      fill data/ from pinned sources, verified
    lfbench run <stage> [ARGS]             run a pipeline stage in the chosen runtime (dvc.yaml)
    lfbench image recipe|build|verify|push|pull
                                           the stages' image: its recipe (build/image.json),
                                           reproducible build, check by rebuilding, and its
                                           travels (a registry, the DVC remote)
    lfbench stage <stage> [ARGS]           run a stage in this process (what `run` calls)
    lfbench track <benchmark>              (re)log MLflow runs from the pipeline's outputs
    lfbench check                          validate params.yaml whole (every benchmark section)
    lfbench plan [TARGETS] [--json]        what `dvc repro` would send: requests, tokens, $, time
    lfbench repro [-j N] [--cluster A]     dvc repro with independent stages side by side
    lfbench prune                          drop what removed stages left in dvc.lock and outputs
    lfbench worker SCHEDULER [--clone DIR] a Dask worker for `lfbench repro --cluster`
    lfbench new-benchmark NAME             a new benchmark package from the template
    lfbench ui [--host H] [--port P]       the MLflow UI on the project's store
    lfbench compare RUN_A RUN_B [--json]   what differs between two runs, with significance
    lfbench report [--out DIR]             one HTML + markdown report of the current results
    lfbench audit sample|score             people audit a judge on a run's own outputs: a
                                           sample of its verdicts to label (MLflow traces, CSV),
                                           then kappa and a corrected score logged on the run

Every error about bad input is printed as one line naming the file, item and field, and the
command exits with status 2; a stage whose items partly failed exits with status 3 (so does
`lfbench score` when a line could not be scored, its output written); a stage stopped by Ctrl-C
exits with status 130 once the requests in flight are in its journal. Output files
are checked as the command line is read, before any work. `lfbench <command> --help` works for
every command and group (`lfbench run --help`, and `lfbench run <stage> --help` for a stage's).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline import __version__
from pipeline.core.config import load_yaml
from pipeline.core.errors import Interrupted, LfbenchError, StageFailed
from pipeline.core.lineage import ENV_IMAGE_DIGEST, ENV_IMAGE_RECIPE, ENV_RUNTIME, git_env
from pipeline.core.params import load_params

F = TypeVar("F", bound=Callable[..., Any])

STAGES = (
    "construct",
    "retrieve",
    "generate",
    "judge",
    "aggregate",
    "agreement",
    "train-local-judge",
)
log = logging.getLogger("lfbench")


ENV_VERBOSE = "LFBENCH_VERBOSE"  # 1: `--verbose` for every lfbench process (dvc repro's stages)
# The loggers whose INFO lines a user reads: each stage's steps, progress and results.
OWN_LOGGERS = ("lfbench", "pipeline")


class _UserFacing(logging.Filter):
    """Without `--verbose`: the project's INFO lines, and warnings and errors from anywhere.
    A library's own chatter (bm25s sets its logger to DEBUG when imported; ONNX Runtime's
    quantiser logs INFO lines on the root logger) stays out whatever level it chose."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        own = record.name.split(".", 1)[0] in OWN_LOGGERS
        return own and record.levelno >= logging.INFO


def verbose_requested(flag: bool) -> bool:
    """`--verbose`, or LFBENCH_VERBOSE=1 (how a `dvc repro` gets its stages' debug lines)."""
    return flag or os.environ.get(ENV_VERBOSE, "").strip().lower() in ("1", "true", "yes")


def _setup_logging(verbose: bool) -> None:
    verbose = verbose_requested(verbose)
    if verbose:
        os.environ[ENV_VERBOSE] = "1"  # the stages this process starts (a container too)
    else:
        # MLflow logs through its own handler ("Creating initial MLflow database tables..."),
        # set up when it is imported: its level comes from this variable.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: a host that set up logging keeps its own
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        if not verbose:
            handler.addFilter(_UserFacing())
        root.addHandler(handler)
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("alembic", "mlflow", "urllib3", "httpx", "httpcore", "openai", "docker"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def params_option(f: F) -> F:
    """`--params FILE` (params.yaml by default), as every command takes it."""
    return click.option(
        "--params",
        "params_path",
        type=click.Path(path_type=Path),
        default=Path("params.yaml"),
        show_default=True,
    )(f)


class OutputFile(click.Path):
    """A file the command writes: checked when the command line is read, before any work (a
    folder, or a place this process cannot write in, is a usage error naming the option)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipeline.core.errors import DataError
        from pipeline.core.io import check_output

        path = super().convert(value, param, ctx)
        try:
            check_output(Path(os.fsdecode(path)))
        except DataError as e:
            self.fail(f"{e.reason} ({os.fsdecode(path)})", param, ctx)
        return path


class OutputDir(click.Path):
    """A folder the command writes in (made if missing): checked like `OutputFile`."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipeline.core.errors import DataError
        from pipeline.core.io import check_output_dir

        path = super().convert(value, param, ctx)
        try:
            check_output_dir(Path(os.fsdecode(path)))
        except DataError as e:
            self.fail(f"{e.reason} ({os.fsdecode(path)})", param, ctx)
        return path


class Seconds(click.ParamType[float, Any]):
    """A positive, finite number of seconds (not nan, inf or a negative time)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        try:
            secs = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r}: not a number of seconds", param, ctx)
        if not (math.isfinite(secs) and secs > 0):
            self.fail(f"{value!r}: give a positive, finite number of seconds", param, ctx)
        return secs


OUTPUTS = ("--out", "--metrics", "--summary", "--report", "--plot")


def path_option(flag: str, dest: str | None = None) -> Callable[[F], F]:
    """A required path option (`--out`, `--dataset`, ...); an output file is checked first."""
    decls = (flag, dest) if dest else (flag,)
    kind = OutputFile() if flag in OUTPUTS else click.Path(path_type=Path)
    return click.option(*decls, type=kind, required=True)


@click.group()
@click.version_option(__version__, prog_name="lfbench")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Debug logging, libraries' included (LFBENCH_VERBOSE=1 does the same, also for the"
    " stages of a dvc repro).",
)
def cli(verbose: bool) -> None:
    """lfbench: reproducible long-form RAG benchmarks."""
    _setup_logging(verbose)


# ---------------------------------------------------------------- data


@cli.group()
def data() -> None:
    """Raw inputs: fetch and verify data/."""


@data.command("fetch")
@click.option(
    "--mirror",
    type=click.Path(path_type=Path),
    default=None,
    help="A local folder with the same layout as data/ (or $LFBENCH_DATA_MIRROR).",
)
@click.option(
    "--data-dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True
)
@click.option(
    "--manifest",
    type=click.Path(path_type=Path),
    default=Path("data.sources.yaml"),
    show_default=True,
)
@click.option("--only", multiple=True, help="Only files under this folder (e.g. one benchmark's).")
@click.option(
    "--dvc-commit/--no-dvc-commit",
    default=True,
    show_default=True,
    help="Check data/ against data.dvc and store it in the DVC cache.",
)
def data_fetch(
    mirror: Path | None, data_dir: Path, manifest: Path, only: tuple[str, ...], dvc_commit: bool
) -> None:
    """Fill data/ from the pinned public sources (or a mirror), verifying every checksum."""
    from pipeline.data.fetch import dvc_commit_data, fetch, resolve_mirror

    source = resolve_mirror(str(mirror) if mirror else None)
    report = fetch(
        data_dir, manifest, mirror=source, only=list(only) or None, log=lambda m: log.info("%s", m)
    )
    log.info(
        "data: %d files fetched from %s, %d already present and verified",
        len(report.copied),
        source or "the pinned public sources",
        len(report.already_ok),
    )
    dvc_file = data_dir.parent / f"{data_dir.name}.dvc"
    if dvc_commit and not only and dvc_file.exists():
        dvc_commit_data(dvc_file)
        log.info("data: matches %s and is in the DVC cache", dvc_file)


# ---------------------------------------------------------------- stages


class _StageGroup(click.Group):
    """Keeps the stage's own arguments (for the stage record) before click consumes them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["lfbench.stage_argv"] = list(args)
        return super().parse_args(ctx, args)


@cli.group(cls=_StageGroup)
@click.pass_context
def stage(ctx: click.Context) -> None:
    """Run one pipeline stage in this process (normally called through `lfbench run`)."""
    argv = ctx.meta.get("lfbench.stage_argv") or []
    if ctx.invoked_subcommand and "--help" not in argv:
        from pipeline.data.verify import data_paths, verify_data
        from pipeline.tools.containers import write_stage_record

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
    _run_agreement(**kwargs)


@cli.command("agreement")
@_agreement_options  # type: ignore[untyped-decorator]
def agreement_command(**kwargs: Any) -> None:
    """How far each judge agrees with people: kappa, correlation, linking accuracy.

    Writes {"rows": [...]}, one row per judge (and per pair of judges with --judgements).
    Runs in this process; `lfbench run agreement` (the DVC stage) picks the runtime.
    """
    from pipeline.data.verify import data_paths, verify_data

    verify_data(Path.cwd(), data_paths(Path.cwd(), [str(kwargs["labels"])]))
    _run_agreement(**kwargs)


HELP = ("--help", "-h")


class _RunCommand(click.Command):
    """`lfbench run` passes every option after the stage name to the stage, so click's own help
    option is off; `--help` before the stage name (or alone) shows this command's help, and
    after it the stage's (`lfbench run judge --help`), without reading params.yaml."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            if arg in HELP:
                click.echo(ctx.get_help(), color=ctx.color)
                ctx.exit(0)
            if arg in STAGES:
                break
        return super().parse_args(ctx, args)


@cli.command(
    cls=_RunCommand,
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    },
)
@click.argument("stage_name", type=click.Choice(STAGES))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@params_option
def run(stage_name: str, args: tuple[str, ...], params_path: Path) -> None:
    """Run a pipeline stage in the runtime params.yaml chooses (dvc.yaml calls this).

    ARGS are the stage's own options: `lfbench run STAGE --help` lists them."""
    from pipeline.tools import containers

    if any(a in HELP for a in args):
        stage.main(args=[stage_name, "--help"], prog_name="lfbench run", standalone_mode=False)
        return

    params = load_params(params_path, [])  # the stage validates its own benchmark's section
    root = Path.cwd()
    # said by the stage that decides (with its one warning); the others follow it quietly
    decided = containers.remembered(root, containers.read_recipe(root), params.runtime)
    decision, client = _runtime(root, params.runtime)
    log.log(
        logging.DEBUG if decided else logging.INFO,
        "stage %s: runtime %s (%s)",
        stage_name,
        decision["runtime"],
        decision["why"],
    )
    recipe_env = {ENV_IMAGE_RECIPE: str(decision["recipe"])}
    if decision["runtime"] == "local":
        os.environ.update({**git_env(root), **recipe_env, ENV_RUNTIME: "local"})
        stage.main(
            args=[stage_name, *args, "--params", str(params_path)],
            prog_name="lfbench stage",
            standalone_mode=False,
        )
        return
    image_id = str(decision["image_id"])
    runner_env = {
        **git_env(root),
        **recipe_env,
        ENV_RUNTIME: "docker",
        ENV_IMAGE_DIGEST: image_id,
        "PYTHONPATH": str(root.resolve()),
        # The image ships no bytecode (smaller, and reproducible): the stages' imports are
        # compiled once per image into the workspace's .lfbench/pycache, then reused.
        "PYTHONPYCACHEPREFIX": str(root.resolve() / containers.PYCACHE_DIR / image_id[7:19]),
        "PYTHONDONTWRITEBYTECODE": "",
    }
    env = containers.container_env(load_yaml(params_path) or {}, os.environ, runner_env)
    mirror = os.environ.get(containers.ENV_DATA_MIRROR)
    try:
        code = containers.run_stage_in_container(
            image_id,
            containers.stage_argv(stage_name, args, params_path),
            root,
            env,
            client=client or containers.docker_client(),
            mounts=[Path(mirror)] if mirror else [],
        )
    except containers.Terminated:
        sys.exit(143)
    if code != 0:
        sys.exit(code)


def _runtime(root: Path, requested: str) -> tuple[dict[str, Any], Any]:
    """Where this `dvc repro`'s stages run: decided (and said, or warned) by its first stage,
    remembered for the others."""
    from pipeline.tools import containers

    recipe = containers.read_recipe(root)
    memo = containers.remembered(root, recipe, requested)
    if memo is not None:
        return memo, None
    with containers.deciding(root):  # stages starting at once (lfbench repro --jobs): one decides
        memo = containers.remembered(root, recipe, requested)
        if memo is not None:
            return memo, None
        return _decide(root, recipe, requested)


def _decide(root: Path, recipe: dict[str, Any], requested: str) -> tuple[dict[str, Any], Any]:
    from pipeline.tools import containers, image_store

    client = containers.docker_client() if requested != "local" else None
    decision = containers.decide(
        requested,
        recipe,
        client=client,
        obtain=lambda: image_store.ensure_image(root, recipe, client=client),
    )
    if decision.get("warn"):
        log.warning(
            "stages of this run go local, not in the pinned image: %s (set `runtime: local` "
            "to silence this, or `runtime: docker` to make it an error)",
            ": ".join(str(decision[k]) for k in ("why", "reason") if decision.get(k)),
        )
    containers.remember(root, recipe, requested, decision)
    return decision, client


# ---------------------------------------------------------------- image


@cli.group()
def image() -> None:
    """The container image every stage runs in: its recipe, build and travels."""


@image.command("recipe")
@click.option(
    "--out",
    type=OutputFile(),
    default=Path("build/image.json"),
    show_default=True,
    help="Where to write the recipe (DVC output of the `image` stage).",
)
@params_option
def image_recipe(out: Path, params_path: Path) -> None:
    """Write the image's recipe: base reference and input hashes (no engine needed)."""
    from pipeline.core.io import write_json
    from pipeline.tools import containers

    params = load_params(params_path, [])
    rec = containers.recipe(Path.cwd(), params.image_base)
    write_json(out, rec)
    log.info("image: recipe %s on %s (%s)", rec["tag"], rec["base_image"], out)


def _engine_and_recipe(params_path: Path = Path("params.yaml")) -> tuple[Any, dict[str, Any]]:
    """The engine, and the image recipe of this workspace: computed from its files and params
    as the `image` stage computes it (a fresh clone has no build/image.json before `dvc repro
    image`; a stale one names another recipe, and says so)."""
    from pipeline.tools import containers

    client = containers.docker_client()
    if client is None:
        raise LfbenchError("no Docker engine answers (check DOCKER_HOST or start dockerd)")
    root = Path.cwd()
    rec = containers.recipe(root, load_params(params_path, []).image_base)
    try:
        written = containers.read_recipe(root)
    except LfbenchError:
        written = None  # not made yet (a fresh clone), or unreadable: the computed one serves
    if written is not None and written.get("recipe") != rec["recipe"]:
        log.warning(
            "%s names recipe %s, but this workspace's files make %s: using the latter (`dvc"
            " repro image` updates the file)",
            containers.IMAGE_JSON,
            str(written.get("tag")),
            rec["tag"],
        )
    return client, rec


@image.command("build")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
def image_build(no_cache: bool) -> None:
    """Build the image of build/image.json's recipe (present already: nothing to do).

    Built with buildah (reproducible), its id is recorded in build/image.refs.json (commit it):
    `lfbench image verify` rebuilds and compares."""
    from pipeline.tools import containers, image_store

    client, rec = _engine_and_recipe()
    root = Path.cwd()
    found = None if no_cache else containers.find_image(client, rec)
    if found is None:
        found = containers.build_image(root, rec, client=client, nocache=no_cache)
        # a record of this recipe on this base that names another id stays (it is what
        # `image verify` checks); the build warned, naming both ids
        if (
            containers.image_builder() == "buildah"
            and image_store.recorded_differs(root, rec, found, client=client) is None
        ):
            image_store.record_build(root, rec, found, client=client)
            click.echo(f"recorded in {image_store.REFS_JSON}: commit it")
    click.echo(f"{rec['tag']} {found}")


@image.command("verify")
def image_verify() -> None:
    """Rebuild the recipe's image from scratch (buildah) and check that it has the id
    build/image.refs.json records and the id of the image here (pulled or built)."""
    from pipeline.tools import image_store

    client, rec = _engine_and_recipe()
    checked = image_store.verify(Path.cwd(), rec, client=client)
    click.echo(
        f"{rec['tag']} {checked['rebuilt']}: the rebuild matches "
        + ", ".join(k for k in checked if k not in ("rebuilt", "base_id"))
    )


@image.command("push")
@click.option("--registry", default=None, help="HOST:PORT/REPO of an OCI registry.")
@click.option("--dvc", "to_dvc", is_flag=True, help="Save the image into the DVC remote.")
@click.option("--remote", default=None, help="The DVC remote (default: the project's).")
def image_push(registry: str | None, to_dvc: bool, remote: str | None) -> None:
    """Send the recipe's image to a registry (pinned by digest in build/image.refs.json, which
    you commit) and/or to the DVC remote (an archive keyed by the recipe digest)."""
    from pipeline.tools import image_store

    if not registry and not to_dvc:
        raise click.UsageError("say where: --registry HOST:PORT/REPO and/or --dvc")
    client, rec = _engine_and_recipe()
    root = Path.cwd()
    if registry:
        ref = image_store.push_registry(root, rec, registry, client=client)
        click.echo(f"registry: {ref} (recorded in {image_store.REFS_JSON}: commit it)")
    if to_dvc:
        click.echo(f"dvc: {image_store.push_dvc(root, rec, client=client, remote=remote)}")


@image.command("pull")
def image_pull() -> None:
    """Fetch the recipe's image: from the registry its digest names, else the DVC remote."""
    from pipeline.tools import containers, image_store

    client, rec = _engine_and_recipe()
    found = containers.find_image(client, rec)
    got = (found, "present") if found else image_store.pull(Path.cwd(), rec, client=client)
    if got is None:
        raise LfbenchError(
            f"no store has the image of recipe {rec['tag']}: `lfbench image build`, "
            "then `lfbench image push`"
        )
    click.echo(f"{rec['tag']} {got[0]} ({got[1]})")


@cli.command()
@click.argument("benchmark")
@params_option
@click.option(
    "--dvc-file", type=click.Path(path_type=Path), default=Path("dvc.yaml"), show_default=True
)
def track(benchmark: str, params_path: Path, dvc_file: Path) -> None:
    """Re-log the MLflow runs of a benchmark from its outputs (e.g. after `dvc pull`).

    Runs the `<benchmark>-aggregate` stage's command of dvc.yaml with its metrics, summary and
    report sent to a scratch folder (only MLflow changes), and, when the benchmark has an
    `<benchmark>-agreement` stage whose metrics exist, re-logs its agreement runs.
    """
    from pipeline.stages.track import track as track_runs

    track_runs(benchmark, params_path, dvc_file, Path.cwd())


@cli.command()
@params_option
@click.option(
    "--dvc-file", type=click.Path(path_type=Path), default=Path("dvc.yaml"), show_default=True
)
def check(params_path: Path, dvc_file: Path) -> None:
    """Validate params.yaml whole (the core and every benchmark section, each by its package),
    and check that each stage of dvc.yaml depends on all the code it runs."""
    from pipeline.core import registry
    from pipeline.core.config import OpenAIJudge
    from pipeline.stages.common import applies
    from pipeline.tools import deps

    params = load_params(params_path)
    for name in params.benchmarks():
        section = params.section(name, registry.get(name).params_model)
        click.echo(f"{name}: {len(section.models)} models, {len(section.judges)} judges")
        for judge in section.judges:  # what each LLM judge costs: the models it judges
            if not isinstance(params.judges[judge], OpenAIJudge):
                continue
            judged = [m for m in section.models if applies(params, m, judge)]
            left = [m for m in section.models if m not in judged]
            click.echo(
                f"  LLM judge {judge} judges: {', '.join(judged) or 'none of them'}"
                + (f"; not (judges.{judge}.models): {', '.join(left)}" if left else "")
            )
            if not judged:
                click.echo(
                    f"  note: {judge} judges no model of {name} (by default an LLM judge judges"
                    f" the models with calls): list the ones it should judge in"
                    f" judges.{judge}.models, or write models: all"
                )
    click.echo(f"{params_path}: valid")
    root = Path.cwd()
    from pipeline.stages.plan import context_fit

    for line in context_fit(root, params):  # models that declare their context window
        click.echo(line)
    stale = [c for c in deps.check(root, dvc_file) if c.uncovered]
    for c in stale:
        click.echo(f"{dvc_file}: stage {c.stage} runs code its deps miss: {', '.join(c.uncovered)}")
        click.echo(f"  deps that cover its code: {', '.join(deps.suggest(root, c.files))}")
    if stale:
        raise LfbenchError(f"{len(stale)} stage(s) of {dvc_file} have stale code dependencies")
    untrained = deps.missing_models(root, params, dvc_file)
    if untrained:
        raise LfbenchError(
            f"{dvc_file}: a judge stage whose benchmark lists the local judge must depend on its"
            f" model (add it to the stage's deps): {'; '.join(untrained)}"
        )
    from pipeline.stages.entries import unlisted

    missing = unlisted(params, dvc_file)
    if missing:
        raise LfbenchError(
            f"{dvc_file}: a stage reads a params.yaml entry its params do not list (add it to"
            f" the stage's params, so a change to it re-runs the stage): {'; '.join(missing)}"
        )
    click.echo(f"{dvc_file}: every stage depends on the code it runs and the entries it reads")


@cli.command()
@click.argument("targets", nargs=-1)
@params_option
@click.option(
    "--seconds-per-request",
    type=Seconds(),
    default=None,
    help="Assumed time of one request, for the time of stages without a rate limit or a"
    " measured rate (requests run max_concurrency at a time).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--dry",
    is_flag=True,
    help="Instead: DVC's own dry run, `dvc repro --dry [TARGETS]` (the commands in the order"
    " it runs them), which plain DVC fails on a stage whose inputs another has yet to make.",
)
def plan(
    targets: tuple[str, ...],
    params_path: Path,
    seconds_per_request: float | None,
    as_json: bool,
    dry: bool,
) -> None:
    """What `dvc repro [TARGETS]` would send, sending nothing: per stage DVC reports changed,
    model and judge, the requests (less the response cache's hits), prompt and completion
    tokens, dollars and time."""
    from pipeline.stages.plan import dvc_dry_run, plan_project, render

    if dry:
        code = dvc_dry_run(Path.cwd(), targets)
        if code:
            raise LfbenchError(f"dvc repro --dry failed (exit status {code})")
        return
    result = plan_project(Path.cwd(), load_params(params_path), targets, seconds_per_request)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        click.echo(render(result), nl=False)


@cli.command()
@click.argument("targets", nargs=-1)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Stages at once (at most: stages that use the CPU are also limited to the cores).",
)
@click.option(
    "--cluster",
    default=None,
    metavar="ADDRESS",
    help="A Dask scheduler (tcp://HOST:8786): run the stages on its `lfbench worker`s, each in"
    " its own clone, sharing the team's DVC remote, MLflow server and response cache.",
)
@click.option(
    "--shared-cache/--no-shared-cache",
    default=True,
    show_default=True,
    help="--cluster: require the workers to share the driver's response cache"
    " (LFBENCH_CACHE_URL); --no-shared-cache lets each worker keep its own, and a request two"
    " workers need is then paid by each.",
)
@click.option(
    "--connect-timeout",
    type=Seconds(),
    default=None,
    metavar="SECONDS",
    help="--cluster: how long the scheduler has to answer [default: 10 s].",
)
@click.option("-f", "--force", is_flag=True, help="Run every stage, changed or not.")
def repro(
    targets: tuple[str, ...],
    jobs: int,
    cluster: str | None,
    shared_cache: bool,
    connect_timeout: float | None,
    force: bool,
) -> None:
    """`dvc repro [TARGETS]` with independent stages side by side: the same stages, the same
    dvc.lock and outputs, each stage as soon as the stages it depends on are done."""
    from pipeline.tools.cluster import DRIVER_CONNECT_S
    from pipeline.tools.parallel import failed_log_tail, run_repro, summary
    from pipeline.tools.repro_view import LiveView

    result = run_repro(
        Path.cwd(),
        targets,
        jobs=jobs,
        cluster=cluster,
        force=force,
        view=LiveView(),
        shared_cache=shared_cache,
        connect_timeout=connect_timeout or DRIVER_CONNECT_S,
    )
    for line in summary(result):
        click.echo(line, err=True)
    for st in result.failed:
        tail = failed_log_tail(st)
        if tail:
            click.echo(f"last lines of {st.name}'s log:\n{tail}", err=True)
    if result.interrupted:
        sys.exit(130)
    if not result.ok:
        sys.exit(1)


@cli.command()
@click.argument("scheduler")
@click.option(
    "--clone",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path.cwd,
    show_default="the current folder",
    help="This worker's clone of the project (set up like every machine of the team).",
)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--name", default=None, help="The worker's name on the cluster.")
@click.option(
    "--connect-timeout",
    type=Seconds(),
    default=None,
    metavar="SECONDS",
    help="How long to wait for the scheduler to answer at start [default: 120 s].",
)
def worker(
    scheduler: str, clone: Path, jobs: int, name: str | None, connect_timeout: float | None
) -> None:
    """A Dask worker for `lfbench repro --cluster SCHEDULER`: runs stages in its own clone,
    pulling what they read from the team's DVC remote and pushing what they make."""
    from pipeline.tools.cluster import WORKER_CONNECT_S, serve

    serve(scheduler, clone, jobs, name, connect_timeout or WORKER_CONNECT_S)


@cli.command()
@click.option(
    "--force",
    is_flag=True,
    help="Also remove outputs whose content is not in the DVC cache (edited by hand), after"
    " saving them in the cache.",
)
def prune(force: bool) -> None:
    """Drop what stages no longer in dvc.yaml left behind (a model or judge removed from
    params.yaml): their dvc.lock entries and their outputs in the workspace (they stay in the
    DVC cache). An output whose content is not in the cache is refused: nothing is pruned
    (--force saves it in the cache first). `lfbench repro` does it first."""
    from pipeline.tools.parallel import prune_workspace

    gone = prune_workspace(Path.cwd(), force=force)
    click.echo(f"pruned {len(gone)} stage(s)" + (f": {', '.join(gone)}" if gone else ""))


@cli.command("new-benchmark")
@click.argument("name")
@click.option(
    "--wire/--no-wire",
    default=True,
    show_default=True,
    help="Also append its params section to params.yaml and its stages to dvc.yaml.",
)
@click.option(
    "--local-judge/--no-local-judge",
    default=False,
    show_default=True,
    help="Also judge it with the local judge (its judge stages then depend on the local judge's"
    " model, trained on SummHay's data).",
)
@params_option
@click.option(
    "--dvc-file", type=click.Path(path_type=Path), default=Path("dvc.yaml"), show_default=True
)
def new_benchmark(
    name: str, wire: bool, local_judge: bool, params_path: Path, dvc_file: Path
) -> None:
    """Start a benchmark package from pipeline/benchmarks/_template (a working toy benchmark),
    with its test file."""
    from pipeline.tools.scaffold import create

    params, dvc = (params_path, dvc_file) if wire else (None, None)
    for line in create(name, Path.cwd(), params, dvc, local_judge):
        click.echo(line)


# ---------------------------------------------------------------- export


@cli.group("export")
def export() -> None:
    """What a retriever or RAG system outside lfbench needs, and a model's answers to replay."""


def _write_lines(rows: Any, out: Path | None) -> None:
    import json as _json

    lines = (_json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if out is None:
        for line in lines:
            click.echo(line, nl=False)
        return
    from pipeline.core.io import atomic_write_text

    text = "".join(lines)
    atomic_write_text(out, text)
    click.echo(f"wrote {out}: {text.count(chr(10))} lines", err=True)


@export.command("queries")
@click.option("--benchmark", required=True)
@click.option("--retriever", default=None, help="the entry (CRUD-RAG: its settings' chunkings)")
@click.option("--texts", is_flag=True, help="the passages' texts too, not only their ids")
@click.option("--out", type=OutputFile(), default=None, help="JSONL file (default: stdout)")
@params_option
def export_queries(
    benchmark: str, retriever: str | None, texts: bool, out: Path | None, params_path: Path
) -> None:
    """What a retriever ranks (query and passage ids): make a TREC run file of them elsewhere
    and name it in a `run` retriever."""
    from pipeline.stages.export import data_dir, queries

    bench, params = _bench(benchmark, params_path)
    root = Path.cwd()
    ds = root / "datasets" / f"{benchmark}.jsonl"
    _write_lines(queries(bench, params, root, ds, data_dir(root, benchmark), retriever, texts), out)


@export.command("questions")
@click.option("--benchmark", required=True)
@click.option("--out", type=OutputFile(), default=None, help="JSONL file (default: stdout)")
@params_option
def export_questions(benchmark: str, out: Path | None, params_path: Path) -> None:
    """What a whole RAG system is asked (questions, task, documents): answer them elsewhere and
    name the answers in an `outputs` model."""
    from pipeline.stages.export import data_dir, questions

    bench, params = _bench(benchmark, params_path)
    root = Path.cwd()
    ds = root / "datasets" / f"{benchmark}.jsonl"
    _write_lines(questions(bench, params, root, ds, data_dir(root, benchmark)), out)


@export.command("outputs")
@click.option("--benchmark", required=True)
@click.option("--model", required=True)
@click.option("--out", type=OutputFile(), default=None, help="JSONL file (default: stdout)")
def export_outputs(benchmark: str, model: str, out: Path | None) -> None:
    """A model's generations as an `outputs` file (item_id, answer, passages)."""
    from pipeline.stages.export import outputs

    path = Path.cwd() / "generations" / benchmark / f"{model}.jsonl"
    if not path.exists():
        raise click.UsageError(f"{path}: no generations of {model} on {benchmark}")
    _write_lines(outputs(path), out)


# ---------------------------------------------------------------- undeclared `--key value`

# `lfbench compare` names runs by a benchmark's own group keys (`--domain news`, `--collection
# 25k`, `--task ...`), which only the benchmark's result model knows: they cannot be click
# options of their own.
SELECTORS = "lfbench.selectors"


class SelectorCommand(click.Command):
    """A command whose undeclared `--key value` / `--key=value` options are collected, in order,
    as (key, value) pairs in `ctx.meta[SELECTORS]` (`-` in a key read as `_`), before click parses
    the rest; `--` ends them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        known = {o for p in self.params for o in (*p.opts, *p.secondary_opts)}
        known |= set(self.get_help_option_names(ctx))
        rest: list[str] = []
        found: list[tuple[str, str]] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                rest += args[i:]
                break
            name, eq, value = arg.partition("=")
            if arg.startswith("--") and len(name) > 2 and name not in known:
                if not eq:
                    if i + 1 >= len(args) or args[i + 1].startswith("--"):
                        raise click.UsageError(f"{name} needs a value", ctx)
                    value = args[i + 1]
                    i += 1
                found.append((name[2:].replace("-", "_"), value))
            else:
                rest.append(arg)
            i += 1
        ctx.meta[SELECTORS] = found
        return super().parse_args(ctx, rest)


def per_side(flag: str, values: Sequence[str]) -> tuple[str | None, str | None]:
    """A selector's values for run A and run B: none, one for both, or two (A's, then B's)."""
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise click.UsageError(
        f"{flag}: give one value (both runs) or two (A's, then B's), not {len(values)}"
    )


# ---------------------------------------------------------------- sharing and comparing


@cli.group()
def team() -> None:
    """A team's shared services on one host: PostgreSQL, S3 (optional), the MLflow server."""


@team.command("up")
@click.option(
    "--dir", "folder", type=click.Path(path_type=Path), required=True, help="state and data"
)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to serve on")
@click.option("--pg-port", type=int, default=0, help="PostgreSQL's port (default: a free one)")
@click.option("--mlflow-port", type=int, default=0, help="MLflow's port (default: a free one)")
@click.option("--seaweedfs", is_flag=True, help="start an S3 store too (SeaweedFS)")
@click.option("--s3-endpoint", default=None, help="an existing S3 store (keys from AWS_* env)")
@click.option("--bucket", default="lfbench", show_default=True)
def team_up_command(
    folder: Path,
    host: str,
    pg_port: int,
    mlflow_port: int,
    seaweedfs: bool,
    s3_endpoint: str | None,
    bucket: str,
) -> None:
    """Start the team's tracking server and shared cache; write team.env and secrets.env."""
    from pipeline.tools.team import SECRETS_ENV, TEAM_ENV, team_up

    s = team_up(
        folder,
        host=host,
        pg_port=pg_port,
        mlflow_port=mlflow_port,
        seaweedfs=seaweedfs,
        s3_endpoint=s3_endpoint,
        bucket=bucket,
    )
    click.echo(f"MLflow tracking server: {s.tracking_uri}")
    click.echo(f"shared response cache:  {s.cache_url}")
    click.echo(f"DVC remote:             {s.dvc_remote}")
    click.echo(
        f"settings in {folder / TEAM_ENV}; passwords and keys in {folder / SECRETS_ENV}"
        " (mode 0600: hand it over privately). In each clone:"
    )
    click.echo(f"  set -a; . {folder / TEAM_ENV}; . {folder / SECRETS_ENV}; set +a")
    click.echo(f"  dvc remote add -d -f team-s3 {s.dvc_remote}")
    if s.s3_endpoint:
        click.echo(f"  dvc remote modify team-s3 endpointurl {s.s3_endpoint}")


@team.command("down")
@click.option("--dir", "folder", type=click.Path(path_type=Path), required=True)
def team_down_command(folder: Path) -> None:
    """Stop the services `lfbench team up` started in --dir (their data stays)."""
    from pipeline.tools.team import team_down

    team_down(folder)
    click.echo(f"stopped the team services of {folder}")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=int)
def ui(host: str, port: int) -> None:
    """Serve the MLflow UI on the project's store (mlruns/mlflow.db, or $MLFLOW_TRACKING_URI)."""
    from pipeline.stages.mlflow_store import check_reachable, masked
    from pipeline.stages.tracking import tracking_uri

    uri = tracking_uri(Path.cwd())
    if uri.startswith(("http://", "https://")):
        raise LfbenchError(
            f"MLFLOW_TRACKING_URI is a tracking server ({masked(uri)}): it serves its own UI;"
            " open it in a browser (`lfbench ui` serves a database store)"
        )
    check_reachable(uri)
    from pipeline.tools.ui import display_host, prepare_views

    # Not MLflow's GenAI home page: each benchmark's current runs, its main metrics as columns
    # (a shared view MLflow reads from an experiment tag), and its charts, main metric first.
    base = f"http://{display_host(host)}:{port}"
    views = prepare_views(uri, base)
    # The store URI (and any password in it) reaches mlflow by its environment, never its
    # command line, which every user of the machine can read (`ps`).
    os.environ["MLFLOW_BACKEND_STORE_URI"] = uri
    argv = [sys.executable, "-m", "mlflow", "ui"]
    argv += ["--host", host, "--port", str(port), "--workers", "1"]
    if views:
        click.echo("Open the runs of each benchmark (current results, main metrics as columns):")
        for v in views:
            click.echo(f"  {v.experiment}: {v.runs_url}")
        click.echo("  (charts of the main metrics: the same link with &compareRunsMode=CHART)")
    else:
        click.echo(f"No lfbench results in this store yet (dvc repro logs them): {base}")
    log.info("MLflow UI on %s (store %s); Ctrl-C stops it", base, masked(uri))
    # No usage reports leave the machine (MLflow's own switches).
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    sys.stdout.flush()  # the links, before this process becomes mlflow's (a pipe buffers them)
    sys.stderr.flush()
    os.execv(sys.executable, argv)


@cli.command(cls=SelectorCommand)
@click.argument("run_a")
@click.argument("run_b")
@click.option(
    "--benchmark",
    default=None,
    help="Name systems instead of run ids: A and B are model entries, systems or run names of"
    " this benchmark (their current MLflow runs).",
)
@click.option(
    "--setting",
    multiple=True,
    help="With --benchmark: the setting of both runs, or given twice, A's then B's.",
)
@click.option(
    "--judge", "judge_name", multiple=True, help="With --benchmark: the judge (once or twice)."
)
@click.option(
    "--resamples",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1000),
    help="Bootstrap resamples (at least 1000: a p-value moves in steps of 2/resamples).",
)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--min-items",
    default=10,
    show_default=True,
    type=click.IntRange(min=2),
    help="Fewer shared items than this: no interval, nothing marked significant.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.pass_context
def compare(
    ctx: click.Context,
    run_a: str,
    run_b: str,
    benchmark: str | None,
    setting: tuple[str, ...],
    judge_name: tuple[str, ...],
    resamples: int,
    seed: int,
    min_items: int,
    as_json: bool,
) -> None:
    """Compare two MLflow runs of one benchmark (ids, or systems by name with --benchmark):
    differing params and lineage, each metric of both systems on the items both scored with its
    delta (B - A), a 95% interval and p-value from a paired bootstrap (at least 10 shared
    items, or nothing is tested), and the whole runs' other metrics.

    With --benchmark, the benchmark's group keys narrow the runs as options of their own (SummHay:
    --domain, --collection, --mode; CRUX: --domain; CRUD-RAG: --task): like --setting and
    --judge, once for both runs or twice, A's then B's."""
    import json as _json

    from pipeline.tools.compare import compare_runs, find_run, render_text

    root = Path.cwd()
    chosen: dict[str, list[str]] = {}
    for key, value in ctx.meta.get(SELECTORS, []):
        chosen.setdefault(key, []).append(value)
    if benchmark is None:
        given = [f"--{k}" for k in chosen] + ["--setting"] * bool(setting)
        given += ["--judge"] * bool(judge_name)
        if given:
            raise click.UsageError(f"{', '.join(given)} name runs with --benchmark only")
    else:
        sides = {k: per_side(f"--{k}", v) for k, v in chosen.items()}
        sa, sb = per_side("--setting", setting)
        ja, jb = per_side("--judge", judge_name)
        keys = [{k: str(v[n]) for k, v in sides.items()} for n in (0, 1)]
        run_a = find_run(root, benchmark, run_a, sa, ja, keys[0])
        run_b = find_run(root, benchmark, run_b, sb, jb, keys[1])
    res = compare_runs(root, run_a, run_b, resamples=resamples, seed=seed, min_items=min_items)
    if as_json:
        click.echo(_json.dumps(res, indent=2, sort_keys=True))
    else:
        click.echo(render_text(res), nl=False)


@cli.command()
@click.option(
    "--out",
    type=OutputDir(),
    default=Path("reports"),
    show_default=True,
    help="Folder for report.html and report.md.",
)
@params_option
def report(out: Path, params_path: Path) -> None:
    """One self-contained HTML (and markdown) report of the results in metrics/*.json."""
    from pipeline.tools.report import build_report

    html_path, md_path = build_report(Path.cwd(), out, params_path)
    click.echo(f"wrote {html_path} and {md_path}")


@cli.group("audit")
def audit() -> None:
    """People audit a judge on a run's own outputs (README: "Auditing the judge")."""


@audit.command("sample")
@click.option("--benchmark", required=True, help="The benchmark (its MLflow experiment).")
@click.option("--run", "run_id", default=None, help="The run's id (from the UI).")
@click.option("--model", default=None, help="Or: the model entry or system of the current run.")
@click.option("--setting", default=None, help="With --model: its setting.")
@click.option("--judge", "judge_name", default=None, help="With --model: the judge.")
@click.option("-n", "n", type=click.IntRange(min=2), default=50, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--name", default=None, help="The sample's name (default: from the run's).")
@click.option("--no-traces", is_flag=True, help="Only the CSV and the sample file.")
@params_option
def audit_sample(
    benchmark: str,
    run_id: str | None,
    model: str | None,
    setting: str | None,
    judge_name: str | None,
    n: int,
    seed: int,
    name: str | None,
    no_traces: bool,
    params_path: Path,
) -> None:
    """Draw n of a run's verdicts for a person to label: MLflow traces linked to the run and
    audits/<sample>.csv; the sample is audits/<sample>.json."""
    from pipeline.core import registry
    from pipeline.tools.audit import make_sample
    from pipeline.tools.compare import find_run

    root = Path.cwd()
    bench = registry.get(benchmark)
    params = load_params(params_path, [benchmark])
    if run_id is None:
        if model is None:
            raise click.UsageError("give --run RUN_ID, or --model (with --setting, --judge)")
        run_id = find_run(root, benchmark, model, setting, judge_name)
    sample, path = make_sample(root, params, bench, run_id, n, seed, name, traces=not no_traces)
    traced = sum(1 for u in sample.units if u.trace_id)
    click.echo(
        f"sample {sample.sample}: {len(sample.units)} of the {sample.n_units} verdicts of"
        f" judge {sample.judge} on run {sample.run_name!r} ({sample.run_id})\n"
        f"  {path}\n  {path.with_suffix('.csv')}  (fill in the label column)\n"
        f"  {traced} MLflow traces on the run: add a feedback assessment named"
        f" {sample.scale.name!r} ({' | '.join(sample.scale.labels)}) to each\n"
        f"then: lfbench audit score --sample {sample.sample}"
    )


@audit.command("score")
@click.option("--sample", "samples", multiple=True, help="A sample's name (repeatable).")
@click.option(
    "--labels",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A filled-in CSV of the sample (its labels win over the UI's).",
)
@click.option(
    "--released",
    "released",
    default=None,
    metavar="BENCHMARK",
    help="Score the labels people already made on BENCHMARK's released outputs.",
)
@click.option("--min-labels", type=click.IntRange(min=2), default=30, show_default=True)
@click.option("--resamples", type=click.IntRange(min=0), default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@params_option
def audit_score(
    samples: tuple[str, ...],
    labels: Path | None,
    released: str | None,
    min_labels: int,
    resamples: int,
    seed: int,
    as_json: bool,
    params_path: Path,
) -> None:
    """Kappa of the judge against the person and the prediction-powered score, per run,
    logged on the run (audit.*) and written to audits/<sample>.score.json."""
    from pipeline.tools.audit import load_sample, render, score_released, score_sample

    root = Path.cwd()
    if not samples and released is None:
        raise click.UsageError("give --sample NAME (or --released BENCHMARK)")
    if labels is not None and len(samples) != 1:
        raise click.UsageError("--labels goes with exactly one --sample")
    results = []
    for name in samples:
        params = load_params(params_path, [load_sample(root, name).benchmark])
        results.append(score_sample(root, params, name, labels, n_resamples=resamples, seed=seed))
    if released is not None:
        params = load_params(params_path, [released])
        results += score_released(
            root, params, released, min_labels=min_labels, n_resamples=resamples, seed=seed
        )
    if as_json:
        click.echo(json.dumps(results, indent=2, sort_keys=True))
    else:
        click.echo(render(results), nl=False)


@cli.command("score")
@click.option("--benchmark", required=True, help="Whose reference metrics (e.g. crud_rag).")
@click.option(
    "--input",
    "src",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    required=True,
    help='JSONL lines {"id", "generation", "reference"}.',
)
@click.option("--out", type=OutputFile(), required=True, help="JSONL written back.")
def score(benchmark: str, src: Path, out: Path) -> None:
    """A benchmark's reference metrics on your own outputs, without the pipeline.

    Each line comes back with "metrics" or, where it cannot be scored, "error"; when any line
    has an error the output is written and the command exits with status 3."""
    from pipeline.core import registry
    from pipeline.stages.score import score_file

    scored, errors, first = score_file(registry.get(benchmark), src, out)
    click.echo(f"wrote {out}: {scored} scored, {errors} with an error")
    if errors:
        raise StageFailed(
            f"{errors} of {scored + errors} lines could not be scored (first: {first}); {out} is"
            ' written, each of them with its "error"'
        )


@cli.group("bench")
def bench() -> None:
    """Micro-benchmarks of the pipeline's machinery."""


@bench.command("llm")
@click.option(
    "--requests",
    "n_requests",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Distinct chat requests to send.",
)
@click.option("--concurrency", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--latency-ms",
    type=click.FloatRange(min=0),
    default=100.0,
    show_default=True,
    help="The test server's latency per request.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_llm(n_requests: int, concurrency: int, latency_ms: float, as_json: bool) -> None:
    """Throughput of the LLM client against the local test server (ideal = C / latency)."""
    from pipeline.tools.llm_bench import render, run_llm_bench

    out = run_llm_bench(n_requests, concurrency, latency_ms)
    click.echo(json.dumps(out) if as_json else "\n".join(render(out)))


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except StageFailed as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(3)
    except Interrupted as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(130)
    except LfbenchError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
