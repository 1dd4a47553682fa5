"""`lfbench new-benchmark NAME`: a new benchmark package from `pipeline/benchmarks/_template`.

Copies the template (a small working benchmark: fact recall of answers over documents) to
`pipeline/benchmarks/NAME/`, renaming it, with a README stub and an `__init__.py` of its own,
writes its test file (`tests/benchmarks/NAME/`) and its folders of inputs (`inputs/NAME/`) and
retrievals (`retrievals/NAME/`, `retrievals/lineage/NAME/`), and, unless asked not to, adds its
params section and its own judge's entry to params.yaml, and to dvc.yaml its stages (the shapes
of dvc.yaml with its name: 28 lines) and its plot (the main metric of each run). Its judge
stages depend on the local judge's model only with `--local-judge` (which lists the local judge
in its section). Nothing else is touched: the registry finds the new package by itself, and the
test suite's benchmark lists come from the registry. Then `dvc repro NAME-aggregate` runs it.
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
SNIPPETS = ("params.snippet.yaml", "dvc.snippet.yaml", "judges.snippet.yaml", "plots.snippet.yaml")
TESTS = "test.py.snippet"  # -> tests/benchmarks/NAME/test_NAME.py
STUB = "README.stub.md"  # -> the package's README.md (the template's own is its manual)
INIT = "init.py.snippet"  # -> the package's __init__.py (the template's own describes the template)
JUDGE, JUDGE_LOCAL = "<<: *judge\n", "<<: *judge-local\n"  # the judge stage's shape in dvc.yaml
INPUTS = """# Your {name} data

The raw files of the {name} benchmark (`{name}.source` in params.yaml can name one here). This
folder is a dependency of the `{name}-construct` stage, so editing your data re-runs what depends
on it.
"""
TEXT = (".py", ".txt", ".md", ".yaml")


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def renamed(text: str, name: str) -> str:
    return text.replace(TEMPLATE, name).replace("Template", class_name(name))


def _judges_entry(old: str, entry: str, path: Path) -> str:
    """params.yaml with the benchmark's own judge entry first under its top-level `judges:`."""
    lines = old.splitlines(keepends=True)
    at = next((n for n, line in enumerate(lines) if line.rstrip() == "judges:"), None)
    if at is None:
        raise ConfigError(f"{path}: no top-level `judges:` to add the new benchmark's judge to")
    return "".join([*lines[: at + 1], entry, *lines[at + 1 :]])


def _plot_entry(old: str, entry: str, path: Path) -> str:
    """dvc.yaml with the benchmark's plot last in its top-level `plots:` (which it adds, first in
    the file, when there is none)."""
    lines = old.splitlines(keepends=True)
    at = next((n for n, line in enumerate(lines) if line.rstrip() == "plots:"), None)
    if at is None:
        return "plots:\n" + entry + "\n" + old
    end = next(
        (n for n in range(at + 1, len(lines)) if lines[n][:1] not in (" ", "#", "\n", "")),
        len(lines),
    )
    while end > at + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1  # the blank lines and comments before the next key stay with it
    return "".join([*lines[:end], entry, *lines[end:]])


