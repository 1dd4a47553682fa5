"""Long²RAG KPR judges: does an answer entail a key point? ("yes" / "no" / "neutral").

Providers:
- `openai`: an LLM with the project's prompt, one call per (key point, answer) (`mode:
  per_insight`, the paper's protocol) or all key points of an answer in one call (`batched`).
  Answers are parsed strictly; the stage layer's judge loop gives an unusable answer one repair
  call (the `repair` prompt), then records the verdict `invalid` (left out of KPR and counted),
  never scored 0.
- `local`: the project's local judge (pipeline/local_judge/model.py, `LocalJudge.judge_many`),
  adapted from coverage to entailment: the key point plays the "insight", the answer's sentences
  the "bullets"; FULL_COVERAGE -> "yes", PARTIAL_COVERAGE -> "neutral", NO_COVERAGE -> "no" (so
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
from typing import Any

from pipeline.benchmarks.long2rag.generation import sentences
from pipeline.benchmarks.long2rag.schema import Question
from pipeline.benchmarks.long2rag.scoring import LABELS
from pipeline.core import benchmark as contract
from pipeline.core.benchmark import (
    CoverageVerdictLike,
    JudgePrompts,
    JudgeTask,
    Parsed,
    Parser,
    label_parser,
)
from pipeline.core.parse import ParseError, load_object, per_target
from pipeline.core.records import Generation, Verdict

COVERAGE_TO_ENTAILMENT = {
    "FULL_COVERAGE": "yes",
    "PARTIAL_COVERAGE": "neutral",
    "NO_COVERAGE": "no",
}


# ---------------------------------------------------------------- coverage judges


_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def answer_units(answer: str) -> list[str]:
    """The answer's sentences (list markers removed): the 'bullets' a coverage judge sees."""
    return [_MARKER.sub("", s) for s in sentences(answer) if _MARKER.sub("", s).strip()]


def entailment_verdict(target: str, v: CoverageVerdictLike) -> Verdict:
    """A coverage verdict as an entailment verdict: FULL -> yes, PARTIAL -> neutral, NO -> no;
    `link` = the answer sentence (1-based) it was matched to, if any."""
    if v.label not in COVERAGE_TO_ENTAILMENT:
        raise ValueError(f"unknown coverage label {v.label!r}")
    return Verdict(
        target_id=target, label=COVERAGE_TO_ENTAILMENT[v.label], link=v.bullet, raw=v.label
    )


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


# The answers' JSON schemas, for judges that ask for structured output with a schema.
_LABEL = {"type": "string", "enum": list(LABELS)}
SCHEMAS: dict[str, dict[str, Any]] = {
    "judge_point": {
        "type": "object",
        "properties": {"verdict": _LABEL},
        "required": ["verdict"],
    },
    "judge_batch": {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"claim_id": {"type": "string"}, "verdict": _LABEL},
                    "required": ["claim_id", "verdict"],
                },
            }
        },
        "required": ["verdicts"],
    },
}


def parse_single(text: str | None) -> str:
    return parse_label(load_object(text).get("verdict"))


def parse_batch(text: str | None, ids: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels by key-point id, problems by id); a whole-answer problem is reported for all."""
    return per_target(text, ids, "claim_id", "claim", lambda it, _: parse_label(it.get("verdict")))


def _batch(text: str | None, targets: Sequence[str]) -> Parsed:
    good, bad = parse_batch(text, list(targets))
    raw = (text or "").strip()
    return {t: Verdict(target_id=t, label=label, raw=raw) for t, label in good.items()}, bad


def judge_task(gen: Generation, q: Question, prompts: JudgePrompts) -> JudgeTask:
    """The asks that judge one answer: one per key point (`per_insight`) or one for all."""
    answer = gen.text or ""
    texts = {k.kp_id: k.text for k in q.key_points}

    def one(kp_id: str) -> str:
        return prompts.prompt.render(answer=answer, claim=texts[kp_id])

    def every() -> str:
        claims = [{"claim_id": k, "text": t} for k, t in texts.items()]
        return prompts.prompt.render(answer=answer, claims=json.dumps(claims, ensure_ascii=False))

    def parse_one(kp_id: str) -> Parser:
        return label_parser(kp_id, parse_single)

    return contract.judge_task(gen, list(texts), prompts, one, parse_one, every, _batch)
