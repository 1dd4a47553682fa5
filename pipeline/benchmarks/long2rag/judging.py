"""Long²RAG KPR judges: does an answer entail a key point? ("yes" / "no" / "neutral").

Providers:
- `openai`: an LLM with the project's prompt, one call per (key point, answer) (`mode:
  per_insight`, the paper's protocol) or all key points of an answer in one call (`batched`).
  Answers are parsed strictly; an unusable answer gets one repair call, then the verdict is
  recorded `invalid` (left out of KPR and counted), never scored 0.
- `local`: the project's local judge (pipeline/judges/local.py, `LocalJudge.judge_many`), adapted
  from coverage to entailment: the key point plays the "insight", the answer's sentences the
  "bullets"; FULL_COVERAGE -> "yes", PARTIAL_COVERAGE -> "neutral", NO_COVERAGE -> "no" (so
  `long2rag.scoring.neutral` decides what partial coverage is worth).
- `long2rag-overlap`: `OverlapCoverage`, a transparent lexical judge with the same `judge_many`
  interface (no model): a key point's coverage is decided by the answer sentence holding the
  largest share of its content words (BM25 tokenisation, stopwords removed): share >= `full`
  -> FULL, >= `partial` -> PARTIAL, else NO. A baseline for offline runs, not a substitute for a
  model judge.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.benchmarks.long2rag.generation import sentences
from pipeline.benchmarks.long2rag.schema import Question
from pipeline.benchmarks.long2rag.scoring import LABELS
from pipeline.benchmarks.summhay.judging import ParseError, _load_object
from pipeline.llm.client import ChatRequest
from pipeline.prompts import Prompt
from pipeline.records import Generation, Verdict

COVERAGE_TO_ENTAILMENT = {
    "FULL_COVERAGE": "yes",
    "PARTIAL_COVERAGE": "neutral",
    "NO_COVERAGE": "no",
}


# ---------------------------------------------------------------- the coverage-judge interface


class CoverageVerdictLike(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def bullet(self) -> int | None: ...


class CoverageJudge(Protocol):
    """What the local judge offers (pipeline/judges/local.py): for each case (insight texts,
    bullet texts), one verdict per insight with a coverage label and the 1-based bullet."""

    def judge_many(
        self, cases: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> Sequence[Sequence[CoverageVerdictLike]]: ...


_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def answer_units(answer: str) -> list[str]:
    """The answer's sentences (list markers removed): the 'bullets' a coverage judge sees."""
    return [_MARKER.sub("", s) for s in sentences(answer) if _MARKER.sub("", s).strip()]


def entailment_verdicts(
    judge: CoverageJudge,
    cases: Sequence[tuple[Sequence[tuple[str, str]], str]],
) -> list[list[Verdict]]:
    """Run a coverage judge as an entailment judge.

    cases: [([(kp_id, key point text), ...], answer text), ...] -> one Verdict per key point,
    label yes/no/neutral, link = the answer sentence (1-based) it was matched to, if any.
    """
    batch = [([t for _, t in kps], answer_units(answer)) for kps, answer in cases]
    out = judge.judge_many(batch)
    if len(out) != len(cases):
        raise ValueError(f"the judge answered {len(out)} cases for {len(cases)}")
    verdicts = []
    for (kps, _), vs in zip(cases, out, strict=True):
        if len(vs) != len(kps):
            raise ValueError(f"the judge gave {len(vs)} verdicts for {len(kps)} key points")
        row = []
        for (kp_id, _), v in zip(kps, vs, strict=True):
            if v.label not in COVERAGE_TO_ENTAILMENT:
                raise ValueError(f"unknown coverage label {v.label!r}")
            row.append(
                Verdict(
                    target_id=kp_id,
                    label=COVERAGE_TO_ENTAILMENT[v.label],
                    link=v.bullet,
                    raw=v.label,
                )
            )
        verdicts.append(row)
    return verdicts


@dataclass(frozen=True)
class CoverageVerdict:
    label: str
    bullet: int | None
    proba: tuple[float, float, float]


@dataclass(frozen=True)
class OverlapCoverage:
    """The lexical coverage judge (provider long2rag-overlap); see the module docstring."""

    full: float = 0.6
    partial: float = 0.3

    @property
    def sha(self) -> str:
        return f"overlap-v1-full{self.full}-partial{self.partial}"

    def judge_many(
        self, cases: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> list[list[CoverageVerdict]]:
        from pipeline.retrieval.bm25 import tokenize

        out = []
        for insights, bullets in cases:
            btoks = [set(tokenize(b)) for b in bullets]
            row = []
            for ins in insights:
                words = set(tokenize(ins))
                best, share = None, 0.0
                for k, bt in enumerate(btoks, start=1):
                    s = len(words & bt) / len(words) if words else 0.0
                    if s > share:
                        best, share = k, s
                if share >= self.full:
                    label = "FULL_COVERAGE"
                elif share >= self.partial:
                    label = "PARTIAL_COVERAGE"
                else:
                    label, best = "NO_COVERAGE", None
                row.append(CoverageVerdict(label, best, (1.0 - share, 0.0, share)))
            out.append(row)
        return out


# ---------------------------------------------------------------- LLM judge


def parse_label(value: Any) -> str:
    if not isinstance(value, str):
        raise ParseError(f'"verdict" must be one of {", ".join(LABELS)}, got {json.dumps(value)}')
    label = value.strip().strip("[]").strip().lower()
    if label not in LABELS:
        raise ParseError(f'"verdict" must be one of {", ".join(LABELS)}, got {json.dumps(value)}')
    return label


def parse_single(text: str | None) -> str:
    return parse_label(_load_object(text).get("verdict"))


def parse_batch(text: str | None, ids: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels by key-point id, problems by id); a whole-answer problem is reported for all."""
    try:
        obj = _load_object(text)
        items = obj.get("verdicts")
        if not isinstance(items, list):
            raise ParseError('the object has no "verdicts" list')
    except ParseError as e:
        return {}, {i: str(e) for i in ids}
    seen: dict[str, list[Any]] = {}
    for it in items:
        if isinstance(it, dict) and str(it.get("claim_id")) in ids:
            seen.setdefault(str(it.get("claim_id")), []).append(it.get("verdict"))
    good, bad = {}, {}
    for i in ids:
        found = seen.get(i, [])
        if len(found) != 1:
            bad[i] = f"claim {i!r} has {len(found)} verdicts, expected exactly one"
            continue
        try:
            good[i] = parse_label(found[0])
        except ParseError as e:
            bad[i] = f"claim {i!r}: {e}"
    return good, bad


def first_requests(
    gen: Generation,
    q: Question,
    mode: str,
    prompt: Prompt,
    sha: str,
    fmt: dict[str, Any] | None,
) -> list[tuple[str | None, ChatRequest]]:
    answer = gen.text or ""
    gid = gen.generation_id
    msg = [{"role": "user", "content": ""}]
    if mode == "batched":
        claims = json.dumps(
            [{"claim_id": k.kp_id, "text": k.text} for k in q.key_points], ensure_ascii=False
        )
        msg = [{"role": "user", "content": prompt.render(answer=answer, claims=claims)}]
        return [(None, ChatRequest(gid, msg, sha, 0, None, fmt))]
    out: list[tuple[str | None, ChatRequest]] = []
    for k in q.key_points:
        msg = [{"role": "user", "content": prompt.render(answer=answer, claim=k.text)}]
        out.append((k.kp_id, ChatRequest(f"{gid}#{k.kp_id}", msg, sha, 0, None, fmt)))
    return out
