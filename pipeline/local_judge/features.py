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
- sizes: log word counts of the unit and of the most similar bullet, and the log bullet count;
- alignment (ALIGN_NAMES): how much of the nearest bullet is in the unit (the other direction
  of the overlap), overlap of crude stems (first 5 letters) and of word bigrams, the best
  coverage by the union of two of the four nearest bullets, numbers found in the nearest bullet
  and log count of numbers found nowhere, named entities (capitalised spans not at a sentence
  start) found anywhere / in the nearest bullet, a negation present on one side only, the mean
  of the top-3 similarities, their spread, the share of bullets above 0.5, and two length
  interactions (similarity and recall times log unit length);
- contrast (CONTRAST_NAMES), what sets the unit apart from the other units of its case (a
  summary's other insights, an answer's other key points): the share of its words in no other
  unit and how many of those are in its nearest bullet / anywhere, whether its nearest bullet is
  nearer to it than to every other unit and by what margin, and its best similarity as a
  z-score among the case's unit-bullet similarities. Insights of one subtopic share its topic's
  words, so plain overlap mistakes "same topic" for "covered"; these see the difference.

Only dot products of the vectors are used, so any sentence encoder fits.
Citations ([3], [3, 7]) and markdown markers are stripped before anything is compared.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Hashable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.retrieval.bm25 import tokenize

CITATION_RE = re.compile(r"\[[\d,\s]+\]")
MARKER_RE = re.compile(r"^\s*(?:[*\-\u2022]+|#+|\d+[.)])\s+")
EMPHASIS_RE = re.compile(r"\*\*|__|`")
NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")

