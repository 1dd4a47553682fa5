"""CRUX data from your own documents and reference answers, built with an LLM (paper §3.2).

Input: a JSONL file, one line per query: `{"id": ..., "reference": <a reference answer>,
"documents": [<text>, ...], "domain": <optional>}`. Steps, each through the `Asker` the stage
layer hands in (cache, journal, one repair):

1. each document is decontextualised into standalone passages of about 200 words
   (`{"passages": [...]}`);
2. from the reference answer: the report request, the query (`{"query": ...}`), and
   `construction.n_questions` sub-questions (`{"questions": [...]}`);
3. every (passage, sub-question) pair is rated 0-5 (`{"rating": n}`, the rating prompt);
4. sub-questions that no passage answers (rating >= eta) are dropped, and Z* is the greedy cover.

A query whose steps fail after the repair is reported as failed (the others are written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.benchmarks.crux import schema
from pipeline.benchmarks.crux.judging import parse_rating
from pipeline.benchmarks.crux.metrics import answerable, greedy_cover
from pipeline.benchmarks.crux.schema import Collection, Passage, Query, SubQuestion
from pipeline.core.benchmark import Answer, Ask, Asker, single
from pipeline.core.errors import DataError
from pipeline.core.parse import string_list, text_field
from pipeline.core.prompts import Prompt
from pipeline.core.types import ChatRequest

SOURCE = "constructed"


@dataclass(frozen=True)
class Source:
    item_id: str
    reference: str
    documents: list[str]
    domain: str
    where: str


def sources(lines: Sequence[tuple[str, Any]]) -> list[Source]:
    out, seen = [], set()
    for where, raw in lines:
        ident = schema.ident(raw, where)
        if ident in seen:
            raise DataError("id used twice", file=where, item=ident, field="id")
        seen.add(ident)
        ref = raw.get("reference")
        docs = raw.get("documents")
        if not isinstance(ref, str) or not ref.strip():
            raise DataError("missing or empty", file=where, item=ident, field="reference")
        if (
            not isinstance(docs, list)
            or not docs
            or not all(isinstance(d, str) and d.strip() for d in docs)
        ):
            raise DataError("a non-empty list of texts", file=where, item=ident, field="documents")
        out.append(
            Source(
                ident,
                ref.strip(),
                [d.strip() for d in docs],
                str(raw.get("domain") or "custom"),
                where,
            )
        )
    if not out:
        raise DataError("no queries in the file")
    return out


@dataclass(frozen=True)
class Prompts:
    passages: Prompt
    query: Prompt
    questions: Prompt
    rate: Prompt
    repair: Prompt


def _ask(
    key: str, prompt: Prompt, repair: Prompt, json_mode: bool, parse: Any, **values: str
) -> Ask:
    fmt = {"type": "json_object"} if json_mode else None
    content = prompt.render(**values)
    messages = [{"role": "user", "content": content}]
    req = ChatRequest(key, messages, prompt.sha + repair.sha, 0, None, fmt)
    return Ask(req, single(parse), repair=repair)


def _passages(text: str | None) -> list[str]:
    return string_list(text, "passages")


def _query(text: str | None) -> str:
    return text_field(text, "query")


def _questions(text: str | None) -> list[str]:
    return string_list(text, "questions")


def construct(
    srcs: Sequence[Source],
    prompts: Prompts,
    ask: Asker,
    *,
    n_questions: int,
    eta: int,
    json_mode: bool,
    tokens: Any,
) -> tuple[list[Collection], list[tuple[str, str]]]:
    """(one collection per query, [(query id, why it failed)]). `tokens` counts a text's
    cl100k tokens."""
    failures: dict[str, str] = {}
    r = prompts.repair

    def failed(item: str, step: str, answer: Answer) -> None:
        failures.setdefault(item, f"{step}: {answer.failure}")

    # 1. passages
    doc_asks = [
        (s.item_id, d, _ask(f"{s.item_id}#passages#{d}", prompts.passages, r, json_mode,
                            _passages, document=text))
        for s in srcs
        for d, text in enumerate(s.documents)
    ]  # fmt: skip
    passages: dict[str, list[tuple[str, str]]] = {s.item_id: [] for s in srcs}
    for (item, d, _), ans in zip(doc_asks, ask([a for *_, a in doc_asks], "passages"), strict=True):
        if not ans.ok:
            failed(item, f"passages of document {d}", ans)
            continue
        for n, text in enumerate(ans.value):
            passages[item].append((f"{item}:{d}#{n}", text))
    # 2. query and sub-questions
    live = [s for s in srcs if s.item_id not in failures]
    q_asks = [
        _ask(f"{s.item_id}#query", prompts.query, r, json_mode, _query, reference=s.reference)
        for s in live
    ]
    sq_asks = [
        _ask(f"{s.item_id}#questions", prompts.questions, r, json_mode, _questions,
             reference=s.reference, n=str(n_questions))
        for s in live
    ]  # fmt: skip
    queries: dict[str, str] = {}
    questions: dict[str, list[str]] = {}
    for s, qa, sa in zip(live, ask(q_asks, "query"), ask(sq_asks, "questions"), strict=True):
        if not qa.ok:
            failed(s.item_id, "query", qa)
        elif not sa.ok or not sa.value:
            failed(s.item_id, "sub-questions", sa)
        else:
            queries[s.item_id], questions[s.item_id] = qa.value, sa.value
    # 3. ratings
    live = [s for s in live if s.item_id not in failures]
    rate_asks = [
        (s.item_id, pid, i, _ask(f"{s.item_id}#{pid}#q{i + 1}", prompts.rate, r, json_mode,
                                 parse_rating, question=question, passage=text))
        for s in live
        for pid, text in passages[s.item_id]
        for i, question in enumerate(questions[s.item_id])
    ]  # fmt: skip
    grid: dict[str, dict[str, list[int]]] = {
        s.item_id: {pid: [0] * len(questions[s.item_id]) for pid, _ in passages[s.item_id]}
        for s in live
    }
    for (item, pid, i, _), ans in zip(
        rate_asks, ask([a for *_, a in rate_asks], "ratings"), strict=True
    ):
        if not ans.ok:
            failed(item, f"rating of {pid} for sub-question {i + 1}", ans)
            continue
        grid[item][pid][i] = int(ans.value)
    # 4. keep what some passage answers; Z*
    out = []
    for s in live:
        if s.item_id in failures:
            continue
        qs = questions[s.item_id]
        full = grid[s.item_id]
        keep = answerable(full, len(qs), eta)
        ratings = {
            p: [row[i] for i in keep] for p, row in full.items() if any(row[i] >= eta for i in keep)
        }
        pids = [p for p, _ in passages[s.item_id]]
        query = Query(
            item_id=s.item_id,
            query=queries[s.item_id],
            domain=s.domain,
            subquestions=[SubQuestion(qid=f"q{i + 1}", text=qs[i]) for i in keep],
            dropped=[
                SubQuestion(qid=f"q{i + 1}", text=qs[i]) for i in range(len(qs)) if i not in keep
            ],
            ratings=ratings,
            zstar=greedy_cover(ratings, pids, eta),
            reference=s.reference,
            meta={"constructed_from": s.where, "documents": len(s.documents)},
        )
        out.append(
            Collection(
                collection_id=s.item_id,
                domain=s.domain,
                source=SOURCE,
                passages=[Passage(pid=p, text=t, tokens=tokens(t)) for p, t in passages[s.item_id]],
                queries=[query],
            )
        )
    return out, sorted(failures.items())
