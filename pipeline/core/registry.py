"""The benchmark registry: one package per benchmark under `pipeline/benchmarks/`, by name.

A benchmark is the package `pipeline/benchmarks/<name>/` whose `__init__.py` calls
`register(<its Benchmark>)`. Packages are found on disk (`names()` imports none of them) and each
is imported only when asked for (`get(name)`), so a stage of one benchmark loads that benchmark's
code and no other's: its DVC dependencies name exactly what it runs. Packages whose name starts
with `_` (the `_template`) are not benchmarks.
"""

from __future__ import annotations

import importlib
import traceback
from typing import TYPE_CHECKING

from pipeline.core.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.core.benchmark import AnyBenchmark

from pipeline.core.packages import PACKAGE as PACKAGE
from pipeline.core.packages import names as names

_REGISTRY: dict[str, AnyBenchmark] = {}


def register(benchmark: AnyBenchmark) -> AnyBenchmark:
    """Called by a benchmark package's `__init__.py`. A name can be registered once."""
    name = benchmark.name
    if not benchmark.metrics:
        raise ConfigError(
            f"benchmark {name!r} declares no metrics: `metrics = (Metric(...), ...)`, the main"
            " one first"
        )
    if name in _REGISTRY:
        raise ConfigError(
            f"benchmark {name!r} is registered twice ({type(_REGISTRY[name]).__module__} and"
            f" {type(benchmark).__module__})"
        )
    _REGISTRY[name] = benchmark
    return benchmark


def _import(name: str) -> None:
    """Import a benchmark package; a package that cannot be imported (a SyntaxError, an import
    that fails, an error raised at import) is a ConfigError naming the package and where."""
    module = f"{PACKAGE}.{name}"
    try:
        importlib.import_module(module)
    except SyntaxError as e:
        raise ConfigError(
            f"benchmark package {module} cannot be imported: a syntax error in {e.filename},"
            f" line {e.lineno}: {e.msg}"
        ) from e
    except Exception as e:  # any error at import: the user's package is broken, say which
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise ConfigError(
            f"benchmark package {module} cannot be imported: {type(e).__name__}: {e}"
            f" (at {frame.filename}, line {frame.lineno})"
        ) from e


def get(name: str) -> AnyBenchmark:
    """The registered benchmark `name`, importing its package on first use."""
    if name not in _REGISTRY:
        if name not in names():
            raise ConfigError(f"unknown benchmark {name!r}; known: {', '.join(names())}")
        _import(name)
        if name not in _REGISTRY:
            raise ConfigError(
                f"package {PACKAGE}.{name} registers no benchmark named {name!r}"
                " (its __init__.py must call pipeline.core.registry.register)"
            )
    return _REGISTRY[name]


def load_all() -> list[AnyBenchmark]:
    """Every benchmark, imported (for the commands that span them: check, report, track)."""
    return [get(n) for n in names()]
