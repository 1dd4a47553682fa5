"""Prompt files: loaded once, hashed, rendered strictly.

A prompt is a UTF-8 text file with `${name}` placeholders (Python's `string.Template`). Its
SHA-256 goes into every cache key and MLflow run, so editing a prompt can never be mistaken for
the old one. A placeholder the code does not fill, or a missing file, is an error naming the file.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import read_text


@dataclass(frozen=True)
class Prompt:
    path: str
    text: str
    sha: str

    def render(self, **values: object) -> str:
        try:
            return string.Template(self.text).substitute({k: str(v) for k, v in values.items()})
        except KeyError as e:
            raise ConfigError(
                f"{self.path}: placeholder ${{{e.args[0]}}} is not one this prompt can use;"
                f" available: {', '.join(sorted(values))}"
            ) from e
        except ValueError as e:
            raise ConfigError(f"{self.path}: malformed placeholder ({e})") from e


def load_prompt(path: str | Path, root: Path | None = None) -> Prompt:
    p = Path(path)
    if not p.is_absolute() and root is not None:
        p = root / p
    if not p.is_file():
        raise ConfigError(f"{path}: prompt file not found")
    try:
        text = read_text(p, str(path))
    except DataError as e:
        raise ConfigError(f"prompt {e}") from e
    return Prompt(str(path), text, hashlib.sha256(text.encode("utf-8")).hexdigest())


def combined_sha(*prompts: Prompt) -> str:
    """One hash for a set of prompts used together (e.g. a judge prompt and its repair prompt)."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.sha.encode())
    return h.hexdigest()
