"""The benchmark registry: one package per benchmark, registered by name."""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.errors import ConfigError

_REGISTRY = {
    "summhay": "pipeline.benchmarks.summhay",
    "long2rag": "pipeline.benchmarks.long2rag",
}


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> ModuleType:
    try:
        return importlib.import_module(_REGISTRY[name])
    except KeyError:
        raise ConfigError(f"unknown benchmark {name!r}; known: {', '.join(names())}") from None