BASE_NAMES = (
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


def _share(part: AbstractSet[Hashable], whole: AbstractSet[Hashable]) -> float:
    return len(part & whole) / len(part) if part else 0.0


@dataclass(frozen=True)
class Row:
    """The features of one unit against one candidate, and the index of its nearest bullet."""

    values: tuple[float, ...]
    top: int | None  # 0-based index of the most similar bullet; None when there are none


def base_rows(
    units: Sequence[str],
    bullets: Sequence[str],
    unit_vecs: Array,
    bullet_vecs: Array,
) -> list[Row]:
    """The BASE_NAMES features of each unit of `units` against the candidate `bullets`.

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


# ---------------------------------------------------------------- alignment

ENTITY_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][\w'\-]*(?:\s+[A-Z][\w'\-]*)*)")
NEGATION = frozenset(
    (
        "not",
        "no",
        "never",
        "none",
        "nor",
        "neither",
        "without",
        "cannot",
        "lack",
        "lacks",
        "lacking",
        "fail",
        "fails",
        "failed",
    )
)
STEM = 5  # crude stemming: a word's first letters (covers plural, tense, -ing/-tion variants)

ALIGN_NAMES = (
    "prec_top1",
    "recall_top1_stem",
    "recall_all_stem",
    "recall_best2",
    "bigram_top1",
    "bigram_all",
    "numbers_top1",
    "log_numbers_missing",
    "entities_found",
    "entities_top1",
    "has_entities",
    "negation_mismatch",
    "sim_top3_mean",
    "sim_std",
    "share_sim_above_half",
    "sim_x_len",
    "recall_x_len",
)


def stems(words: set[str]) -> set[str]:
    return {w[:STEM] for w in words}


def bigrams(text: str) -> set[tuple[str, str]]:
    toks = tokenize(text, stopwords=True)
    return set(itertools.pairwise(toks))


def entities(text: str) -> set[str]:
    """Capitalised spans not at a sentence start, lower-cased (names, places, products)."""
    return {m.lower() for m in ENTITY_RE.findall(text) if m.lower() not in NEGATION}


NEGATION_RE = re.compile(r"\b(?:" + "|".join(sorted(NEGATION)) + r")\b|n['\u2019]t\b")


def negated(text: str) -> bool:
    return NEGATION_RE.search(text.lower()) is not None


def align_values(
    unit: str, bullets: Sequence[str], sims: npt.NDArray[np.floating], base: tuple[float, ...]
) -> tuple[float, ...]:
    """The ALIGN_NAMES features of one unit against its candidate's bullets (sims: its cosine
    similarity to each bullet; base: its BASE_NAMES values)."""
    n = len(bullets)
    log_len = base[BASE_NAMES.index("log_unit_words")]
    if n == 0:
        return (0.0,) * 10 + (float(bool(entities(unit))),) + (0.0,) * 6
    order = np.argsort(-sims, kind="stable")
    top = int(order[0])
    words = content_words(unit)
    bw = [content_words(b) for b in bullets]
    top_words = bw[top]
    ws, bs = stems(words), [stems(b) for b in bw]
    all_stems = set().union(*bs)
    best2 = max(
        (_share(words, bw[int(i)] | bw[int(j)]) for i in order[:4] for j in order[:4] if i < j),
        default=_share(words, top_words),
    )
    ub = bigrams(unit)
    bb = [bigrams(b) for b in bullets]
    nums = numbers(unit)
    all_nums = set().union(*(numbers(b) for b in bullets))
    ents = entities(unit)
    joined = " ".join(bullets).lower()
    top_text = bullets[top].lower()
    top3 = sims[order[:3]]
    recall_top1 = base[BASE_NAMES.index("recall_top1")]
    return (
        _share(top_words, words),
        _share(ws, bs[top]),
        _share(ws, all_stems),
        best2,
        _share(ub, bb[top]),
        _share(ub, set[tuple[str, str]]().union(*bb)),
        _share(nums, numbers(bullets[top])) if nums else 0.0,
        math.log1p(len(nums - all_nums)),
        sum(e in joined for e in ents) / len(ents) if ents else 0.0,
        sum(e in top_text for e in ents) / len(ents) if ents else 0.0,
        float(bool(ents)),
        float(negated(unit) != negated(bullets[top])),
        float(top3.mean()),
        float(sims.std()),
        float((sims > 0.5).mean()),
        float(sims[top]) * log_len,
        recall_top1 * log_len,
    )


def aligned_rows(
    units: Sequence[str],
    bullets: Sequence[str],
    unit_vecs: Array,
    bullet_vecs: Array,
) -> list[Row]:
    """:func:`base_rows` plus the alignment features (BASE_NAMES + ALIGN_NAMES)."""
    base = base_rows(units, bullets, unit_vecs, bullet_vecs)
    sims = unit_vecs @ bullet_vecs.T if bullets else np.zeros((len(units), 0))
    return [
        Row(values=r.values + align_values(u, bullets, sims[i], r.values), top=r.top)
        for i, (u, r) in enumerate(zip(units, base, strict=True))
    ]


# ---------------------------------------------------------------- contrast with the other units

CONTRAST_NAMES = (
    "distinct_share",
    "distinct_top1",
    "distinct_all",
    "top_is_mine",
    "sim_margin_units",
    "sim_z_case",
)
FEATURE_NAMES = BASE_NAMES + ALIGN_NAMES + CONTRAST_NAMES


def contrast_values(
    units: Sequence[str], bullets: Sequence[str], sims: npt.NDArray[np.floating]
) -> list[tuple[float, ...]]:
    """What sets each unit apart from the other units of its case (a summary's other insights,
    an answer's other key points): its own words (in no other unit) found in its nearest bullet
    and anywhere; whether its nearest bullet is nearer to it than to any other unit, by how much;
    its best similarity as a z-score among all unit-bullet similarities of the case."""
    words = [content_words(u) for u in units]
    n = len(bullets)
    out: list[tuple[float, ...]] = []
    flat = sims.ravel() if n else np.zeros(0)
    mu, sd = (float(flat.mean()), float(flat.std())) if flat.size else (0.0, 0.0)
    bw = [content_words(b) for b in bullets]
    all_words = set().union(*bw) if bw else set()
    for i, w in enumerate(words):
        others = set().union(*(words[:i] + words[i + 1 :])) if len(words) > 1 else set()
        own = w - others
        share = len(own) / len(w) if w else 0.0
        if n == 0:
            out.append((share, 0.0, 0.0, 0.0, 0.0, 0.0))
            continue
        top = int(np.argmax(sims[i]))
        col = sims[:, top]
        rest = np.delete(col, i)
        margin = float(col[i] - rest.max()) if rest.size else 0.0
        out.append(
            (
                share,
                _share(own, bw[top]),
                _share(own, all_words),
                float(margin >= 0),
                margin,
                (float(sims[i, top]) - mu) / sd if sd > 1e-6 else 0.0,
            )
        )
    return out


def unit_rows(
    units: Sequence[str],
    bullets: Sequence[str],
    unit_vecs: Array,
    bullet_vecs: Array,
) -> list[Row]:
    """Feature rows (FEATURE_NAMES) for each unit of `units` against the candidate `bullets`:
    :func:`aligned_rows` plus the contrast features.

    Texts are the cleaned texts (see :func:`clean_text`); vectors are their embeddings (any
    encoder: only their dot products are used)."""
    rows = aligned_rows(units, bullets, unit_vecs, bullet_vecs)
    sims = unit_vecs @ bullet_vecs.T if bullets else np.zeros((len(units), 0))
    extra = contrast_values(units, bullets, sims)
    return [Row(values=r.values + e, top=r.top) for r, e in zip(rows, extra, strict=True)]
