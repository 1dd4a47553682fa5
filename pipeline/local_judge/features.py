"""Features of the local coverage judge: pure functions of texts and their embeddings.

One row per (reference unit, candidate): a reference unit is a SummHay insight (or a Long2RAG
key point), the candidate is a list of bullets (or answer sentences). The features compare the
unit with each bullet and summarise over the bullets:

- the cosine similarity of the unit with the most similar bullet, the runner-up, their gap, and
  with the mean of all bullets;
- lexical overlap of content words: the share of the unit's words found in the most similar
  bullet, the best such share over all bullets, and over the whole candidate; Jaccard with the
  most similar bullet;
- numbers: the share of the unit's numbers that appear anywhere in the candidate (insights are
  often distinguished by a figure), and whether the unit has any;
- sizes: log word counts of the unit and of the most similar bullet, and the log bullet count.

Citations ([3], [3, 7]) and markdown markers are stripped before anything is compared.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.retrieval.bm25 import tokenize

CITATION_RE = re.compile(r"\[[\d,\s]+\]")
MARKER_RE = re.compile(r"^\s*(?:[*\-\u2022]+|#+|\d+[.)])\s+")
EMPHASIS_RE = re.compile(r"\*\*|__|`")
NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")

FEATURE_NAMES = (
    "sim_top1",
    "sim_top2",
    "sim_gap",
    "sim_mean_bullet",
    "sim_centroid",
    "recall_top1",
    "recall_best",
    "recall_all",
    "jaccard_top1",
    "numbers_found",
    "has_numbers",
    "log_unit_words",
    "log_top1_words",
    "log_n_bullets",
)

Array = npt.NDArray[np.float32]


def clean_text(text: str) -> str:
    """The text that is embedded and compared: no citations, list markers or emphasis."""
    text = CITATION_RE.sub(" ", text)
    text = MARKER_RE.sub("", text)
    text = EMPHASIS_RE.sub("", text)
    return " ".join(text.split())


def content_words(text: str) -> set[str]:
    return set(tokenize(text, stopwords=True))


def numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in NUMBER_RE.findall(CITATION_RE.sub(" ", text))}


def _share(part: set[str], whole: set[str]) -> float:
    return len(part & whole) / len(part) if part else 0.0


@dataclass(frozen=True)
class Row:
    """The features of one unit against one candidate, and the index of its nearest bullet."""

    values: tuple[float, ...]
    top: int | None  # 0-based index of the most similar bullet; None when there are none


def unit_rows(
    units: Sequence[str],
    bullets: Sequence[str],
    unit_vecs: Array,
    bullet_vecs: Array,
) -> list[Row]:
    """Feature rows for each unit of `units` against the candidate `bullets`.

    Texts are the cleaned texts (see :func:`clean_text`); vectors are their embeddings."""
    n = len(bullets)
    if n == 0:
        return [
            Row(
                values=(0.0,) * 10
                + (float(bool(numbers(u))), math.log1p(len(u.split())), 0.0, 0.0),
                top=None,
            )
            for u in units
        ]
    sims = unit_vecs @ bullet_vecs.T  # (units, bullets)
    centroid = bullet_vecs.mean(axis=0)
    norm = float(np.linalg.norm(centroid))
    cent_sims = unit_vecs @ (centroid / norm) if norm > 0 else np.zeros(len(units))
    bullet_words = [content_words(b) for b in bullets]
    all_words = set().union(*bullet_words)
    all_numbers = set().union(*(numbers(b) for b in bullets))
    rows = []
    for i, unit in enumerate(units):
        s = sims[i]
        order = np.argsort(-s, kind="stable")
        top = int(order[0])
        s1 = float(s[top])
        s2 = float(s[order[1]]) if n > 1 else s1
        words = content_words(unit)
        nums = numbers(unit)
        top_words = bullet_words[top]
        union = words | top_words
        rows.append(
            Row(
                values=(
                    s1,
                    s2,
                    s1 - s2,
                    float(s.mean()),
                    float(cent_sims[i]),
                    _share(words, top_words),
                    max(_share(words, bw) for bw in bullet_words),
                    _share(words, all_words),
                    len(words & top_words) / len(union) if union else 0.0,
                    _share(nums, all_numbers) if nums else 0.0,
                    float(bool(nums)),
                    math.log1p(len(unit.split())),
                    math.log1p(len(bullets[top].split())),
                    math.log(n),
                ),
                top=top,
            )
        )
    return rows
