"""`lfbench new-benchmark NAME`: a new benchmark package from `pipeline/benchmarks/_template`.

Copies the template (a small working benchmark: fact recall of answers over documents) to
`pipeline/benchmarks/NAME/`, renaming it, and, unless asked not to, appends its params section to
params.yaml and its four stages to dvc.yaml. Nothing else is touched: the registry finds the new
package by itself. Then `dvc repro NAME-aggregate` runs it end to end.
"""

from __future__ import annotations

import ast
import keyword
import re
import shutil
from pathlib import Path

import yaml

from pipeline.core.errors import ConfigError

TEMPLATE = "_template"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
NAME_MAX = 64
SNIPPETS = ("params.snippet.yaml", "dvc.snippet.yaml")
TEXT = (".py", ".txt", ".md", ".yaml")


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def renamed(text: str, name: str) -> str:
    return text.replace(TEMPLATE, name).replace("Template", class_name(name))


def _appended(path: Path, text: str, name: str) -> str:
    """The file with a snippet appended, checked to land where it belongs: the section at the
    top level of params.yaml, the stages under `stages:` of dvc.yaml (which must come last)."""
    old = path.read_text(encoding="utf-8")
    new = old.rstrip("\n") + "\n" + text
    try:
        doc = yaml.safe_load(new) or {}
    except yaml.YAMLError as e:
        raise ConfigError(
            f"{path}: appending the {name} snippet would break it (is `stages:` the last key?): {e}"
        ) from e
    if name not in doc and f"{name}-construct" not in (doc.get("stages") or {}):
        raise ConfigError(
            f"{path}: the {name} snippet would not land in place (is `stages:` the last key?);"
            f" add it by hand from pipeline/benchmarks/{TEMPLATE}/"
        )
    return new


def _template_names(source: Path) -> set[str]:
    """The names the template's modules define or import at top level: those it renames (the
    class `Template`, `TemplateParams`, ...) must not become one of the others."""
    names: set[str] = set()
    for path in source.glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ClassDef | ast.FunctionDef):
                names.add(node.name)
    return names


def check_name(name: str, source: Path) -> None:
    """A name the package, its class, its DVC stages and its params section can all hold:
    refused (before anything is written) with the reason."""
    shown = name if len(name) <= 40 else name[:40] + "..."
    if not NAME_RE.match(name):
        raise ConfigError(
            f"benchmark name {shown!r} must match {NAME_RE.pattern} (a Python package name)"
        )
    if len(name) > NAME_MAX:
        raise ConfigError(
            f"benchmark name {shown!r} is {len(name)} characters long; at most {NAME_MAX}"
            " (it becomes folder, file and stage names)"
        )
    if keyword.iskeyword(name):
        raise ConfigError(
            f"benchmark name {name!r} is a Python keyword: pipeline.benchmarks.{name} could not"
            " be imported"
        )
    names = _template_names(source)
    kept = {n for n in names if "Template" not in n}
    clash = sorted({renamed(n, name) for n in names if "Template" in n} & kept)
    if clash:
        raise ConfigError(
            f"benchmark name {name!r} would name a class {clash[0]}, which the template's code"
            " already uses for something else; choose another name"
        )


def create(
    name: str, root: Path, params_path: Path | None = None, dvc_file: Path | None = None
) -> list[str]:
    """Create the package (and wire it when paths are given); the lines to tell the user."""
    benchmarks = root / "pipeline" / "benchmarks"
    source, dest = benchmarks / TEMPLATE, benchmarks / name
    check_name(name, source)
    if dest.exists():
        raise ConfigError(f"{dest} already exists")
    params = yaml.safe_load(params_path.read_text(encoding="utf-8")) if params_path else {}
    if params_path and name in (params or {}):
        raise ConfigError(f"{params_path} already has a {name} section")
    stages = (yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}) if dvc_file else {}
    if dvc_file and f"{name}-construct" in (stages.get("stages") or {}):
        raise ConfigError(f"{dvc_file} already has a stage {name}-construct")
    # both files are checked before anything is written: a refusal leaves the project as it was
    new_params = (
        _appended(params_path, renamed((source / SNIPPETS[0]).read_text("utf-8"), name), name)
        if params_path is not None
        else None
    )
    new_dvc = (
        _appended(dvc_file, renamed((source / SNIPPETS[1]).read_text("utf-8"), name), name)
        if dvc_file is not None
        else None
    )
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", *SNIPPETS))
    for path in sorted(dest.rglob("*")):
        if path.is_file() and path.suffix in TEXT:
            path.write_text(renamed(path.read_text(encoding="utf-8"), name), encoding="utf-8")
    lines = [f"created {dest.relative_to(root)}/ from {TEMPLATE}"]
    if params_path is not None and new_params is not None:
        params_path.write_text(new_params, encoding="utf-8")
        lines.append(f"appended the {name} section to {params_path}")
    if dvc_file is not None and new_dvc is not None:
        dvc_file.write_text(new_dvc, encoding="utf-8")
        lines.append(f"appended the {name} stages to {dvc_file}")
    lines.append(
        f"next: edit {dest.relative_to(root)}/ (README.md there says what to change), then"
        f" `dvc repro {name}-aggregate`"
    )
    return lines
