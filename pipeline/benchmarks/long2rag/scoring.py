"""Key Point Recall (KPR), pure functions.

For one question q with key points x_1..x_n and an answer y (paper Eq. 1-2):

    recall(q) = |{x_i : y entails x_i}| / n          KPR = mean of recall(q) over the questions

a macro average over questions (not over key points). Verdicts are "yes", "no" or "neutral";
"neutral" counts as not entailed unless `neutral="entailed"` (the paper's judge is three-way and
its metric binary; mapping neutral to 0 is our reading, a parameter).

Exclusions, never a division by zero:
- a question with no key points is excluded and counted in `n_excluded_questions`;
- a verdict the judge could not give (None: unparseable after a repair) is left out of its
  question's denominator and counted in `invalid_verdicts`; a question with key points but no
  usable verdict is excluded and counted in `n_unjudged_questions`.
If every question is excluded, KPR is None (reported as such), not 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

LABELS = ("yes", "no", "neutral")
NEUTRAL_MODES = ("not_entailed", "entailed")


def entailed(label: str, neutral: str = "not_entailed") -> bool:
    if label not in LABELS:
        raise ValueError(f"unknown verdict {label!r}; expected one of {', '.join(LABELS)}")
    if neutral not in NEUTRAL_MODES:
        raise ValueError(f"unknown neutral mode {neutral!r}; expected {NEUTRAL_MODES}")
    return label == "yes" or (label == "neutral" and neutral == "entailed")


@dataclass(frozen=True)
class QuestionVerdicts:
    """One answer's verdicts: one per key point of the question, None where unusable."""

    item_id: str
    labels: tuple[str | None, ...]


def question_recall(labels: Sequence[str | None], neutral: str = "not_entailed") -> float | None:
    """Entailed share of the usable verdicts; None when there is none (excluded, not 0)."""
    usable = [x for x in labels if x is not None]
    if not usable:
        return None
    return sum(1 for x in usable if entailed(x, neutral)) / len(usable)


@dataclass(frozen=True)
class KprResult:
    kpr: float | None
    n_questions: int  # questions that count (in the mean)
    n_key_points: int  # key points with a usable verdict, over those questions
    n_excluded_questions: int  # no key points
    n_unjudged_questions: int  # key points, but no usable verdict
    invalid_verdicts: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kpr(questions: Sequence[QuestionVerdicts], neutral: str = "not_entailed") -> KprResult:
    recalls: list[float] = []
    n_kp = excluded = unjudged = invalid = 0
    for q in questions:
        if not q.labels:
            excluded += 1
            continue
        invalid += sum(1 for x in q.labels if x is None)
        r = question_recall(q.labels, neutral)
        if r is None:
            unjudged += 1
            continue
        recalls.append(r)
        n_kp += sum(1 for x in q.labels if x is not None)
    return KprResult(
        kpr=sum(recalls) / len(recalls) if recalls else None,
        n_questions=len(recalls),
        n_key_points=n_kp,
        n_excluded_questions=excluded,
        n_unjudged_questions=unjudged,
        invalid_verdicts=invalid,
    )


def breakdown(
    questions: Sequence[QuestionVerdicts],
    group_of: Callable[[str], str],
    neutral: str = "not_entailed",
) -> dict[str, KprResult]:
    """KPR over each group's questions (Eq. 2 restricted to the group), groups sorted."""
    groups: dict[str, list[QuestionVerdicts]] = {}
    for q in questions:
        groups.setdefault(group_of(q.item_id), []).append(q)
    return {g: kpr(qs, neutral) for g, qs in sorted(groups.items())}


def length_bucket(n_tokens: int, edges: Sequence[int]) -> str:
    """The input-length bucket of a question by the tokens of its documents.

    >>> [length_bucket(n, [8000, 16000]) for n in (10, 8000, 15999, 16000)]
    ['<8000', '8000-16000', '8000-16000', '>=16000']
    """
    if n_tokens < 0:
        raise ValueError(f"negative token count {n_tokens}")
    lower = None
    for edge in edges:
        if n_tokens < edge:
            return f"<{edge}" if lower is None else f"{lower}-{edge}"
        lower = edge
    return f">={lower}" if lower is not None else "all"


def bucket_order(edges: Sequence[int]) -> list[str]:
    """Bucket labels from the shortest inputs to the longest."""
    if not edges:
        return ["all"]
    labels = [f"<{edges[0]}"]
    labels += [f"{a}-{b}" for a, b in itertools.pairwise(edges)]
    return [*labels, f">={edges[-1]}"]


# ---------------------------------------------------------------- agreement


K = TypeVar("K", bound=Hashable)


def paired_ratings(
    a: Mapping[K, str | None],
    b: Mapping[K, str | None],
    neutral: str | None = None,
) -> list[tuple[str, str]]:
    """The (a, b) labels of the units both raters judged usably, in a's order.

    With `neutral` given, labels are first collapsed to "entailed"/"not_entailed" (the binary
    decision KPR uses); otherwise the three verdicts are compared as they are.
    """
    out = []
    for key, la in a.items():
        lb = b.get(key)
        if la is None or lb is None:
            continue
        if neutral is not None:
            la = "entailed" if entailed(la, neutral) else "not_entailed"
            lb = "entailed" if entailed(lb, neutral) else "not_entailed"
        out.append((la, lb))
    return out
