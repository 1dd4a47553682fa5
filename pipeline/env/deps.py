"""The code a dvc.yaml stage runs, and whether its `deps` cover it.

DVC re-runs a stage when one of its declared dependencies changes, so every project module a
stage can execute must lie under one of them. A stage's code is the import closure of

- the module-level imports of `pipeline/launch.py`, `pipeline/cli.py` and
  `pipeline/stages/commands.py` (the command line every stage goes through: the `lfbench`
  entry point, which may hand the process to the warm stage server, `lfbench run`, then
  `lfbench stage <verb>`; their function-level imports serve other commands, or choose the
  runtime),
- the stage module its verb names (`lfbench run judge` -> `pipeline/stages/judge.py`),
- the benchmark package its `--benchmark` names (the registry imports only that one),

following every `import` (module-level and inside functions) of project modules, with the
`__init__.py` of each package on the way. `check` lists, per stage, the project files of that
closure that no dependency covers; `suggest` gives the folder-level dependencies that would.
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.core import dvcfile
from pipeline.core.config import LocalJudge, Params
from pipeline.core.errors import ConfigError
from pipeline.core.io import read_text

PACKAGE = "pipeline"
STAGE_MODULES = {
    "construct": "pipeline.stages.construct",
    "retrieve": "pipeline.stages.retrieve",
    "generate": "pipeline.stages.generate",
    "judge": "pipeline.stages.judge",
    "aggregate": "pipeline.stages.aggregate",
    "results": "pipeline.stages.aggregate",
    "agreement": "pipeline.stages.agreement",
    "train-local-judge": "pipeline.stages.train_judge",
}
# The command line every stage goes through (the entry point, `lfbench run`, then `lfbench
# stage <verb>`).
COMMAND_LINE = (f"{PACKAGE}.launch", f"{PACKAGE}.cli", f"{PACKAGE}.stages.commands")
# Folders a stage depends on as a whole (a change anywhere in them re-runs it).
FOLDERS = ("core", "stages", "llm_judge", "local_judge", "llm", "retrieval", "metrics", "data")


def module_path(root: Path, module: str) -> Path | None:
    """The file of a project module (a package's `__init__.py`), or None."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _tree(path: Path, mtime_ns: int) -> ast.Module:
    try:
        return ast.parse(read_text(path), filename=str(path))
    except SyntaxError as e:
        raise ConfigError(f"{path}, line {e.lineno}: a syntax error ({e.msg})") from e


def _imports(root: Path, module: str, path: Path, top_level_only: bool) -> set[str]:
    tree = _tree(path, path.stat().st_mtime_ns)
    nodes: Iterable[ast.AST] = tree.body if top_level_only else ast.walk(tree)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in out if m == PACKAGE or m.startswith(PACKAGE + ".")}


def closure(root: Path, starts: Iterable[str], top_level_only: Iterable[str] = ()) -> set[Path]:
    """The project files reached from `starts` (the modules in `top_level_only` contribute only
    their module-level imports), with every package `__init__.py` on the way."""
    shallow = set(top_level_only)
    seen: set[str] = set()
    files: set[Path] = set()
    todo = list(starts) + list(shallow)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_path(root, module)
        if path is None:
            continue  # a name imported from a module, not a module itself
        files.add(path)
        parts = module.split(".")
        todo += [".".join(parts[:k]) for k in range(1, len(parts))]  # parent packages
        todo += sorted(_imports(root, module, path, module in shallow and module not in starts))
    return files


@dataclass(frozen=True)
class StageCode:
    stage: str
    files: set[Path]
    deps: list[str]
    uncovered: list[str]


def entry_modules(cmd: str) -> tuple[list[str], list[str]] | None:
    """(modules followed whole, modules followed at module level) of a stage command, or None
    for a command that does not run an `lfbench run <verb>` stage."""
    argv = shlex.split(cmd)
    if argv[:2] != ["lfbench", "run"] or len(argv) < 3 or argv[2] not in STAGE_MODULES:
        return None
    starts = [STAGE_MODULES[argv[2]]]
    if "--benchmark" in argv:
        starts.append(f"{PACKAGE}.benchmarks.{argv[argv.index('--benchmark') + 1]}")
    return starts, list(COMMAND_LINE)


def covered(rel: str, deps: Iterable[str]) -> bool:
    return any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps)


def stage_code(root: Path, stage: str, spec: dict[str, Any]) -> StageCode | None:
    deps = dvcfile.paths(spec.get("deps"))
    if shlex.split(str(spec.get("cmd", "")))[:3] == ["lfbench", "image", "recipe"]:
        # the recipe is the hash of these files: each must be a dep, or a lock change would
        # leave the recipe (and every stage's record of it) stale
        from pipeline.env.image import RECIPE_FILES

        files = {root / f for f in (*RECIPE_FILES, "pipeline/env/image.py")}
    else:
        entry = entry_modules(str(spec.get("cmd", "")))
        if entry is None:
            return None
        starts, shallow = entry
        files = closure(root, starts, shallow)
    rels = sorted(str(f.relative_to(root)) for f in files)
    return StageCode(stage, files, deps, [r for r in rels if not covered(r, deps)])


def check(root: Path, dvc_file: Path | None = None) -> list[StageCode]:
    """Every `lfbench run` stage of dvc.yaml with the project files it runs and those its deps
    miss (`uncovered`, empty when the stage is complete)."""
    out = []
    for stage, spec in dvcfile.stages(dvc_file or root / "dvc.yaml").items():
        code = stage_code(root, stage, spec)
        if code is not None:
            out.append(code)
    return out


def missing_models(root: Path, params: Params, dvc_file: Path | None = None) -> list[str]:
    """The judge stages (`lfbench run judge --benchmark B`) whose benchmark lists the local
    judge but whose deps miss its model file (DVC would not train it first): `stage: path`."""
    out = []
    for stage, spec in dvcfile.stages(dvc_file or root / "dvc.yaml").items():
        argv = shlex.split(str(spec.get("cmd", "")))
        if argv[:3] != ["lfbench", "run", "judge"] or "--benchmark" not in argv:
            continue
        bench = argv[argv.index("--benchmark") + 1]
        section = params.raw_section(bench) or {}
        deps = dvcfile.paths(spec.get("deps"))
        for judge in section.get("judges", []) if isinstance(section, dict) else []:
            entry = params.judges.get(judge)
            if isinstance(entry, LocalJudge) and entry.model_path not in deps:
                out.append(f"{stage}: {entry.model_path} (judges.{judge})")
    return out


def suggest(root: Path, files: Iterable[Path]) -> list[str]:
    """Folder-level dependencies covering `files`: the shared folders (`FOLDERS`) and a
    benchmark's package whole, single top-level modules as files."""
    out: set[str] = set()
    for f in files:
        rel = f.relative_to(root).parts
        if len(rel) >= 3 and rel[1] in FOLDERS:
            out.add("/".join(rel[:2]))
        elif len(rel) >= 4 and rel[1] == "benchmarks":
            out.add("/".join(rel[:3]))
        else:
            out.add("/".join(rel))
    return sorted(out)
