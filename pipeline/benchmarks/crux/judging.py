"""CRUX's judges: a graded rating (0-5) of every (passage of a context, sub-question) pair.

- `labels` (provider `crux-labels`): the dataset's ratings, replayed (no model).
- an LLM (`openai`): the project's rating prompt, one call per (passage, sub-question) pair;
  the answer is `{"rating": <0-5>}`, parsed strictly; an unusable answer gets one repair call,
  then the verdict is invalid (counted, never rated 0, unlike the paper's "malformed -> 0").
  A pair's request does not depend on the context it came in, so a passage that several
  retrievers rank is rated once (the judge loop sends a key once).
- `local`: the project's local judge adapted to answerability: one case per (passage,
  sub-question), the sub-question as its unit and, as its bullets, the passage's sentences that
  share the most content words with it (`crux.local_sentences`); FULL coverage rates 5,
  PARTIAL 3, NO 0.

Verdicts are keyed `<passage id>#<sub-question id>`, label = the rating as a string.
"""

from __future__ import annotations

import json
from functools import lru_cache

from pipeline.baselines import split_sentences
from pipeline.benchmarks.crux.schema import QueryView
from pipeline.core.benchmark import (
    CoverageCase,
    CoverageVerdictLike,
    JudgePrompts,
    JudgeTask,
    judge_task,
    label_parser,
)
from pipeline.core.parse import ParseError, load_object
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.retrieval.bm25 import tokenize

FROM_COVERAGE = {"FULL_COVERAGE": 5, "PARTIAL_COVERAGE": 3, "NO_COVERAGE": 0}
LABELS_SHA = "labels"


def target(pid: str, qid: str) -> str:
    return f"{pid}#{qid}"


def split_target(t: str) -> tuple[str, str]:
    pid, _, qid = t.rpartition("#")
    return pid, qid


def ranking(gen: Generation) -> list[str]:
    return [str(p) for p in gen.meta.get("ranking", [])]


def parse_rating(text: str | None) -> str:
    """`{"rating": <a whole number 0-5>}` -> the rating as a string."""
    value = load_object(text).get("rating")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 5:
        raise ParseError(f'"rating" must be a whole number from 0 to 5, got {json.dumps(value)}')
    return str(value)


def rating_task(gen: Generation, view: QueryView, prompts: JudgePrompts) -> JudgeTask:
    """One ask per (passage of the ranking, sub-question)."""
    q = view.query
    texts = {s.qid: s.text for s in q.subquestions}
    units = [target(p, s.qid) for p in ranking(gen) for s in q.subquestions]

    def one(unit: str) -> str:
        pid, qid = split_target(unit)
        return prompts.prompt.render(question=texts[qid], passage=view.passages[pid].text)

    return judge_task(
        gen,
        units,
        prompts,
        one,
        lambda unit: label_parser(unit, parse_rating),
        key=lambda unit: f"{q.item_id}#{unit}",
    )


def labels_judgement(gen: Generation, view: QueryView, judge: str) -> Judgement:
    q = view.query
    verdicts = [
        Verdict(target_id=target(p, s.qid), label=str(q.rating(p, i)))
        for p in ranking(gen)
        for i, s in enumerate(q.subquestions)
    ]
    return Judgement.of("crux", gen, judge, LABELS_SHA, "ok", verdicts)


@lru_cache(maxsize=8192)
def _sentence_words(passage: str) -> tuple[tuple[str, ...], tuple[frozenset[str], ...]]:
    """A passage's sentences and each one's content words, made once per passage: a passage is
    met once per sub-question and per ranking that holds it (32,329 times for 927 passages in
    the default run)."""
    sentences = tuple(split_sentences(passage)) or (passage,)
    return sentences, tuple(frozenset(tokenize(s)) for s in sentences)


def best_sentences(passage: str, unit: str, k: int) -> list[str]:
    """The k sentences of the passage that share the most content words with the unit (ties:
    the earlier), those sharing none left out; the first sentence when none shares any."""
    sentences, sentence_words = _sentence_words(passage)
    words = set(tokenize(unit))
    scored = [(len(words & w), n) for n, w in enumerate(sentence_words)]
    best = sorted((-hits, n) for hits, n in scored if hits > 0)[:k]
    return [sentences[n] for _, n in sorted(best, key=lambda t: t[1])] or [sentences[0]]


def coverage_cases(view: QueryView, gen: Generation, sentences: int) -> list[CoverageCase]:
    """One case per (passage of the ranking, sub-question): the sub-question against the
    passage's `sentences` sentences that share the most content words with it (a whole haystack
    document has about 50; the local judge was trained on summaries of about 10 bullets, and
    embedding every sentence of every ranked document would take minutes on 2 cores)."""
    subs = view.query.subquestions
    return [
        CoverageCase(
            [(target(p, s.qid), s.text)],
            best_sentences(view.passages[p].text, s.text, sentences),
        )
        for p in ranking(gen)
        for s in subs
    ]


def coverage_verdict(t: str, v: CoverageVerdictLike) -> Verdict:
    if v.label not in FROM_COVERAGE:
        raise ValueError(f"unknown coverage label {v.label!r}")
    return Verdict(target_id=t, label=str(FROM_COVERAGE[v.label]), raw=v.label)
