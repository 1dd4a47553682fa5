"""The CLI's help is reachable from every group and command (issue 26, point 11)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pipeline.cli import STAGES, cli


def _paths(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):  # the rooms' commands, loaded as a user calls them
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            out += _paths(sub, (*path, name))
    return out


PATHS = _paths(cli)


def test_the_walk_covers_the_tree() -> None:
    assert {("run",), ("stage", "judge"), ("image", "build"), ("team", "up")} <= set(PATHS)
    assert len(PATHS) > 25


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "lfbench")
def test_every_command_and_group_shows_its_help(
    path: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here: help must not need one
    done = CliRunner().invoke(cli, [*path, "--help"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert done.output.startswith("Usage: ") and f"{' '.join(('cli', *path))} " in done.output
    assert list(tmp_path.iterdir()) == []  # nothing written (no stage record, no .lfbench)


@pytest.mark.parametrize("args", [["run", "-h"], ["run", "--params", "p.yaml", "--help"]])
def test_run_help_before_the_stage_name(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert done.exit_code == 0 and "lfbench run STAGE --help" in done.output, done.output


@pytest.mark.parametrize("name", STAGES)
def test_run_stage_help_is_the_stages_help(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(cli, ["run", name, "--help"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"Usage: lfbench run {name} [OPTIONS]")
    assert "--params" in done.output and list(tmp_path.iterdir()) == []


def _outputs() -> list[tuple[tuple[str, ...], str]]:
    from pipeline.core.options import OutputFile

    found = []
    for path in PATHS:
        cmd: click.Command = cli
        for name in path:
            assert isinstance(cmd, click.Group)
            sub = cmd.get_command(click.Context(cmd), name)
            assert sub is not None, name
            cmd = sub
        found += [
            (path, p.opts[0])
            for p in cmd.params
            if isinstance(p, click.Option) and isinstance(p.type, OutputFile)
        ]
    return found


OUTPUTS = _outputs()


def test_every_output_file_option_is_checked() -> None:
    assert {(("score",), "--out"), (("stage", "judge"), "--out")} <= set(OUTPUTS)
    assert len(OUTPUTS) >= 12


@pytest.mark.parametrize(
    ("path", "flag"), OUTPUTS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x
)
def test_an_output_that_is_a_folder_or_under_a_file_is_refused_before_any_work(
    path: tuple[str, ...], flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26, point 8, for every command: the output path is checked as the command line is
    read (a usage error naming the option), before params.yaml is even read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("", encoding="utf-8")
    for bad, reason in (("folder", "is a directory"), ("file/out.json", "is a file, not a folder")):
        done = CliRunner().invoke(cli, [*path, flag, bad], catch_exceptions=False)
        assert done.exit_code == 2, done.output
        assert f"Invalid value for '{flag}'" in done.output and reason in done.output
    # (`lfbench stage` notes where the process runs in .lfbench/ before parsing the stage's
    # options: the runner's note, not an output)
    left = {p.name for p in tmp_path.iterdir()} - ({".lfbench"} if path[0] == "stage" else set())
    assert left == {"file", "folder"}
