"""The benchmark packages on disk: `pipeline/benchmarks/<name>/`, by name, none imported (what
params.yaml's sections may be named; `pipeline.core.registry` imports them)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

PACKAGE = "pipeline.benchmarks"


@cache
def names() -> tuple[str, ...]:
    """Every benchmark package's name, sorted (found on disk, none imported)."""
    pkg = importlib.import_module(PACKAGE)
    return tuple(
        sorted(
            m.name
            for m in pkgutil.iter_modules(pkg.__path__)
            if m.ispkg and not m.name.startswith("_")
        )
    )
