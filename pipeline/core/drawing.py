"""A run's plot, drawn only when it is logged.

A result row's MLflow run carries PNG plots (`RunRow.plots`) and their digest, the run's
`lfbench.plots_sha`, which the sync compares to decide whether an unchanged run's plots must be
logged again (another row of a plot across rows changed). Drawing every plot to compute that
digest cost the aggregate stage most of its time when nothing had changed (a second per plot,
hundreds of plots). A `Plot` is the call that draws a PNG, `draw(*args)`, and its `key` digests
what the PNG is a function of: the drawing function's name, its module's source and the shared
plot style's (`pipeline/plots.py`), matplotlib's version and the arguments. So the digest is
known without drawing, and the PNG is drawn only for a run the sync creates or refreshes
(`draw_all` draws those at once, on every core; `png()` then reads what it drew).

A plot's arguments are JSON-like (rows of a metrics file, titles): they are hashed as canonical
JSON. A drawing function must be a pure function of them (the project's are: fixed size, DPI and
metadata, sorted inputs).
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core.io import canonical_json
from pipeline.core.parallel import fork_map

# the house style every plot is drawn with (pipeline/plots.py): part of every key
_STYLE = Path(__file__).resolve().parents[1] / "plots.py"
_DRAWN: dict[str, bytes] = {}  # key -> PNG, this process's


@cache
def _source_sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@cache
def _matplotlib() -> str:
    try:
        return metadata.version("matplotlib")
    except metadata.PackageNotFoundError:  # pragma: no cover - a dependency of the project
        return "none"


@dataclass(frozen=True, eq=False)
class Plot:
    """A PNG drawn by `draw(*args)` when it is needed; `key` says what it is without drawing."""

    draw: Callable[..., bytes]
    args: tuple[Any, ...]

    @cached_property
    def key(self) -> str:
        module = sys.modules.get(self.draw.__module__)
        source = inspect.getsourcefile(module) if module is not None else None
        blob = canonical_json(
            {
                "fn": f"{self.draw.__module__}.{self.draw.__qualname__}",
                "code": _source_sha(source) if source else "",
                "style": _source_sha(str(_STYLE)),
                "matplotlib": _matplotlib(),
                "args": self.args,
            }
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def png(self) -> bytes:
        if self.key not in _DRAWN:
            _DRAWN[self.key] = self.draw(*self.args)
        return _DRAWN[self.key]


def digest(payload: bytes | Plot) -> str:
    """A plot file's digest: its key, or the SHA-256 of PNG bytes drawn beforehand."""
    return payload.key if isinstance(payload, Plot) else hashlib.sha256(payload).hexdigest()


def drawn(plots: Mapping[str, bytes | Plot]) -> dict[str, bytes]:
    """The files as bytes (a `Plot` drawn now, or read from what `draw_all` drew)."""
    return {n: p.png() if isinstance(p, Plot) else p for n, p in plots.items()}


def draw_all(plots: Iterable[bytes | Plot]) -> int:
    """Draw the plots not yet drawn, each once, on every core (forked); returns how many."""
    todo = {p.key: p for p in plots if isinstance(p, Plot) and p.key not in _DRAWN}
    jobs = list(todo.values())
    if not jobs:
        return 0
    # The first one here: what drawing imports (matplotlib, about half a CPU-second) is then
    # imported once, and the forked processes inherit it instead of each importing it again.
    jobs[0].png()
    rest = jobs[1:]
    for plot, png in zip(rest, fork_map(lambda p: p.draw(*p.args), rest), strict=True):
        _DRAWN[plot.key] = png
    return len(jobs)
