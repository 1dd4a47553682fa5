"""The command line's shared options: `--params`, output files and folders checked before any
work, a number of seconds. Every room's commands (`pipeline/*/commands.py`) take them."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


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