def _appended(
    path: Path,
    text: str,
    name: str,
    judges_entry: str | None = None,
    plot: str | None = None,
) -> str:
    """The file with a snippet appended, checked to land where it belongs: the section at the
    top level of params.yaml (and its judge's entry under `judges:`), the stages under `stages:`
    of dvc.yaml (which must come last, after the stage shapes) and its plot under `plots:`."""
    old = path.read_text(encoding="utf-8")
    if judges_entry is not None:
        old = _judges_entry(old, judges_entry, path)
    if plot is not None:
        old = _plot_entry(old, plot, path)
    new = old.rstrip("\n") + "\n" + text
    try:
        doc = yaml.safe_load(new) or {}
    except yaml.YAMLError as e:
        shapes = "stage shapes (`shape-construct: ... do: &construct`, ...)"
        raise ConfigError(
            f"{path}: appending the {name} snippet would break it (is `stages:` the last key,"
            f" after the {shapes} of lfbench's dvc.yaml?): {e}"
        ) from e
    if judges_entry is not None and f"{name}-match" not in (doc.get("judges") or {}):
        raise ConfigError(f"{path}: the {name}-match judge would not land under `judges:`")
    if plot is not None and not any(f"{name} " in str(p) for p in doc.get("plots") or []):
        raise ConfigError(f"{path}: the {name} plot would not land under `plots:`")
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
    name: str,
    root: Path,
    params_path: Path | None = None,
    dvc_file: Path | None = None,
    local_judge: bool = False,
) -> list[str]:
    """Create the package and its tests (and wire it when paths are given); the lines to tell
    the user."""
    benchmarks = root / "pipeline" / "benchmarks"
    source, dest = benchmarks / TEMPLATE, benchmarks / name
    tests = root / "tests" / "benchmarks" / name
    check_name(name, source)
    folders = [
        root / "inputs" / name,
        root / "retrievals" / name,
        root / "retrievals/lineage" / name,
    ]
    for there in (dest, tests, *folders):
        if there.exists():
            raise ConfigError(f"{there} already exists")
    params = yaml.safe_load(params_path.read_text(encoding="utf-8")) if params_path else {}
    if params_path and name in (params or {}):
        raise ConfigError(f"{params_path} already has a {name} section")
    stages = (yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}) if dvc_file else {}
    if dvc_file and f"{name}-construct" in (stages.get("stages") or {}):
        raise ConfigError(f"{dvc_file} already has a stage {name}-construct")

    def snippet(file: str) -> str:
        return renamed((source / file).read_text("utf-8"), name)

    section = snippet(SNIPPETS[0])
    stage_text = snippet(SNIPPETS[1])
    if local_judge:  # its judge stages depend on the local judge's model (DVC trains it first)
        section = section.replace(f"judges: [{name}-match]", f"judges: [{name}-match, local]")
        stage_text = stage_text.replace(JUDGE, JUDGE_LOCAL)
    # both files are checked before anything is written: a refusal leaves the project as it was
    new_params = (
        _appended(params_path, section, name, snippet(SNIPPETS[2]))
        if params_path is not None
        else None
    )
    new_dvc = (
        _appended(dvc_file, stage_text, name, plot=snippet(SNIPPETS[3]))
        if dvc_file is not None
        else None
    )
    ignore = shutil.ignore_patterns("__pycache__", *SNIPPETS, TESTS, STUB, INIT, "README.md")
    shutil.copytree(source, dest, ignore=ignore)
    for path in sorted(dest.rglob("*")):
        if path.is_file() and path.suffix in TEXT:
            path.write_text(renamed(path.read_text(encoding="utf-8"), name), encoding="utf-8")
    (dest / "README.md").write_text(snippet(STUB), encoding="utf-8")
    (dest / "__init__.py").write_text(snippet(INIT), encoding="utf-8")
    for folder in folders:  # the folders its stages read (its raw data; its retrievers' outputs)
        folder.mkdir(parents=True)
    (folders[0] / "README.md").write_text(INPUTS.format(name=name), encoding="utf-8")
    for folder in folders[1:]:
        (folder / ".gitkeep").write_text("", encoding="utf-8")
    tests.mkdir(parents=True)
    (tests / "__init__.py").write_text("", encoding="utf-8")
    (tests / f"test_{name}.py").write_text(snippet(TESTS), encoding="utf-8")
    lines = [
        f"created {dest.relative_to(root)}/ from {TEMPLATE}",
        f"created {tests.relative_to(root)}/test_{name}.py",
        f"created {', '.join(str(f.relative_to(root)) + '/' for f in folders)}",
    ]
    if params_path is not None and new_params is not None:
        params_path.write_text(new_params, encoding="utf-8")
        lines.append(f"added the {name} section and the {name}-match judge to {params_path}")
    if dvc_file is not None and new_dvc is not None:
        dvc_file.write_text(new_dvc, encoding="utf-8")
        lines.append(f"added the {name} stages and its plot to {dvc_file}")
    lines.append(
        f"next: edit {dest.relative_to(root)}/ (the template's README says what to change), then"
        f" `dvc repro {name}-aggregate` and `pytest {tests.relative_to(root)}`"
    )
    return lines
