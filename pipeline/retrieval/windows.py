"""Cutting a passage into windows of N tokens, for an embedding model with a short input.

A window is a span of the original text: from the first character of its first token to the
last character of its last token (the text between two windows, usually a space, belongs to
neither). With a Hugging Face tokenizer a window never ends inside a word (its pieces stay
together; a word longer than a window is cut): the window's text, tokenised again, gives the
same pieces, so it is embedded exactly as the dense retriever embeds its windows. The tokens
are counted by

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
from pipeline.retrieval.boundaries import window_starts

Span = tuple[int, int, int]  # a token's first and end character, and the word it belongs to
Spans = Callable[[Sequence[str]], list[list[Span]]]


@lru_cache(maxsize=8)
def token_spans(tokenizer: str, root: str = ".") -> Spans:
    """The (start, end) character span of every token of each text, by the named tokenizer,
    with the word it is part of (cl100k_base: each token its own)."""
    if tokenizer == "cl100k_base":
        from pipeline.retrieval.tokens import get_encoding

        enc = get_encoding()

        def cl100k(texts: Sequence[str]) -> list[list[Span]]:
            out = []
            for text in texts:
                tokens = enc.encode_ordinary(text)
                _, starts = enc.decode_with_offsets(tokens)
                ends = [*starts[1:], len(text)] if starts else []
                out.append([(a, b, i) for i, (a, b) in enumerate(zip(starts, ends, strict=True))])
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

    def hf(texts: Sequence[str]) -> list[list[Span]]:
        encodings = tok.encode_batch(list(texts), add_special_tokens=False)
        return [
            [
                (int(a), int(b), -1 - i if w is None else int(w))
                for i, ((a, b), w) in enumerate(zip(e.offsets, e.word_ids, strict=True))
            ]
            for e in encodings
        ]

    return hf


def windows(text: str, spans: Sequence[Span], size: int) -> list[str]:
    """`text` cut into consecutive windows of at most `size` tokens, none ending inside a word
    (one window for a text with no token: the text itself)."""
    if not spans:
        return [text]
    starts = window_starts(len(spans), size, [w for _, _, w in spans])
    return [
        text[spans[a][0] : spans[b - 1][1]]
        for a, b in zip(starts, [*starts[1:], len(spans)], strict=True)
    ]


def cut(texts: Sequence[str], size: int | None, tokenizer: str, root: str = ".") -> list[list[str]]:
    """Each text's windows (`size` None: the text whole)."""
    if size is None:
        return [[t] for t in texts]
    spans = token_spans(tokenizer, root)(texts)
    return [windows(t, s, size) for t, s in zip(texts, spans, strict=True)]
