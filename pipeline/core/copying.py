"""How much of an answer is copied from its prompt (pure): a base model, or a chat model served
without its chat template, tends to echo its documents instead of answering.

copy_rate(answer, prompt) = the share of the answer's words that lie inside some run of `n`
consecutive answer words that also appears, word for word, in the prompt (words lower-cased,
punctuation dropped). An answer of fewer than `n` words has no rate (None).
"""

from __future__ import annotations

import re
from statistics import median

_WORD = re.compile(r"\w+", re.UNICODE)
N = 6  # a run of six words in a row is rarely shared by chance


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def copy_rate(answer: str, prompt: str, n: int = N) -> float | None:
    a = words(answer)
    if len(a) < n:
        return None
    p = words(prompt)
    seen = {tuple(p[i : i + n]) for i in range(len(p) - n + 1)}
    covered = [False] * len(a)
    for i in range(len(a) - n + 1):
        if tuple(a[i : i + n]) in seen:
            covered[i : i + n] = [True] * n
    return sum(covered) / len(a)


def local_model_traps(
    n_answers: int, n_empty: int, rates: list[float], *, empty_share: float = 0.5,
    copied_median: float = 0.8,
) -> list[str]:  # fmt: skip
    """The warnings a run's answers call for: mostly empty (a GGUF without a chat template makes
    llama.cpp's server fall back to another chat format), or mostly copied from the context (a
    base model, not instruction-tuned)."""
    out = []
    if n_answers and n_empty / n_answers >= empty_share:
        out.append(
            f"{n_empty} of {n_answers} answers are empty: a local model served without its chat"
            " template answers empty strings (llama.cpp's server falls back to another chat"
            " format); check the GGUF's tokenizer.chat_template (README: a local model on a"
            " CPU) or pass the server a --chat_format"
        )
    if rates and median(rates) >= copied_median:
        out.append(
            f"the answers copy their context (median copy rate {median(rates):.2f} over"
            f" {len(rates)} answers): a base model, not instruction-tuned, echoes its"
            " documents; its scores say little about summarising (meta.copy_rate per answer)"
        )
    return out
