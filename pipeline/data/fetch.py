"""`lfbench data fetch`: fill data/ from pinned public sources or a local mirror, verified.

Two sources, one result:
- a mirror folder with the same layout as data/ (`--mirror DIR` or `LFBENCH_DATA_MIRROR`), or
- the public repositories, each file at a pinned commit (raw GitHub URLs).

Every file is checked against its size, sha256 and git blob id from data.sources.yaml before it
is moved into place, so data/ ends up byte-identical to what data.dvc records.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.core.config import load_yaml
from pipeline.core.errors import DataError, format_loc
from pipeline.core.io import atomic_write_bytes

RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
# Another host with the same layout (e.g. a caching proxy) can be named here.
URL_TEMPLATE_ENV = "LFBENCH_DATA_URL_TEMPLATE"
MIRROR_ENV = "LFBENCH_DATA_MIRROR"


class SourceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str
    commit: str
    path: str
    git_blob: str
    sha256: str
    bytes: int
    license: str
    derive: str | None = None
    source_git_blob: str | None = None
    source_bytes: int | None = None

    @property
    def url(self) -> str:
        template = os.environ.get(URL_TEMPLATE_ENV, RAW_URL)
        return template.format(repo=self.repo, commit=self.commit, path=self.path)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    files: dict[str, SourceFile]


def load_manifest(path: Path) -> Manifest:
    try:
        return Manifest.model_validate(load_yaml(path))
    except ValidationError as e:
        err = e.errors()[0]
        raise DataError(err["msg"], file=str(path), field=format_loc(tuple(err["loc"]))) from e


def _git_blob(data: bytes) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {len(data)}\0".encode())
    h.update(data)
    return h.hexdigest()


def verify_bytes(name: str, data: bytes, spec: SourceFile) -> None:
    """Raise a DataError naming the file if the bytes are not exactly the pinned ones."""
    if len(data) != spec.bytes:
        raise DataError(
            f"size {len(data)} bytes, expected {spec.bytes} (truncated or a different version)",
            file=name,
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise DataError(f"sha256 {digest}, expected {spec.sha256} (corrupted)", file=name)
    blob = _git_blob(data)
    if blob != spec.git_blob:
        raise DataError(f"git blob {blob}, expected {spec.git_blob}", file=name)


def derive_json_list_complete_prefix(data: bytes) -> bytes:
    """Keep the complete records of a truncated JSON list, re-serialised as the mirror has them."""
    text = data.decode("utf-8")
    start = text.index("[") + 1
    decoder = json.JSONDecoder()
    records: list[Any] = []
    pos = start
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the truncated tail
        records.append(obj)
    return json.dumps(records, ensure_ascii=False, indent=1).encode("utf-8")


DERIVERS: dict[str, Callable[[bytes], bytes]] = {
    "json_list_complete_prefix": derive_json_list_complete_prefix,
}


def download(url: str, timeout: float = 60.0) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": "lfbench-data-fetch"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return bytes(resp.read())
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise DataError(
            f"download failed ({e}); no network? use --mirror DIR or {MIRROR_ENV}", file=url
        ) from e


@dataclass
class FetchReport:
    copied: list[str]
    already_ok: list[str]


def fetch(
    data_dir: Path,
    manifest_path: Path,
    mirror: Path | None = None,
    only: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> FetchReport:
    manifest = load_manifest(manifest_path)
    wanted = {
        name: spec
        for name, spec in manifest.files.items()
        if not only or any(name.startswith(prefix.rstrip("/") + "/") for prefix in only)
    }
    if mirror is not None and not mirror.is_dir():
        raise DataError("mirror folder not found", file=str(mirror))

    # Nothing but the manifest's files may sit in data/, or data.dvc would not match.
    if data_dir.exists():
        extra = sorted(
            str(p.relative_to(data_dir))
            for p in data_dir.rglob("*")
            if p.is_file() and str(p.relative_to(data_dir)) not in manifest.files
        )
        if extra:
            raise DataError(
                "files not in data.sources.yaml: "
                + ", ".join(extra)
                + " (move them out of data/ so it matches data.dvc)",
                file=str(data_dir),
            )

    report = FetchReport(copied=[], already_ok=[])
    for name, spec in sorted(wanted.items()):
        dest = data_dir / name
        if dest.exists():
            try:
                verify_bytes(str(dest), dest.read_bytes(), spec)
                report.already_ok.append(name)
                continue
            except DataError:
                log(f"{dest}: present but does not match its checksum; fetching it again")
        if mirror is not None:
            src = mirror / name
            if not src.exists():
                raise DataError(f"missing from the mirror {mirror}", file=str(src))
            data = src.read_bytes()
            verify_bytes(str(src), data, spec)
        else:
            log(f"downloading {spec.url}")
            raw = download(spec.url)
            if spec.derive:
                if spec.source_git_blob and _git_blob(raw) != spec.source_git_blob:
                    raise DataError(
                        f"source git blob {_git_blob(raw)}, expected {spec.source_git_blob}",
                        file=spec.url,
                    )
                data = DERIVERS[spec.derive](raw)
            else:
                data = raw
            verify_bytes(spec.url, data, spec)
        atomic_write_bytes(dest, data)
        report.copied.append(name)
    return report


def resolve_mirror(flag: str | None) -> Path | None:
    value = flag or os.environ.get(MIRROR_ENV)
    return Path(value).expanduser().resolve() if value else None


def dvc_commit_data(dvc_file: Path) -> None:
    """Check data/ against data.dvc and store it in the DVC cache (so `dvc push` can share it).

    Refuses to rewrite data.dvc: if data/ does not match it, that is an error, not an update.
    """
    from dvc.repo import Repo  # heavy import, only when needed

    root = dvc_file.resolve().parent
    with Repo(str(root)) as repo:
        problems = _status_problems(repo.status(targets=[str(dvc_file)]))
        if problems:
            raise DataError(f"data/ does not match {dvc_file.name}: {problems}", file=str(dvc_file))
        repo.commit(str(dvc_file), force=True)
        after = repo.status(targets=[str(dvc_file)])
        if after:
            raise DataError(f"dvc status is not clean after the fetch: {after}", file=str(dvc_file))


def _status_problems(status: dict[str, Any]) -> list[str]:
    """Everything in a `dvc status` answer except outputs that are merely not cached yet."""
    problems = []
    for entries in status.values():
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, dict):
                problems.append(str(entry))
                continue
            for kind, detail in entry.items():
                if (
                    kind == "changed outs"
                    and isinstance(detail, dict)
                    and all(state == "not in cache" for state in detail.values())
                ):
                    continue
                problems.append(f"{kind}: {detail}")
    return problems
