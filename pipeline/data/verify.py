"""Every stage that reads data/ first checks it against the pins of data.sources.yaml.

A file of data/ that is not the pinned one (a byte changed, truncated, replaced) must never flow
into a dataset, a result or data.dvc. DVC cannot be the guard: the stages depend on
data.sources.yaml (the pins), not on the data/ folder, because a `dvc repro` of a stage that
depends on data/ first "verifies" data.dvc's output and, when it changed, rewrites data.dvc with
the changed folder's hash. So the stage process checks, before it writes anything: each pinned
file under the folders its arguments name has the pinned size and sha256, and nothing else sits
there.

Cheap: a file whose stat (size, mtime, ctime, inode) is the one recorded when it was last hashed
and matched is trusted (`.lfbench/data-verified.json`); any write to it changes its ctime. A file
changed in the last seconds is hashed every time (a file system with coarse timestamps could give
a write in the same tick the same stat). Hashing all of data/ (41 MB) takes about 0.2 s here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.core.errors import DataError
from pipeline.core.io import atomic_write_text

log = logging.getLogger(__name__)

DATA_DIR = "data"
MANIFEST = "data.sources.yaml"
MEMO = Path(".lfbench") / "data-verified.json"
RACY_S = 3.0  # a file changed this recently is hashed again each time (not memoised)
FIX = "`lfbench data fetch` replaces a file that does not match its pin"


def data_paths(root: Path, args: Iterable[str]) -> list[Path]:
    """The arguments of a stage's command line that name data/ or something inside it."""
    data = (root / DATA_DIR).resolve()
    out = []
    for arg in args:
        if arg.startswith("--") and "=" in arg:
            arg = arg.split("=", 1)[1]  # --data=data/summhay
        if arg.startswith("-") or not arg:
            continue
        try:
            path = (root / arg).resolve()
        except (OSError, RuntimeError):
            continue
        if path == data or data in path.parents:
            out.append(path)
    return out


def verify_data(root: Path, paths: Iterable[Path]) -> int:
    """Check every pinned file under `paths` (folders or files inside data/) against
    data.sources.yaml, and that no other file sits under them. Returns how many files were
    checked; raises a DataError naming the file, the pinned and the actual sha256 and the fix."""
    from pipeline.data.fetch import load_manifest

    paths = list(paths)
    if not paths:
        return 0
    data = (root / DATA_DIR).resolve()
    manifest = load_manifest(root / MANIFEST).files
    wanted: dict[str, Any] = {}
    for path in paths:
        rel = "" if path == data else str(path.relative_to(data))
        inside = {
            name: spec
            for name, spec in manifest.items()
            if not rel or name == rel or name.startswith(rel + "/")
        }
        if not inside:
            raise DataError(
                f"no file of {MANIFEST} is under it: data/ holds only the pinned raw data (your"
                " own files go elsewhere, e.g. inputs/)",
                file=_shown(root, path),
            )
        wanted |= inside
        if path.is_dir():
            extra = sorted(
                str(p.relative_to(data))
                for p in path.rglob("*")
                if p.is_file() and str(p.relative_to(data)) not in manifest
            )
            if extra:
                raise DataError(
                    f"not in {MANIFEST}: data/ holds only the pinned raw data; move it out (your"
                    " own files go elsewhere, e.g. inputs/), or run `lfbench data fetch`, which"
                    " names every such file",
                    file=f"{DATA_DIR}/{extra[0]}",
                )
    memo_path = root / MEMO
    memo = _read_memo(memo_path)
    changed = False
    now = time.time()
    for name, spec in sorted(wanted.items()):
        path = data / name
        shown = f"{DATA_DIR}/{name}"
        try:
            st = path.stat()
        except FileNotFoundError:
            raise DataError(f"missing; {FIX} (or `dvc pull data.dvc`)", file=shown) from None
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = memo.get(name)
        if known is not None and known[:4] == key and known[4] == spec.sha256:
            continue
        digest = _sha256(path)
        if st.st_size != spec.bytes or digest != spec.sha256:
            raise DataError(
                f"sha256 {digest} ({st.st_size} bytes), expected {spec.sha256} ({spec.bytes}"
                f" bytes), as {MANIFEST} pins it: not the pinned file (changed or corrupted), so"
                f" nothing is read from it; {FIX}",
                file=shown,
            )
        if now - max(st.st_mtime, st.st_ctime) > RACY_S:
            memo[name] = [*key, digest]
            changed = True
    if changed:
        _write_memo(memo_path, memo)
    return len(wanted)


def _shown(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _read_memo(path: Path) -> dict[str, list[Any]]:
    """The memo of verified files; anything unreadable is an empty memo (everything is hashed)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        k: v
        for k, v in raw.items()
        if isinstance(v, list) and len(v) == 5 and all(isinstance(x, int) for x in v[:4])
    }


def _write_memo(path: Path, memo: dict[str, list[Any]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(memo, sort_keys=True) + "\n")
    except OSError as e:  # a read-only workspace: verification still happened, only not kept
        log.debug("%s: not written (%s)", path, e)
