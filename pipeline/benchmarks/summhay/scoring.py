"""SummHay scoring: pure functions, no I/O.

Per reference insight (paper §4.1):
- Coverage: FULL 100, PARTIAL 50 (configurable), NO 0.
- Citation: for a covered insight, F1 of the document positions cited by the bullet the judge
  linked it to, against the positions of the documents that contain the insight.
- Joint: coverage x citation F1 (0 when not covered).

Two modes:
- ``paper``: the authors' scorer as released. Insight scores are pooled over every subtopic of
  every haystack; a covered insight whose bullet id is not an integer falls on
  ``bullets[-2]`` (the second-to-last bullet), an id of 0 on the last bullet (Python indexing
  of ``bullets[int(id) - 1]`` with -1 for an unparseable id). An id no bullet has leaves the
  insight with no citations (the released scorer would crash); it is counted in `n_bad_links`.
- ``corrected``: a covered insight whose bullet id is not a valid bullet number is an invalid
  judgement: left out of every score and counted in `n_invalid`, like a missing or duplicated
  verdict. Besides the pooled scores it reports per-summary (macro) averages.

In both modes a verdict the judge stage marked invalid (unparseable judge output) is left out
and counted, never scored as zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Literal

from pipeline.core.records import Verdict

Mode = Literal["paper", "corrected"]
CITATION_RE = re.compile(r"\[([\d,\s]+)\]")
COVERED = ("FULL_COVERAGE", "PARTIAL_COVERAGE")


def extract_bullets(text: str) -> list[str]:
    """Split a summary on line breaks; every non-empty line is a bullet (numbered from 1)."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def extract_citations(bullet: str) -> list[int]:
    """Document positions cited as [3], [3, 7] or [3][7]."""
    ids: list[int] = []
    for group in CITATION_RE.findall(bullet):
        ids.extend(int(part) for part in group.split(",") if part.strip())
    return ids


def citation_prf(cited: set[int], gold: set[int]) -> tuple[float, float, float]:
    """Precision, recall and F1 of cited positions against gold positions (0 when undefined)."""
    hit = len(cited & gold)
    p = hit / len(cited) if cited else 0.0
    r = hit / len(gold) if gold else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f1


def count_words(bullet: str) -> int:
    return len(CITATION_RE.sub(" ", bullet).split())


def words_per_bullet(bullets: Sequence[str]) -> float | None:
    if not bullets:
        return None
    return sum(count_words(b) for b in bullets) / len(bullets)


def resolve_link(link: int | str | None, n_bullets: int, mode: Mode) -> int | None:
    """The 0-based index of the bullet a verdict links to, or None when there is none."""
    if mode == "paper":
        try:
            number = int(link)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            number = -1
        index = number - 1
        return index if -n_bullets <= index < n_bullets else None
    if isinstance(link, bool):
        return None
    if isinstance(link, int):
        number = link
    elif isinstance(link, str) and link.strip().isdigit():
        number = int(link.strip())
    else:
        return None
    return number - 1 if 1 <= number <= n_bullets else None


@dataclass(frozen=True)
class InsightScore:
    insight_id: str
    status: Literal["ok", "invalid"]
    coverage: float = 0.0  # 0..1
    covered: bool = False
    precision: float | None = None
    recall: float | None = None
    f1: float | None = None
    bullet_index: int | None = None
    bad_link: bool = False

    @property
    def joint(self) -> float:
        return self.coverage * (self.f1 or 0.0)


def score_summary(
    bullets: Sequence[str],
    verdicts: Sequence[Verdict],
    insight_ids: Sequence[str],
    gold: Mapping[str, Iterable[int]],
    mode: Mode = "paper",
    partial_credit: float = 0.5,
) -> list[InsightScore]:
    """Score one summary against its subtopic's insights.

    `insight_ids` are the subtopic's reference insights; `gold` maps each to the positions of
    the documents that contain it. In paper mode the verdicts are scored as given (one score
    per verdict, as the released scorer iterates them); in corrected mode there is exactly one
    score per reference insight, invalid when its verdict is missing, repeated or unusable.
    """
    unknown = [v.target_id for v in verdicts if v.target_id not in gold]
    if unknown:
        raise ValueError(f"verdict for an insight with no gold entry: {unknown[0]!r}")

    def one(v: Verdict) -> InsightScore:
        if v.status != "ok" or v.label not in (*COVERED, "NO_COVERAGE"):
            return InsightScore(v.target_id, "invalid")
        if v.label == "NO_COVERAGE":
            return InsightScore(v.target_id, "ok")
        cov = 1.0 if v.label == "FULL_COVERAGE" else partial_credit
        idx = resolve_link(v.link, len(bullets), mode)
        if idx is None:
            if mode == "corrected":
                return InsightScore(v.target_id, "invalid")
            return InsightScore(v.target_id, "ok", cov, True, 0.0, 0.0, 0.0, None, bad_link=True)
        p, r, f1 = citation_prf(set(extract_citations(bullets[idx])), set(gold[v.target_id]))
        return InsightScore(v.target_id, "ok", cov, True, p, r, f1, idx % len(bullets))

    if mode == "paper":
        return [one(v) for v in verdicts]

    by_insight: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_insight.setdefault(v.target_id, []).append(v)
    scores = []
    for iid in insight_ids:
        found = by_insight.get(iid, [])
        scores.append(one(found[0]) if len(found) == 1 else InsightScore(iid, "invalid"))
    return scores


@dataclass(frozen=True)
class Pooled:
    coverage: float | None
    citation: float | None
    joint: float | None
    citation_precision: float | None
    citation_recall: float | None
    n_insights: int
    n_covered: int
    n_invalid: int
    n_bad_links: int


def _mean(values: Sequence[float]) -> float | None:
    return 100.0 * fmean(values) if values else None


def pool(scores: Iterable[InsightScore]) -> Pooled:
    """Insight-level means over every scored insight (the paper's table cells), on 0-100.

    Coverage and Joint average over all valid insights; Citation, precision and recall over the
    covered ones. Invalid insights are left out and counted.
    """
    scores = list(scores)
    ok = [s for s in scores if s.status == "ok"]
    covered = [s for s in ok if s.covered]
    return Pooled(
        coverage=_mean([s.coverage for s in ok]),
        citation=_mean([s.f1 or 0.0 for s in covered]),
        joint=_mean([s.joint for s in ok]),
        citation_precision=_mean([s.precision or 0.0 for s in covered]),
        citation_recall=_mean([s.recall or 0.0 for s in covered]),
        n_insights=len(ok),
        n_covered=len(covered),
        n_invalid=len(scores) - len(ok),
        n_bad_links=sum(1 for s in ok if s.bad_link),
    )


@dataclass(frozen=True)
class Macro:
    coverage: float | None
    citation: float | None
    joint: float | None
    n_summaries_citation: int


def macro(per_summary: Iterable[Sequence[InsightScore]]) -> Macro:
    """Per-summary scores, then their mean. A summary with no valid insight is left out; one with
    no covered insight has no Citation and is left out of the Citation mean only."""
    covs, cits, joints = [], [], []
    for scores in per_summary:
        p = pool(scores)
        if p.coverage is None or p.joint is None:
            continue
        covs.append(p.coverage)
        joints.append(p.joint)
        if p.citation is not None:
            cits.append(p.citation)
    return Macro(
        coverage=fmean(covs) if covs else None,
        citation=fmean(cits) if cits else None,
        joint=fmean(joints) if joints else None,
        n_summaries_citation=len(cits),
    )
