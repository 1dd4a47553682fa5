"""Authoring from the command line: `lfbench new-benchmark` (a benchmark package from the
template) and `lfbench bench llm` (the model client's throughput against the test server)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.core.options import params_option


@click.command("new-benchmark")
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
    from pipeline.authoring.scaffold import create

    params, dvc = (params_path, dvc_file) if wire else (None, None)
    for line in create(name, Path.cwd(), params, dvc, local_judge):
        click.echo(line)


@click.group("bench")
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
    from pipeline.authoring.llm_bench import render, run_llm_bench

    out = run_llm_bench(n_requests, concurrency, latency_ms)
    click.echo(json.dumps(out) if as_json else "\n".join(render(out)))
