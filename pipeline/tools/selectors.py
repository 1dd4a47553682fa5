"""`--KEY VALUE` options a command does not declare, kept for it: `lfbench compare` names runs
by a benchmark's own group keys (`--domain news`, `--collection 25k`, `--task ...`), which only
the benchmark's result model knows, so they cannot be click options of their own."""

from __future__ import annotations

from collections.abc import Sequence

import click

META = "lfbench.selectors"


class SelectorCommand(click.Command):
    """A command whose undeclared `--key value` / `--key=value` options are collected, in order,
    as (key, value) pairs in `ctx.meta[META]` (`-` in a key read as `_`), before click parses
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
        ctx.meta[META] = found
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
