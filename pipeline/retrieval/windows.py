"""Cutting a passage into windows of N tokens, for an embedding model with a short input.

A window is a span of the original text: from the first character of its first token to the
last character of its last token (the text between two windows, usually a space, belongs to
neither). The tokens are counted by

- `cl100k_base`: OpenAI's encoding (`pipeline.retrieval.tokens`, offline);
- `minilm`: the WordPiece tokenizer of the packaged all-MiniLM-L6-v2, so that windows of 254
  pieces are those the dense retriever (`pipeline.retrieval.dense`) embeds;
- the path of a `tokenizer.json` (any Hugging Face `tokenizers` file: the embedding model's
  own, so that a window fits the model's input exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from pipeline.core.errors import ConfigError

Spans = Callable[[Sequence[str]], list[list[tuple[int, int]]]]


@lru_cache(maxsize=8)
def token_spans(tokenizer: str, root: str = ".") -> Spans:
    """The (start, end) character span of every token of each text, by the named tokenizer."""
    if tokenizer == "cl100k_base":
        from pipeline.retrieval.tokens import get_encoding

        enc = get_encoding()

        def cl100k(texts: Sequence[str]) -> list[list[tuple[int, int]]]:
            out = []
            for text in texts:
                tokens = enc.encode_ordinary(text)
                _, starts = enc.decode_with_offsets(tokens)
                ends = [*starts[1:], len(text)] if starts else []
                out.append(list(zip(starts, ends, strict=True)))
            return out

        return cl100k
    if tokenizer == "minilm":
        from pipeline.retrieval.dense import model_dir

        path = model_dir() / "tokenizer.json"
    else:
        path = Path(tokenizer)
        if not path.is_absolute():
            path = Path(root) / path
        if not path.is_file():
            raise ConfigError(
                f"tokenizer {tokenizer!r}: no such file (cl100k_base, minilm, or the path of a"
                " tokenizer.json)"
            )
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:
        raise ConfigError(f"tokenizer {tokenizer!r}: {path} is not a tokenizer.json: {e}") from e
    tok.no_truncation()  # a tokenizer.json may cut every text to the model's input
    tok.no_padding()

    def hf(texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        encodings = tok.encode_batch(list(texts), add_special_tokens=False)
        return [[(int(a), int(b)) for a, b in e.offsets] for e in encodings]

    return hf


def windows(text: str, spans: Sequence[tuple[int, int]], size: int) -> list[str]:
    """`text` cut into consecutive windows of `size` tokens (one window for a text with no
    token: the text itself)."""
    if not spans:
        return [text]
    out = []
    for s in range(0, len(spans), size):
        part = spans[s : s + size]
        out.append(text[part[0][0] : part[-1][1]])
    return out


def cut(texts: Sequence[str], size: int | None, tokenizer: str, root: str = ".") -> list[list[str]]:
    """Each text's windows (`size` None: the text whole)."""
    if size is None:
        return [[t] for t in texts]
    spans = token_spans(tokenizer, root)(texts)
    return [windows(t, s, size) for t, s in zip(texts, spans, strict=True)]
