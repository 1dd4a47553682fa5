"""Running the stages from the command line: `lfbench repro` (`dvc repro` with independent
stages side by side, on this machine or a Dask cluster), `lfbench worker` (a cluster's worker)
and `lfbench prune`; `lfbench plan` (what a repro would send, or DVC's dry run); `lfbench
status` (what a running or the last `lfbench repro` has done, is running and has left)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from pipeline.core.options import Seconds, params_option
from pipeline.core.params import load_params


@click.command()
@click.argument("targets", nargs=-1)
@params_option
@click.option(
    "--seconds-per-request",
    type=Seconds(),
    default=None,
    help="Assumed time of one request, for the time of stages without a rate limit or a"
    " measured rate (requests run max_concurrency at a time).",
)
@click.option(
    "--rate",
    "rates",
    multiple=True,
    metavar="NAME=SECONDS",
    help="Seconds one request of a models (or judges) entry takes, for its stages' time (its"
    " requests run max_concurrency at a time); repeat per entry. A measured rate (an earlier or"
    " stopped run's) wins.",
)
@click.option(
    "--probe",
    is_flag=True,
    help="Measure each model and judge entry without a rate: send its first stage's first 3"
    " requests for real, through the response cache (the run then reuses them), and plan with"
    " the time they took.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="The `lfbench repro --jobs` to give the wall time of: the stages' schedule simulated.",
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
    rates: tuple[str, ...],
    probe: bool,
    jobs: int,
    as_json: bool,
    dry: bool,
) -> None:
    """What `dvc repro [TARGETS]` would send, sending nothing (but `--probe`'s few requests):
    per stage DVC reports changed, model and judge, the requests (less the response cache's
    hits), prompt and completion tokens, dollars and time; then the wall time of the whole run
    at `--jobs`, and when each model's stages are done."""
    from pipeline.core.config import load_yaml
    from pipeline.runner.clock import plan_clock, render_clock
    from pipeline.stages import plan as planning

    if dry:
        planning.dvc_dry_run(Path.cwd(), targets)
        return
    params = load_params(params_path)
    given = _rates(rates, params)
    result = planning.plan_project(Path.cwd(), params, targets, seconds_per_request, given)
    probed: dict[str, tuple[float, int]] = {}
    if probe:
        probed = planning.probe(Path.cwd(), result, given)
        if probed:  # planned again: the probe's answers are cache hits now
            given |= {entry: spr for entry, (spr, _) in probed.items()}
            result = planning.plan_project(Path.cwd(), params, targets, seconds_per_request, given)
    clock = plan_clock(Path.cwd(), result, targets, jobs, load_yaml(params_path))
    per_stage = {r.stage: 0 for r in result.rows}
    for r in result.rows:
        per_stage[r.stage] += 1
    for r in result.rows:  # a CPU stage's time in its row (it sends nothing: "0 s" before)
        if not r.requests and per_stage[r.stage] == 1 and r.stage in clock.stages:
            r.time_s, r.time_basis = clock.stages[r.stage]
    if as_json:
        doc = result.to_json() | {"clock": clock.to_json()}
        doc["probe"] = {e: {"s_per_request": s, "sent": n} for e, (s, n) in probed.items()}
        click.echo(json.dumps(doc, indent=2, allow_nan=False))
    else:
        for entry, (spr, n) in probed.items():
            click.echo(f"probe: {entry}: {n} requests sent (cached), {spr:.2f} s per request")
        click.echo(planning.render(result), nl=False)
        click.echo(render_clock(clock), nl=False)


def _rates(given: tuple[str, ...], params: Any) -> dict[str, float]:
    """--rate NAME=SECONDS, each NAME a models, judges or retrievers entry."""
    out = {}
    for text in given:
        name, eq, value = text.partition("=")
        try:
            secs = float(value) if eq else -1.0
        except ValueError:
            secs = -1.0
        if secs <= 0 or secs != secs:
            raise click.BadParameter(
                f"{text!r}: use NAME=SECONDS, e.g. qwen-7b=2.5", param_hint="--rate"
            )
        if name not in {**params.models, **params.judges, **params.retrievers}:
            raise click.BadParameter(
                f"{name!r} is no models, judges or retrievers entry", param_hint="--rate"
            )
        out[name] = secs
    return out


@click.command()
@click.argument("targets", nargs=-1)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Stages that wait on endpoints at once; stages that use the CPU run beside them, as"
    " many as the cores take.",
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
    from pipeline.runner.cluster import DRIVER_CONNECT_S
    from pipeline.runner.driver import failed_log_tail, run_repro, summary
    from pipeline.runner.view import LiveView

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


@click.command()
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
    from pipeline.runner.cluster import WORKER_CONNECT_S, serve

    serve(scheduler, clone, jobs, name, connect_timeout or WORKER_CONNECT_S)


@click.command()
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
    from pipeline.runner.prune import prune_workspace

    gone = prune_workspace(Path.cwd(), force=force)
    click.echo(f"pruned {len(gone)} stage(s)" + (f": {', '.join(gone)}" if gone else ""))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the driver's state as JSON.")
def status(as_json: bool) -> None:
    """What the running (or the last) `lfbench repro` of this project has done, is running and
    has left, from the state its driver publishes (.lfbench/repro-state.json). Takes no lock
    and reads no DVC file: it answers while the run holds DVC's lock."""
    from pipeline.core.live import alive, read_state
    from pipeline.runner.status import status_lines

    state = read_state(Path.cwd())
    if state is None:
        click.echo("no `lfbench repro` has run in this project (no .lfbench/repro-state.json)")
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({**state, "alive": alive(state.get("pid"))}, indent=2))
        return
    click.echo("\n".join(status_lines(state, alive(state.get("pid")))))
