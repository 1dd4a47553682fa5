"""Looking at results from the command line: `lfbench compare` (two runs, with significance),
`lfbench report`, `lfbench audit sample|score` (people audit a judge), `lfbench ui` (the MLflow
UI), `lfbench track` (MLflow runs re-logged from the outputs), `lfbench score` (a benchmark's
metrics on your own outputs) and `lfbench export` (what a system outside lfbench needs)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from pipeline.core.errors import LfbenchError, StageFailed
from pipeline.core.options import OutputDir, OutputFile, params_option
from pipeline.core.params import load_params

log = logging.getLogger("lfbench")


def _bench(name: str, params_path: Path) -> tuple[Any, Any]:
    """The benchmark and the params, validated for it (the core and its own section)."""
    from pipeline.core import registry

    return registry.get(name), load_params(params_path, [name])


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


@click.command(cls=SelectorCommand)
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

    from pipeline.results.compare import compare_named, render_text
    from pipeline.stages import warm_sync

    # The store is read where MLflow is imported already (about 3 CPU-seconds less): by a child
    # of the warm sync server when one runs for this code, as a stage's sync is; else here.
    warm_sync.enable()
    root = Path.cwd()
    chosen: dict[str, list[str]] = {}
    for key, value in ctx.meta.get(SELECTORS, []):
        chosen.setdefault(key, []).append(value)
    if benchmark is None:
        given = [f"--{k}" for k in chosen] + ["--setting"] * bool(setting)
        given += ["--judge"] * bool(judge_name)
        if given:
            raise click.UsageError(f"{', '.join(given)} name runs with --benchmark only")
        named = None
    else:
        sides = {k: per_side(f"--{k}", v) for k, v in chosen.items()}
        sa, sb = per_side("--setting", setting)
        ja, jb = per_side("--judge", judge_name)
        keys = [{k: str(v[n]) for k, v in sides.items()} for n in (0, 1)]
        named = ((run_a, sa, ja, keys[0]), (run_b, sb, jb, keys[1]))
    # one child for both lookups and the comparison
    res = warm_sync.call(
        compare_named, root, benchmark, run_a, run_b, named, resamples, seed, min_items
    )
    if as_json:
        click.echo(_json.dumps(res, indent=2, sort_keys=True))
    else:
        click.echo(render_text(res), nl=False)


@click.command()
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
    from pipeline.results.report import build_report

    html_path, md_path = build_report(Path.cwd(), out, params_path)
    click.echo(f"wrote {html_path} and {md_path}")


@click.group("audit")
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
    from pipeline.results.audit import make_sample
    from pipeline.results.compare import find_run

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
    from pipeline.results.audit import load_sample, render, score_released, score_sample

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


@click.command()
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
    from pipeline.results.ui import display_host, prepare_views

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
    # MLflow's telemetry and job runner are off by pipeline/__init__.py's defaults, which this
    # process (and so the server it becomes) has set.
    sys.stdout.flush()  # the links, before this process becomes mlflow's (a pipe buffers them)
    sys.stderr.flush()
    os.execv(sys.executable, argv)


@click.command()
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


@click.command("score")
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


@click.group("export")
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
