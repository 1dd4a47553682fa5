"""The user's own code: a retriever or a whole RAG system named by an entry point.

An entry point is `module:callable`. The module is looked up first in the entry kind's folder
(`inputs/retrievers/` or `inputs/systems/`, a dependency of the stages that run it, so an edit
re-runs them), then among the installed packages of the environment the stage runs in (the
pinned image by default). What it imports must be there too: a missing package is an error
naming it and how to add it to the image's recipe. Its code digest (the SHA-256 of the module's
files under that folder, or of the module file) goes into the stage's usage file and the MLflow
lineage.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import ConfigError

RETRIEVERS_DIR = "inputs/retrievers"
SYSTEMS_DIR = "inputs/systems"
_IMPORT_LOCK = threading.Lock()


@dataclass(frozen=True)
class EntryPoint:
    """A loaded entry point: the callable, where its module lives, and its code digest."""

    name: str
    func: Callable[..., Any]
    file: str
    code_sha: str


def _digest(module_file: Path, folder: Path) -> str:
    """The digest of the code an entry point runs: every .py file of its folder when the module
    lives there (it may import its neighbours), else the module's own file."""
    h = hashlib.sha256()
    try:
        inside = module_file.resolve().is_relative_to(folder.resolve())
    except OSError:
        inside = False
    files = sorted(folder.rglob("*.py")) if inside else [module_file]
    for f in files:
        rel = f.relative_to(folder).as_posix() if inside else f.name
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def load_entry_point(entry: str, root: Path, folder: str, where: str) -> EntryPoint:
    """The callable `entry` names (`module:callable`), found in `root/folder` or installed."""
    module_name, _, attr = entry.partition(":")
    base = root / folder
    with _IMPORT_LOCK:
        added = False
        if base.is_dir() and str(base) not in sys.path:
            sys.path.insert(0, str(base))
            added = True
        _forget(module_name.split(".", 1)[0], base)
        try:
            importlib.invalidate_caches()
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or module_name
            top = module_name.split(".", 1)[0]
            if missing in (top, module_name) or module_name.startswith(missing + "."):
                raise ConfigError(
                    f"{where}: no module {module_name!r}: put {top}.py (or a folder {top}/) in"
                    f" {folder}/, or install the package that provides it"
                ) from None
            raise ConfigError(
                f"{where}: {module_name} imports {missing!r}, which the environment the stage"
                f" runs in lacks. Add the package that provides it to requirements-image.in (the"
                " pinned image's recipe), run `make lock`, and run again (the image is rebuilt);"
                " with `runtime: local`, install it into .venv too"
            ) from None
        except SyntaxError as e:
            raise ConfigError(
                f"{where}: {e.filename}:{e.lineno}: a syntax error in {module_name}: {e.msg}"
            ) from None
        finally:
            if added:
                sys.path.remove(str(base))
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        raise ConfigError(f"{where}: {module_name} has no callable {attr!r}")
    file = Path(getattr(module, "__file__", "") or "")
    try:
        shown = file.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        shown = str(file)
    code_sha = _digest(file, base) if file.is_file() else "unknown"
    return EntryPoint(entry, func, shown, code_sha)


def _forget(top: str, base: Path) -> None:
    """Drop a module of that name imported before (and its submodules) when the folder has it,
    so that the code on disk now is what runs (a long-lived process, or a test's)."""
    if not ((base / f"{top}.py").is_file() or (base / top).is_dir()):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
