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
        for name, sub in sorted(cmd.commands.items()):
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
