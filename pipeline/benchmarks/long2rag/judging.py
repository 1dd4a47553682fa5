"""Long²RAG KPR judges: does an answer entail a key point? ("yes" / "no" / "neutral").

Providers:
- `openai`: an LLM with the project's prompt, one call per (key point, answer) (`mode:
  per_insight`, the paper's protocol) or all key points of an answer in one call (`batched`).
  Answers are parsed strictly; the stage layer's judge loop gives an unusable answer one repair
  call (the `repair` prompt), then records the verdict `invalid` (left out of KPR and counted),
  never scored 0.
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
from typing import Any

from pipeline.benchmarks.long2rag.generation import sentences
from pipeline.benchmarks.long2rag.schema import Question
from pipeline.benchmarks.long2rag.scoring import LABELS
from pipeline.core.benchmark import Ask, CoverageVerdictLike, JudgeTask, Parsed
from pipeline.core.parse import ParseError, load_object
from pipeline.core.prompts import Prompt, combined_sha
from pipeline.core.records import Generation, Verdict
from pipeline.llm.types import ChatRequest

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


def parse_single(text: str | None) -> str:
    return parse_label(load_object(text).get("verdict"))


def parse_batch(text: str | None, ids: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels by key-point id, problems by id); a whole-answer problem is reported for all."""
    try:
        obj = load_object(text)
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


def _single(target: str) -> Any:
    def parse(text: str | None, targets: Sequence[str]) -> Parsed:
        try:
            label = parse_single(text)
        except ParseError as e:
            return {}, {target: str(e)}
        return {target: Verdict(target_id=target, label=label, raw=(text or "").strip())}, {}

    return parse


def _batch(text: str | None, targets: Sequence[str]) -> Parsed:
    good, bad = parse_batch(text, list(targets))
    raw = (text or "").strip()
    return {t: Verdict(target_id=t, label=label, raw=raw) for t, label in good.items()}, bad


def judge_task(
    gen: Generation,
    q: Question,
    mode: str,
    prompt: Prompt,
    repair: Prompt,
    fmt: dict[str, Any] | None,
) -> JudgeTask:
    """The asks that judge one answer: one per key point (`per_insight`) or one for all."""
    sha = combined_sha(prompt, repair)
    answer = gen.text or ""
    gid = gen.generation_id
    ids = tuple(k.kp_id for k in q.key_points)
    if mode == "batched":
        claims = json.dumps(
            [{"claim_id": k.kp_id, "text": k.text} for k in q.key_points], ensure_ascii=False
        )
        msg = [{"role": "user", "content": prompt.render(answer=answer, claims=claims)}]
        asks: tuple[Ask, ...] = (
            Ask(ChatRequest(gid, msg, sha, 0, None, fmt), _batch, ids, repair),
        )
    else:
        asks = tuple(
            Ask(
                ChatRequest(
                    f"{gid}#{k.kp_id}",
                    [{"role": "user", "content": prompt.render(answer=answer, claim=k.text)}],
                    sha,
                    0,
                    None,
                    fmt,
                ),
                _single(k.kp_id),
                (k.kp_id,),
                repair,
            )
            for k in q.key_points
        )
    return JudgeTask(gen, ids, asks, sha)
