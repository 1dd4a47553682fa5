"""The `lfbench` command: the table of contents. Each command lives in its room and is loaded
when called (`COMMANDS`); `lfbench run` and `lfbench stage` (what every dvc.yaml stage runs)
are here and in pipeline/stages/commands.py.

    lfbench run <stage> [ARGS]             run a pipeline stage in the chosen runtime (dvc.yaml)
    lfbench stage <stage> [ARGS]           run a stage in this process (what `run` calls)
    lfbench agreement                      judges against people, in this process
    lfbench data fetch [--mirror DIR]      fill data/ from pinned sources, verified
    lfbench image recipe|build|verify|push|pull
                                           the stages' image: its recipe (build/image.json),
                                           reproducible build, check by rebuilding, and its
                                           travels (a registry, the DVC remote)
    lfbench team up|down                   a team's shared services on one host
    lfbench check                          validate params.yaml whole (every benchmark section)
    lfbench plan [TARGETS] [--json]        what `dvc repro` would send: requests, tokens, $, time
    lfbench repro [-j N] [--cluster A]     dvc repro with independent stages side by side
    lfbench status [--json]                what a running repro has done, runs and has left
    lfbench prune                          drop what removed stages left in dvc.lock and outputs
    lfbench worker SCHEDULER [--clone DIR] a Dask worker for `lfbench repro --cluster`
    lfbench track <benchmark>              (re)log MLflow runs from the pipeline's outputs
    lfbench ui [--host H] [--port P]       the MLflow UI on the project's store
    lfbench compare RUN_A RUN_B [--json]   what differs between two runs, with significance
    lfbench report [--out DIR]             one HTML + markdown report of the current results
    lfbench audit sample|score             people audit a judge on a run's own outputs: a
                                           sample of its verdicts to label (MLflow traces, CSV),
                                           then kappa and a corrected score logged on the run
    lfbench score | export                 a benchmark's metrics on your outputs; what a system
                                           outside lfbench needs
    lfbench new-benchmark NAME             a new benchmark package from the template
    lfbench bench llm                      the model client's throughput

Every error about bad input is printed as one line naming the file, item and field, and the
command exits with status 2; a stage whose items partly failed exits with status 3 (so does
`lfbench score` when a line could not be scored, its output written); a stage stopped by Ctrl-C
exits with status 130 once the requests in flight are in its journal. Output files
are checked as the command line is read, before any work. `lfbench <command> --help` works for
every command and group (`lfbench run --help`, and `lfbench run <stage> --help` for a stage's).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path

import click

from pipeline import __version__
from pipeline.core.errors import Interrupted, LfbenchError, StageFailed
from pipeline.core.options import params_option
from pipeline.stages.commands import STAGES, agreement_command, stage

ENV_VERBOSE = "LFBENCH_VERBOSE"  # 1: `--verbose` for every lfbench process (dvc repro's stages)
# The loggers whose INFO lines a user reads: each stage's steps, progress and results.
OWN_LOGGERS = ("lfbench", "pipeline")

# Each command of a room, loaded when it is called (or listed by --help): `lfbench run` (every
# stage's process) imports none of them.
COMMANDS = {
    "data": "pipeline.env.commands:data_group",
    "image": "pipeline.env.commands:image_group",
    "team": "pipeline.env.commands:team_group",
    "check": "pipeline.env.commands:check",
    "plan": "pipeline.runner.commands:plan",
    "repro": "pipeline.runner.commands:repro",
    "worker": "pipeline.runner.commands:worker",
    "prune": "pipeline.runner.commands:prune",
    "status": "pipeline.runner.commands:status",
    "compare": "pipeline.results.commands:compare",
    "report": "pipeline.results.commands:report",
    "audit": "pipeline.results.commands:audit",
    "ui": "pipeline.results.commands:ui",
    "track": "pipeline.results.commands:track",
    "score": "pipeline.results.commands:score",
    "export": "pipeline.results.commands:export",
    "new-benchmark": "pipeline.authoring.commands:new_benchmark",
    "bench": "pipeline.authoring.commands:bench",
}


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


class _Rooms(click.Group):
    """The commands of `COMMANDS` loaded from their rooms when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Rooms)
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


cli.add_command(stage)
cli.add_command(agreement_command)

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
    if any(a in HELP for a in args):
        stage.main(args=[stage_name, "--help"], prog_name="lfbench run", standalone_mode=False)
        return
    from pipeline.env.runtime import run_stage

    def here(argv: list[str]) -> None:
        stage.main(args=argv, prog_name="lfbench stage", standalone_mode=False)

    code = run_stage(stage_name, args, params_path, here)
    if code != 0:
        sys.exit(code)


def main() -> None:
    if sys.argv[1:2] in (["run"], ["stage"]):
        from pipeline.stages import warm_sync

        warm_sync.enable()  # a stage's process: its MLflow sync may go to the warm server
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
