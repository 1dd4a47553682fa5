"""The environment's command line: `lfbench data fetch`, `lfbench image ...` (the stages' image:
its recipe, build, check and travels), `lfbench team up|down` (a team's shared services) and
`lfbench check` (params.yaml whole, and each stage's code dependencies)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from pipeline.core.errors import LfbenchError
from pipeline.core.options import OutputFile, params_option
from pipeline.core.params import load_params
from pipeline.env import containers, image, image_store

log = logging.getLogger("lfbench")


@click.group("data")
def data_group() -> None:
    """Raw inputs: fetch and verify data/."""


@data_group.command("fetch")
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


@click.group("image")
def image_group() -> None:
    """The container image every stage runs in: its recipe, build and travels."""


@image_group.command("recipe")
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

    params = load_params(params_path, [])
    rec = image.recipe(Path.cwd(), params.image_base)
    write_json(out, rec)
    log.info("image: recipe %s on %s (%s)", rec["tag"], rec["base_image"], out)


def _engine_and_recipe(params_path: Path = Path("params.yaml")) -> tuple[Any, dict[str, Any]]:
    """The engine, and the image recipe of this workspace: computed from its files and params
    as the `image` stage computes it (a fresh clone has no build/image.json before `dvc repro
    image`; a stale one names another recipe, and says so)."""

    client = containers.docker_client()
    if client is None:
        raise LfbenchError("no Docker engine answers (check DOCKER_HOST or start dockerd)")
    root = Path.cwd()
    rec = image.recipe(root, load_params(params_path, []).image_base)
    try:
        written = image.read_recipe(root)
    except LfbenchError:
        written = None  # not made yet (a fresh clone), or unreadable: the computed one serves
    if written is not None and written.get("recipe") != rec["recipe"]:
        log.warning(
            "%s names recipe %s, but this workspace's files make %s: using the latter (`dvc"
            " repro image` updates the file)",
            image.IMAGE_JSON,
            str(written.get("tag")),
            rec["tag"],
        )
    return client, rec


@image_group.command("build")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
def image_build(no_cache: bool) -> None:
    """Build the image of build/image.json's recipe (present already: nothing to do).

    Built with buildah (reproducible), its id is recorded in build/image.refs.json (commit it):
    `lfbench image verify` rebuilds and compares."""

    client, rec = _engine_and_recipe()
    root = Path.cwd()
    found = None if no_cache else image.find_image(client, rec)
    if found is None:
        found = image.build_image(root, rec, client=client, nocache=no_cache)
        if image.image_builder() == "buildah" and image.record_build(
            root, rec, found, client=client
        ):
            click.echo(f"recorded in {image.REFS_JSON}: commit it")
    click.echo(f"{rec['tag']} {found}")


@image_group.command("verify")
def image_verify() -> None:
    """Rebuild the recipe's image from scratch (buildah) and check that it has the id
    build/image.refs.json records and the id of the image here (pulled or built)."""

    client, rec = _engine_and_recipe()
    checked = image_store.verify(Path.cwd(), rec, client=client)
    click.echo(
        f"{rec['tag']} {checked['rebuilt']}: the rebuild matches "
        + ", ".join(k for k in checked if k not in ("rebuilt", "base_id"))
    )


@image_group.command("push")
@click.option("--registry", default=None, help="HOST:PORT/REPO of an OCI registry.")
@click.option("--dvc", "to_dvc", is_flag=True, help="Save the image into the DVC remote.")
@click.option("--remote", default=None, help="The DVC remote (default: the project's).")
def image_push(registry: str | None, to_dvc: bool, remote: str | None) -> None:
    """Send the recipe's image to a registry (pinned by digest in build/image.refs.json, which
    you commit) and/or to the DVC remote (an archive keyed by the recipe digest)."""

    if not registry and not to_dvc:
        raise click.UsageError("say where: --registry HOST:PORT/REPO and/or --dvc")
    client, rec = _engine_and_recipe()
    root = Path.cwd()
    if registry:
        ref = image_store.push_registry(root, rec, registry, client=client)
        click.echo(f"registry: {ref} (recorded in {image.REFS_JSON}: commit it)")
    if to_dvc:
        click.echo(f"dvc: {image_store.push_dvc(root, rec, client=client, remote=remote)}")


@image_group.command("pull")
def image_pull() -> None:
    """Fetch the recipe's image: from the registry its digest names, else the DVC remote."""

    client, rec = _engine_and_recipe()
    found = image.find_image(client, rec)
    got = (found, "present") if found else image_store.pull(Path.cwd(), rec, client=client)
    if got is None:
        raise LfbenchError(
            f"no store has the image of recipe {rec['tag']}: `lfbench image build`, "
            "then `lfbench image push`"
        )
    click.echo(f"{rec['tag']} {got[0]} ({got[1]})")


@click.group("team")
def team_group() -> None:
    """A team's shared services on one host: PostgreSQL, S3 (optional), the MLflow server."""


@team_group.command("up")
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
    from pipeline.env.team import SECRETS_ENV, TEAM_ENV, team_up

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


@team_group.command("down")
@click.option("--dir", "folder", type=click.Path(path_type=Path), required=True)
def team_down_command(folder: Path) -> None:
    """Stop the services `lfbench team up` started in --dir (their data stays)."""
    from pipeline.env.team import team_down

    team_down(folder)
    click.echo(f"stopped the team services of {folder}")


@click.command()
@params_option
@click.option(
    "--dvc-file", type=click.Path(path_type=Path), default=Path("dvc.yaml"), show_default=True
)
@click.option(
    "--fix",
    is_flag=True,
    help="Write into dvc.yaml the judges entries each agreement and construct stage reads"
    " (after a judge is added to or taken from a benchmark's judges), then check.",
)
def check(params_path: Path, dvc_file: Path, fix: bool) -> None:
    """Validate params.yaml whole (the core and every benchmark section, each by its package),
    and check that each stage of dvc.yaml depends on all the code it runs and lists the
    params.yaml entries it reads."""
    from pipeline.core import registry
    from pipeline.core.config import OpenAIJudge
    from pipeline.env import deps
    from pipeline.stages.common import applies

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
    from pipeline.stages.entries import relist, unlisted

    if fix:
        for change in relist(params, dvc_file):
            click.echo(f"{dvc_file}: {change}")
    missing = unlisted(params, dvc_file)
    if missing:
        raise LfbenchError(
            f"{dvc_file}: a stage reads a params.yaml entry its params do not list (add it to"
            f" the stage's params, so a change to it re-runs the stage, or run `lfbench check"
            f" --fix`): {'; '.join(missing)}"
        )
    click.echo(f"{dvc_file}: every stage depends on the code it runs and the entries it reads")
