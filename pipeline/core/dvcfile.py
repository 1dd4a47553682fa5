"""dvc.yaml's stages as lfbench reads them: each stage as DVC builds it, before its matrix.

dvc.yaml writes the body every benchmark's stages share once (`shape-*`: a `foreach: []`, which
makes no stage, whose `do:` each benchmark's stage takes in with a YAML merge key, `<<:`), and
each stage names its benchmark in its own `vars` (`bench`, `data`). `stages` gives every stage
merged (the YAML loader follows `<<:`) with its `vars` put in (`${bench}` -> `summhay`); the
shapes themselves are left out. What DVC fills in later stays as written: a matrix's
`${item.model}` and a value of params.yaml (`${summhay.models}`). A test checks this against
DVC's own reading of the project's dvc.yaml.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.errors import ConfigError

SHAPE = "foreach"  # a stage written with `foreach: []` is a shape, not a stage
_VAR = re.compile(r"\$\{\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\}")


def load(path: Path) -> dict[str, Any]:
    """The document (libyaml's parser where PyYAML has it: merge keys followed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror})") from e
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    return doc if isinstance(doc, dict) else {}


def stage_vars(name: str, spec: Mapping[str, Any], path: Path) -> dict[str, str]:
    """A stage's own `vars` (the mappings among them; a vars file is DVC's business)."""
    out: dict[str, str] = {}
    for entry in spec.get("vars") or []:
        if isinstance(entry, Mapping):
            for key, value in entry.items():
                if isinstance(value, Mapping | list):
                    raise ConfigError(f"{path}: stage {name}: vars.{key} must be a plain value")
                out[str(key)] = str(value)
    return out


def fill(value: Any, names: Mapping[str, str]) -> Any:
    """`value` with each `${name}` of `names` put in (in keys and values, at any depth)."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: names.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [fill(v, names) for v in value]
    if isinstance(value, Mapping):
        return {fill(k, names): fill(v, names) for k, v in value.items()}
    return value


def stages(path: Path) -> dict[str, dict[str, Any]]:
    """Every stage of the dvc.yaml at `path` (not the shapes), merged, its vars put in, in the
    file's order; `vars` itself is dropped."""
    raw = load(path).get("stages") or {}
    out: dict[str, dict[str, Any]] = {}
    for name, spec in raw.items():
        if not isinstance(spec, Mapping) or SHAPE in spec:
            continue
        names = stage_vars(str(name), spec, path)
        out[str(name)] = {k: fill(v, names) for k, v in spec.items() if k != "vars"}
    return out


def paths(entries: Any) -> list[str]:
    """The paths of a `deps`, `outs`, `metrics` or `plots` list (an entry is a path, or a
    mapping of one path to its flags)."""
    return [
        str(next(iter(e))) if isinstance(e, Mapping) else str(e)
        for e in entries or []
        if not isinstance(e, Mapping) or e
    ]
