"""Key-point construction with an LLM, for questions that come with documents but no key points.

The paper's pipeline (§3.3), with the project's own prompts (prompts/long2rag/):

1. (optional, `construction.decompose`) question decomposition: the sub-queries a user would search
   for to retrieve documents; stored in `sub_questions`, not used further here.
2. Extraction, per document, in `construction.rounds` rounds: every round shows the document and the
   points already found in it and asks only for what they miss. A document whose round brings
   nothing new stops early.
3. Aggregation, per question: all extracted points (numbered, with their document) are merged
   and de-duplicated; the answer lists, for every merged point, the numbers it covers, and each
   original point must land in exactly one merged point. A broken answer gets one repair call
   naming the problem; if that fails too, `construction.on_check_failure` decides: `error` (the
   question fails, the stage exits 3 after writing nothing) or `unmerged` (its points are kept
   as extracted, exact duplicates removed).
4. (optional, `construction.filter`) every merged point gets a score in [0, 1] (the model's stated
   probability that it is a key point; the paper uses P(YES) from a local model's logits, which
   a chat endpoint does not give) and is kept when score >= `construction.threshold` (0.7).

Every call goes through the `Asker` the stage layer hands in (the model layer's response cache and
the stage's journal, the judge loop's one repair), so a re-run or a resume after a crash sends no
call twice. Parsing is strict (one JSON object of the asked shape).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.benchmarks.long2rag.params import Long2ragConstruct
from pipeline.benchmarks.long2rag.schema import KeyPoint, Question
from pipeline.core.benchmark import Ask, Asker, single
from pipeline.core.parse import ParseError, load_object, string_list, unit_score
from pipeline.core.prompts import Prompt
from pipeline.core.types import ChatRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompts:
    decompose: Prompt
    extract: Prompt
    aggregate: Prompt
    filter: Prompt
    repair: Prompt


# ---------------------------------------------------------------- parsers (pure)


parse_string_list = string_list
parse_score = unit_score


def parse_aggregation(text: str | None, n_points: int) -> list[tuple[str, list[int]]]:
    """Merged points with the original point numbers (1-based) each covers.

    Raises ParseError unless every number 1..n_points is in exactly one merged point.
    """
    obj = load_object(text)
    items = obj.get("key_points")
    if not isinstance(items, list) or not items:
        raise ParseError('the object needs a non-empty "key_points" list')
    merged: list[tuple[str, list[int]]] = []
    for k, it in enumerate(items, start=1):
        if not isinstance(it, dict):
            raise ParseError(f"key_points[{k}] is not an object")
        txt = it.get("text")
        src = it.get("sources")
        if not isinstance(txt, str) or not txt.strip():
            raise ParseError(f'key_points[{k}] needs a non-empty "text"')
        if (
            not isinstance(src, list)
            or not src
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in src)
        ):
            raise ParseError(f'key_points[{k}] needs "sources", a non-empty list of point numbers')
        merged.append((txt.strip(), list(src)))
    check_exactly_once([s for _, s in merged], n_points)
    return merged


def check_exactly_once(groups: Sequence[Sequence[int]], n_points: int) -> None:
    """Each of 1..n_points in exactly one group, and nothing else; ParseError naming the faults."""
    count: dict[int, int] = {}
    for g in groups:
        for s in set(g):
            count[s] = count.get(s, 0) + 1
    unknown = sorted(s for s in count if not 1 <= s <= n_points)
    missing = [i for i in range(1, n_points + 1) if i not in count]
    twice = sorted(s for s, c in count.items() if c > 1 and 1 <= s <= n_points)
    problems = []
    if unknown:
        problems.append(f"no point has the number(s) {unknown} (points are 1..{n_points})")
    if missing:
        problems.append(f"point(s) {missing} are in no merged point")
    if twice:
        problems.append(f"point(s) {twice} are in more than one merged point")
    if problems:
        raise ParseError("; ".join(problems) + "; every point must be in exactly one")


def _parse_aggregation_of(n_points: int, text: str | None) -> list[tuple[str, list[int]]]:
    return parse_aggregation(text, n_points)


# ---------------------------------------------------------------- one batch of questions


@dataclass
class _Ask:
    key: str
    content: str
    prompt: Prompt
    parse: Callable[[str | None], Any]


class Failure(str):
    """Why an ask has no value (a request that failed, or an answer unusable after a repair)."""


@dataclass(frozen=True)
class Llm:
    """The model construction asks, through the stage layer's `Asker` (the judge loop: cache,
    journal, one repair with the `repair` prompt)."""

    ask: Asker
    repair: Prompt
    json_mode: bool = True

    def send(self, asks: Sequence[_Ask], step: str) -> dict[str, Any]:
        """Parsed answer by key, or a `Failure` for the keys that stayed unusable."""
        if not asks:
            return {}
        fmt = {"type": "json_object"} if self.json_mode else None
        requests = [
            Ask(
                ChatRequest(
                    a.key,
                    [{"role": "user", "content": a.content}],
                    a.prompt.sha + self.repair.sha,
                    0,
                    None,
                    fmt,
                ),
                single(a.parse),
                repair=self.repair,
            )
            for a in asks
        ]
        answers = self.ask(requests, step)
        return {
            a.key: ans.value if ans.ok else Failure(ans.failure)
            for a, ans in zip(asks, answers, strict=True)
        }


def _failed(v: Any) -> bool:
    return isinstance(v, Failure)


# ---------------------------------------------------------------- the pipeline


@dataclass
class _State:
    q: Question
    found: dict[str, list[str]] = field(default_factory=dict)  # doc_id -> points in order
    error: str | None = None


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def construct_key_points(
    questions: Sequence[Question],
    cfg: Long2ragConstruct,
    prompts: Prompts,
    llm: Llm,
    llm_name: str,
) -> tuple[list[Question], list[tuple[str, str]]]:
    """(questions with key points built where they had none, [(item_id, error)] of failures).

    Questions that already have key points pass through unchanged (bar decomposition).
    """
    states = [_State(q) for q in questions]

    if cfg.decompose:
        asks = [
            _Ask(
                f"{s.q.item_id}#decompose",
                prompts.decompose.render(question=s.q.question),
                prompts.decompose,
                lambda t: parse_string_list(t, "sub_questions"),
            )
            for s in states
            if not s.q.sub_questions
        ]
        got = llm.send(asks, "decompose")
        for s in states:
            v = got.get(f"{s.q.item_id}#decompose")
            if v is None:
                continue
            if _failed(v):
                s.error = f"decomposition: {v}"
            else:
                s.q = s.q.model_copy(update={"sub_questions": v})

    todo = [s for s in states if not s.q.key_points and s.error is None]
    active = {(s.q.item_id, d.doc_id) for s in todo for d in s.q.documents}
    for s in todo:
        s.found = {d.doc_id: [] for d in s.q.documents}
    by_id = {s.q.item_id: s for s in todo}
    for rnd in range(1, cfg.rounds + 1):
        asks = []
        for s in todo:
            for d in s.q.documents:
                if (s.q.item_id, d.doc_id) not in active or s.error:
                    continue
                found = s.found[d.doc_id]
                asks.append(
                    _Ask(
                        f"{s.q.item_id}#extract#{d.doc_id}#r{rnd}",
                        prompts.extract.render(
                            question=s.q.question,
                            doc_id=d.doc_id,
                            document=(f"Title: {d.title}\n" if d.title else "") + d.text,
                            found="\n".join(f"- {p}" for p in found) if found else "(none yet)",
                        ),
                        prompts.extract,
                        lambda t: parse_string_list(t, "points"),
                    )
                )
        got = llm.send(asks, f"extract round {rnd}")
        for a in asks:
            item, _, doc_id, _ = a.key.split("#")
            s = by_id[item]
            v = got[a.key]
            if _failed(v):
                s.error = f"extraction ({doc_id}, round {rnd}): {v}"
                continue
            seen = {_norm(p) for p in s.found[doc_id]}
            new = []
            for p in v:
                if _norm(p) not in seen:
                    seen.add(_norm(p))
                    new.append(p)
            s.found[doc_id].extend(new)
            if not new:
                active.discard((item, doc_id))
        if not any(
            k in active for k in ((s.q.item_id, d.doc_id) for s in todo for d in s.q.documents)
        ):
            break

    # aggregation
    numbered: dict[str, list[tuple[str, str]]] = {}  # item -> [(doc_id, text)], number = index+1
    asks = []
    for s in todo:
        if s.error:
            continue
        pts = [(doc, p) for doc, ps in s.found.items() for p in ps]
        numbered[s.q.item_id] = pts
        if not pts:
            continue
        listing = json.dumps(
            [{"number": i, "doc_id": doc, "text": p} for i, (doc, p) in enumerate(pts, start=1)],
            ensure_ascii=False,
        )
        n = len(pts)
        asks.append(
            _Ask(
                f"{s.q.item_id}#aggregate",
                prompts.aggregate.render(question=s.q.question, points=listing),
                prompts.aggregate,
                functools.partial(_parse_aggregation_of, n),
            )
        )
    got = llm.send(asks, "aggregate")
    merged: dict[str, list[KeyPoint]] = {}
    for s in todo:
        if s.error:
            continue
        item = s.q.item_id
        pts = numbered[item]
        v = got.get(f"{item}#aggregate", [])
        if _failed(v):
            if cfg.on_check_failure == "error":
                s.error = f"aggregation: {v}"
                continue
            log.warning("%s: aggregation failed (%s); keeping its points unmerged", item, v)
            first: dict[str, int] = {}
            for i, (_, p) in enumerate(pts, start=1):
                first.setdefault(_norm(p), i)
            v = [(pts[i - 1][1], [i]) for i in sorted(first.values())]
        kps = []
        for k, (text, sources) in enumerate(v, start=1):
            docs = []
            for i in sorted(sources):
                if pts[i - 1][0] not in docs:
                    docs.append(pts[i - 1][0])
            kps.append(KeyPoint(kp_id=f"kp{k}", text=text, doc_id=docs[0], support=docs))
        merged[item] = kps

    n_merged = {item: len(kps) for item, kps in merged.items()}

    # filter
    if cfg.filter:
        asks = [
            _Ask(
                f"{item}#filter#{kp.kp_id}",
                prompts.filter.render(question=by_id[item].q.question, point=kp.text),
                prompts.filter,
                parse_score,
            )
            for item, kps in merged.items()
            for kp in kps
        ]
        got = llm.send(asks, "filter")
        for item, kps in list(merged.items()):
            kept = []
            for kp in kps:
                v = got[f"{item}#filter#{kp.kp_id}"]
                if _failed(v):
                    by_id[item].error = f"filter ({kp.kp_id}): {v}"
                    break
                if v >= cfg.threshold:
                    kept.append(kp.model_copy(update={"score": v}))
            merged[item] = kept

    out: list[Question] = []
    failures: list[tuple[str, str]] = []
    for s in states:
        if s.error:
            failures.append((s.q.item_id, s.error))
            continue
        if s.q.item_id in merged:
            n_extracted = len(numbered.get(s.q.item_id, []))
            meta = {
                **s.q.meta,
                "constructed_by": llm_name,
                "extracted_points": n_extracted,
                "merged_points": n_merged.get(s.q.item_id, 0),
                "kept_points": len(merged[s.q.item_id]),
            }
            s.q = s.q.model_copy(update={"key_points": merged[s.q.item_id], "meta": meta})
            s.q = Question.model_validate(s.q.model_dump())  # re-check doc ids
        out.append(s.q)
    return out, failures
