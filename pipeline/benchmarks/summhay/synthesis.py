"""New SummHay haystacks, synthesized through a model (the paper's section 3.2, our prompts).

For one topic (and optional seed documents), every step asks the construction model through the
stage layer's `Asker` (cache, journal, one repair of an unreadable JSON answer), one batch per
step:

1. **subtopics**: `subtopics + extra` proposed; the overlap check drops any that an LLM files as
   overlapping an earlier one; the first `subtopics` are kept;
2. **insights**: `insights_per_subtopic + extra` per subtopic, each told the other subtopics.
   Dropped: an insight with no number, date or named entity (checked here: a digit, or a
   capitalised word after the first), an exact repeat, a repeat the duplicate check finds, and
   an insight the categorisation check files under another subtopic; the first
   `insights_per_subtopic` survivors are kept;
3. **sampling**: each document gets `insights_per_document` insights (by default the fewest that
   let every insight reach `min_documents_per_insight` documents), sampled with the seed so that
   every insight reaches that minimum: each insight is dealt that many times into the documents
   with the fewest insights so far, then the documents are filled with random other insights;
4. **documents**, one request each: a news article planting its insights, or, for
   conversations, one chapter per insight, each with its own check (regenerated up to
   `chapter_rounds` times while the check says the insight is not there);
5. **verification** of every document: the leak check (does it state an insight it was not
   given?) and the presence check (does it miss one it was given?). A leak is removed by a
   rewrite, a missing insight added by one, up to `rounds` rewrites for each check; a document
   still failing after the last round is remapped to what the last checks found, kept as
   sampled and flagged, or dropped (`on_residual`);
6. **queries**: one question per subtopic.

The result is a haystack in the released schema, validated as a released one is, with the
figures of its making (`Derivation.figures`): what each check dropped, rewrite rounds used,
residual failures, tokens and cost. Requests are keyed by step and round and rendered from the
seeded plan, so a killed run re-sends nothing (the cache answers what it already has).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.benchmarks.summhay.params import SummhaySynthesis, SynthesisHaystack
from pipeline.core.benchmark import Answer, Ask, Asker, Inputs, single
from pipeline.core.errors import ConfigError
from pipeline.core.parse import ParseError, load_object, string_list, text_field
from pipeline.core.prompts import Prompt
from pipeline.core.types import ChatRequest
from pipeline.data.haystacks import Derivation, Haystack, normalise, parse_raw_haystack

COLLECTION = "synthetic"
SEED_DOC_CHARS = 6000  # of each seed document shown to the subtopic step


class SynthesisFailed(Exception):
    """A step's request failed or its answer stayed unusable: the haystack is not made."""


def load_prompts(inputs: Inputs, cfg: SummhaySynthesis) -> dict[str, Prompt]:
    out = {}
    for name, path in cfg.prompts.model_dump().items():
        if not inputs.exists(path):
            raise ConfigError(f"summhay.synthesis.prompts.{name}: prompt file not found: {path}")
        text = inputs.text(path)
        out[name] = Prompt(path, text, hashlib.sha256(text.encode("utf-8")).hexdigest())
    return out


def numbered(lines: Sequence[str]) -> str:
    return "\n".join(f"{i}. {t}" for i, t in enumerate(lines, start=1))


def numbers(text: str | None, key: str, n: int) -> list[int]:
    """`{"<key>": [<1-based numbers up to n>]}`, sorted and de-duplicated."""
    obj = load_object(text)
    items = obj.get(key)
    if not isinstance(items, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in items
    ):
        raise ParseError(f'"{key}" must be a list of whole numbers')
    bad = [x for x in items if not 1 <= x <= n]
    if bad:
        raise ParseError(f'"{key}" holds {bad}: the numbers go from 1 to {n}')
    return sorted(set(items))


def one_number(text: str | None, key: str, n: int) -> int:
    value = load_object(text).get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= n:
        raise ParseError(f'"{key}" must be a whole number from 1 to {n}, got {json.dumps(value)}')
    return value


def boolean(text: str | None, key: str) -> bool:
    value = load_object(text).get(key)
    if not isinstance(value, bool):
        raise ParseError(f'"{key}" must be true or false, got {json.dumps(value)}')
    return value


def plain_text(text: str | None) -> str:
    if text is None or not text.strip():
        raise ParseError("the answer was empty")
    return text.strip()


def subtopic_list(text: str | None) -> list[tuple[str, str]]:
    items = load_object(text).get("subtopics")
    if not isinstance(items, list) or not items:
        raise ParseError('"subtopics" must be a non-empty list')
    out = []
    for i, x in enumerate(items, start=1):
        if not isinstance(x, dict):
            raise ParseError(f"subtopic {i} must be an object with name and description")
        name, desc = x.get("name"), x.get("description")
        if not isinstance(name, str) or not name.strip():
            raise ParseError(f'subtopic {i}: "name" must be a non-empty string')
        if not isinstance(desc, str) or not desc.strip():
            raise ParseError(f'subtopic {i}: "description" must be a non-empty string')
        out.append((name.strip(), desc.strip()))
    return out


_SPECIFIC = re.compile(r"\d|\s[A-Z][\w'-]*")


def is_specific(insight: str) -> bool:
    """A number or date (a digit), or a named entity (a capitalised word after the first)."""
    return bool(_SPECIFIC.search(insight))


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def sample_plan(
    n_insights: int, n_docs: int, per_doc: int | None, minimum: int, rng: random.Random
) -> list[list[int]]:
    """The insights (indices) each document plants: every insight in at least `minimum`
    documents, every document `per_doc` insights (see the module docstring)."""
    if per_doc is None:
        per_doc = max(1, -(-n_insights * minimum // n_docs))
    if per_doc > n_insights:
        raise ConfigError(
            f"insights_per_document ({per_doc}) is more than the haystack's {n_insights} insights"
        )
    if per_doc * n_docs < n_insights * minimum:
        raise ConfigError(
            f"{n_docs} documents of {per_doc} insights cannot give each of {n_insights} insights"
            f" {minimum} documents: raise documents or insights_per_document"
        )
    docs: list[set[int]] = [set() for _ in range(n_docs)]
    order = list(range(n_insights))
    rng.shuffle(order)
    for _ in range(minimum):
        for i in order:
            free = [d for d in range(n_docs) if i not in docs[d] and len(docs[d]) < per_doc]
            least = min(len(docs[d]) for d in free)
            docs[rng.choice([d for d in free if len(docs[d]) == least])].add(i)
    for d in docs:
        while len(d) < per_doc:
            d.add(rng.choice([i for i in range(n_insights) if i not in d]))
    return [sorted(d) for d in docs]


@dataclass
class _Doc:
    index: int
    sampled: list[str]  # insight ids
    text: str = ""
    version: int = 0  # rewrites so far
    leak_rounds: int = 0
    presence_rounds: int = 0
    chapter_regenerations: int = 0
    leaks: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    done: bool = False


@dataclass
class Synthesizer:
    """Synthesizes one haystack; `run()` returns it (or raises SynthesisFailed)."""

    entry: SynthesisHaystack
    cfg: SummhaySynthesis
    prompts: dict[str, Prompt]
    ask: Asker
    seed: int
    json_mode: bool
    price: tuple[float, float]  # USD per 1M input, output tokens
    count: Callable[[list[str]], list[int]]
    seed_texts: list[tuple[str, str]] = field(default_factory=list)  # (path, text)
    figures: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=lambda: [0, 0])

    @property
    def hid(self) -> str:
        return f"syn-{self.entry.id}"

    # ---- asking

    def send(self, step: str, asks: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        """asks: (key, prompt name, content, parser[, sample]) -> value by key; a failure raises.
        `sample` (default 0) varies the request where the same content must give another text
        (a chapter's regeneration, documents that plant the same insights)."""
        if not asks:
            return {}
        reqs = []
        for key, name, content, parse, *rest in asks:
            prompt = self.prompts[name]
            is_json = parse is not plain_text
            fmt = {"type": "json_object"} if is_json and self.json_mode else None
            repair = self.prompts["repair"] if is_json else None
            sha = prompt.sha + (repair.sha if repair else "")
            request = ChatRequest(
                f"{self.hid}/{key}",
                [{"role": "user", "content": content}],
                sha,
                rest[0] if rest else 0,
                None,
                fmt,
            )
            reqs.append(Ask(request, single(parse), repair=repair))
        answers: list[Answer] = self.ask(reqs, f"synthesis {self.hid}: {step}")
        out: dict[str, Any] = {}
        for (key, *_), ans in zip(asks, answers, strict=True):
            self.tokens[0] += ans.input_tokens
            self.tokens[1] += ans.output_tokens
            if not ans.ok:
                raise SynthesisFailed(f"{self.hid}: {step}, request {key}: {ans.failure}")
            out[key] = ans.value
        return out

    # ---- the steps

    def subtopics(self) -> list[tuple[str, str]]:
        e = self.entry
        seeds = "".join(
            f"Seed document ({path}):\n{text[:SEED_DOC_CHARS]}\n\n"
            for path, text in self.seed_texts
        )
        content = self.prompts["subtopics"].render(
            topic=e.topic, n=e.subtopics + self.cfg.extra, seed_documents=seeds
        )
        proposed: list[tuple[str, str]] = self.send(
            "subtopics", [("subtopics", "subtopics", content, subtopic_list)]
        )["subtopics"]
        seen: set[str] = set()
        unique = []
        for name, desc in proposed:
            if _norm(name) not in seen:
                seen.add(_norm(name))
                unique.append((name, desc))
        drop: list[int] = []
        if len(unique) > 1:
            listing = numbered([f"{n}: {d}" for n, d in unique])
            content = self.prompts["overlap"].render(topic=e.topic, subtopics=listing)
            drop = self.send(
                "overlap check",
                [("overlap", "overlap", content, lambda t: numbers(t, "overlapping", len(unique)))],
            )["overlap"]
        kept = [s for i, s in enumerate(unique, start=1) if i not in drop]
        self.figures.update(
            subtopics_proposed=len(proposed),
            subtopics_dropped_repeat=len(proposed) - len(unique),
            subtopics_dropped_overlap=len(unique) - len(kept),
            subtopics_dropped_surplus=max(0, len(kept) - e.subtopics),
        )
        return kept[: e.subtopics]

    def insights(self, subs: list[tuple[str, str]]) -> list[list[str]]:
        e = self.entry
        n = e.insights_per_subtopic + self.cfg.extra
        asks: list[tuple[Any, ...]] = []
        for si, (name, desc) in enumerate(subs):
            others = numbered([f"{o}: {d}" for j, (o, d) in enumerate(subs) if j != si]) or "(none)"
            content = self.prompts["insights"].render(
                topic=e.topic, subtopic=f"{name}: {desc}", other_subtopics=others, n=n
            )
            asks.append(
                (f"insights/s{si + 1}", "insights", content, lambda t: string_list(t, "insights"))
            )
        got = self.send("insights", asks)
        per_sub: list[list[str]] = []
        proposed = unspecific = repeats = 0
        seen: set[str] = set()
        for si in range(len(subs)):
            keep = []
            for text in got[f"insights/s{si + 1}"]:
                proposed += 1
                if not is_specific(text):
                    unspecific += 1
                elif _norm(text) in seen:
                    repeats += 1
                else:
                    seen.add(_norm(text))
                    keep.append(text)
            per_sub.append(keep)
        flat = [(si, t) for si, ts in enumerate(per_sub) for t in ts]
        dup: list[int] = []
        if len(flat) > 1:
            content = self.prompts["duplicates"].render(insights=numbered([t for _, t in flat]))
            dup = self.send(
                "duplicate check",
                [
                    (
                        "duplicates",
                        "duplicates",
                        content,
                        lambda t: numbers(t, "duplicates", len(flat)),
                    )
                ],
            )["duplicates"]
        flat = [x for i, x in enumerate(flat, start=1) if i not in dup]
        listing = numbered([f"{name}: {desc}" for name, desc in subs])
        asks = [
            (
                f"categorise/{i + 1}",
                "categorise",
                self.prompts["categorise"].render(insight=t, subtopics=listing),
                lambda x: one_number(x, "subtopic", len(subs)),
            )
            for i, (_, t) in enumerate(flat)
        ]
        filed = self.send("categorisation check", asks) if len(subs) > 1 else {}
        out: list[list[str]] = [[] for _ in subs]
        miscategorised = 0
        for i, (si, t) in enumerate(flat):
            if filed and filed[f"categorise/{i + 1}"] != si + 1:
                miscategorised += 1
            else:
                out[si].append(t)
        self.figures.update(
            insights_proposed=proposed,
            insights_dropped_unspecific=unspecific,
            insights_dropped_repeat=repeats + len(dup),
            insights_dropped_category=miscategorised,
            insights_dropped_surplus=sum(max(0, len(x) - e.insights_per_subtopic) for x in out),
        )
        return [x[: e.insights_per_subtopic] for x in out]

    def chapters(self, docs: list[_Doc], text_of: dict[str, str], sub_of: dict[str, str]) -> None:
        """Conversations: one chapter per insight, each checked and regenerated while the check
        says its insight is not there (at most `chapter_rounds` times)."""
        e = self.entry
        who = ", ".join(e.participants)
        words = max(20, e.words_per_document // max(1, max(len(d.sampled) for d in docs)))
        chapters: dict[tuple[int, int], str] = {}
        attempt: dict[tuple[int, int], int] = {}
        pending = [(d.index, c) for d in docs for c in range(len(d.sampled))]
        failed_checks = 0
        while pending:
            asks = []
            for di, c in pending:
                iid = docs[di].sampled[c]
                content = self.prompts["chapter"].render(
                    topic=e.topic,
                    participants=who,
                    insight=text_of[iid],
                    chapter=c + 1,
                    chapters=len(docs[di].sampled),
                    words=words,
                )
                a = attempt.get((di, c), 0)
                sample = di * (self.cfg.chapter_rounds + 1) + a
                asks.append(
                    (f"d{di + 1}/chapter{c + 1}/try{a}", "chapter", content, plain_text, sample)
                )
            got = self.send("chapters", asks)
            checks = []
            for (di, c), (key, *_) in zip(pending, asks, strict=True):
                chapters[(di, c)] = got[key]
                iid = docs[di].sampled[c]
                content = self.prompts["chapter_check"].render(
                    subtopic=sub_of[iid], insight=text_of[iid], text=got[key]
                )
                checks.append((f"{key}/check", "chapter_check", content, _covers))
            verdict = self.send("chapter checks", checks)
            again = []
            for (di, c), (key, *_) in zip(pending, checks, strict=True):
                if not verdict[key]:
                    failed_checks += 1
                    if attempt.get((di, c), 0) < self.cfg.chapter_rounds:
                        attempt[(di, c)] = attempt.get((di, c), 0) + 1
                        docs[di].chapter_regenerations += 1
                        again.append((di, c))
            pending = again
        for d in docs:
            d.text = "\n\n".join(chapters[(d.index, c)] for c in range(len(d.sampled)))
        self.figures.update(
            chapter_checks_failed=failed_checks,
            chapter_regenerations=sum(d.chapter_regenerations for d in docs),
        )

    def drafts(self, docs: list[_Doc], text_of: dict[str, str]) -> None:
        e = self.entry
        asks = [
            (
                f"d{d.index + 1}/draft",
                "document",
                self.prompts["document"].render(
                    topic=e.topic,
                    insights=numbered([text_of[i] for i in d.sampled]),
                    words=e.words_per_document,
                ),
                plain_text,
                d.index,
            )
            for d in docs
        ]
        got = self.send("documents", asks)
        for d, (key, *_) in zip(docs, asks, strict=True):
            d.text = got[key]

    def verify(self, docs: list[_Doc], ids: list[str], text_of: dict[str, str]) -> None:
        """The leak and presence checks, and the rewrites they call for, until every document
        passes or has used its rounds."""
        rounds = self.cfg.rounds
        while pending := [d for d in docs if not d.done]:
            checks = []
            for d in pending:
                others = [i for i in ids if i not in d.sampled]
                tag = f"d{d.index + 1}/v{d.version}"
                if others:
                    checks.append(
                        (
                            f"{tag}/leak",
                            "leak_check",
                            self.prompts["leak_check"].render(
                                document=d.text, insights=numbered([text_of[i] for i in others])
                            ),
                            _numbers_of("present", len(others)),
                        )
                    )
                checks.append(
                    (
                        f"{tag}/presence",
                        "presence_check",
                        self.prompts["presence_check"].render(
                            document=d.text, insights=numbered([text_of[i] for i in d.sampled])
                        ),
                        _numbers_of("missing", len(d.sampled)),
                    )
                )
            got = self.send(f"checks, round {max(d.version for d in pending) + 1}", checks)
            rewrites = []
            for d in pending:
                others = [i for i in ids if i not in d.sampled]
                tag = f"d{d.index + 1}/v{d.version}"
                d.leaks = [others[k - 1] for k in got.get(f"{tag}/leak", [])]
                d.missing = [d.sampled[k - 1] for k in got[f"{tag}/presence"]]
                if d.leaks and d.leak_rounds < rounds:
                    d.leak_rounds += 1
                    name, facts = "remove", d.leaks
                elif d.missing and d.presence_rounds < rounds:
                    d.presence_rounds += 1
                    name, facts = "add", d.missing
                else:
                    d.done = True
                    continue
                content = self.prompts[name].render(
                    document=d.text, insights=numbered([text_of[i] for i in facts])
                )
                rewrites.append((d, (f"{tag}/{name}", name, content, plain_text)))
            got = self.send("rewrites", [a for _, a in rewrites])
            for d, (key, *_) in rewrites:
                d.text = got[key]
                d.version += 1

    def queries(self, subs: list[tuple[str, str]]) -> list[str]:
        asks = [
            (
                f"query/s{si + 1}",
                "query",
                self.prompts["query"].render(topic=self.entry.topic, subtopic=f"{n}: {d}"),
                lambda t: text_field(t, "query"),
            )
            for si, (n, d) in enumerate(subs)
        ]
        got = self.send("queries", asks)
        return [got[a[0]] for a in asks]

    # ---- the whole

    def run(self) -> Haystack:
        e = self.entry
        subs = self.subtopics()
        per_sub = self.insights(subs)
        kept = [(s, ins) for s, ins in zip(subs, per_sub, strict=True) if ins]
        self.figures["subtopics_dropped_empty"] = len(subs) - len(kept)
        if not kept:
            raise SynthesisFailed(f"{self.hid}: no subtopic kept an insight")
        sub_ids = [f"s{i}" for i in range(1, len(kept) + 1)]
        ids: list[str] = []
        text_of: dict[str, str] = {}
        sub_of: dict[str, str] = {}
        for sid, ((name, desc), ins) in zip(sub_ids, kept, strict=True):
            for k, t in enumerate(ins, start=1):
                iid = f"{sid}_i{k}"
                ids.append(iid)
                text_of[iid] = t
                sub_of[iid] = f"{name}: {desc}"
        rng = random.Random(f"{self.seed}/{self.hid}")
        plan = sample_plan(
            len(ids), e.documents, e.insights_per_document, e.min_documents_per_insight, rng
        )
        docs = [_Doc(i, [ids[k] for k in p]) for i, p in enumerate(plan)]
        if e.domain == "conversation":
            self.chapters(docs, text_of, sub_of)
        else:
            self.drafts(docs, text_of)
        self.verify(docs, ids, text_of)
        queries = self.queries([s for s, _ in kept])
        return self.assemble(kept, sub_ids, ids, text_of, docs, queries)

    def assemble(
        self,
        kept: list[tuple[tuple[str, str], list[str]]],
        sub_ids: list[str],
        ids: list[str],
        text_of: dict[str, str],
        docs: list[_Doc],
        queries: list[str],
    ) -> Haystack:
        e, policy = self.entry, self.cfg.on_residual
        final: list[tuple[_Doc, list[str]]] = []
        flagged = []
        for d in docs:
            residual = bool(d.leaks or d.missing)
            if residual:
                flagged.append(
                    {"document": f"d{d.index + 1:03d}", "leaks": d.leaks, "missing": d.missing}
                )
            if residual and policy == "drop":
                continue
            if residual and policy == "remap":
                insights = [
                    i for i in ids if (i in d.sampled and i not in d.missing) or i in d.leaks
                ]
            else:
                insights = list(d.sampled)
            final.append((d, insights))
        holders: dict[str, int] = {i: 0 for i in ids}
        for _, insights in final:
            for i in insights:
                holders[i] += 1
        raw = {
            "topic_id": self.hid,
            "topic": e.topic,
            "topic_metadata": {"participants": list(e.participants)},
            "subtopics": [
                {
                    "subtopic_id": sid,
                    "subtopic_name": name,
                    "subtopic": desc,
                    "query": query,
                    "insights": [
                        {"insight_id": f"{sid}_i{k}", "insight_name": "", "insight": t}
                        for k, t in enumerate(ins, start=1)
                    ],
                    "retriever": {
                        "oracle": {
                            f"d{d.index + 1:03d}": float(
                                sum(1 for i in insights if i.startswith(f"{sid}_"))
                            )
                            for d, insights in final
                        }
                    },
                }
                for sid, ((name, desc), ins), query in zip(sub_ids, kept, queries, strict=True)
            ],
            "documents": [
                {
                    "document_id": f"d{d.index + 1:03d}",
                    "document_text": d.text,
                    "insights_included": insights,
                }
                for d, insights in final
            ],
        }
        if not final:
            raise SynthesisFailed(f"{self.hid}: every document was dropped (on_residual: drop)")
        n_tokens = sum(self.count([d.text for d, _ in final]))
        cost = (self.tokens[0] * self.price[0] + self.tokens[1] * self.price[1]) / 1e6
        self.figures.update(
            subtopics=len(kept),
            insights=len(ids),
            documents_planned=len(docs),
            documents=len(final),
            documents_dropped=len(docs) - len(final),
            leak_rewrites=sum(d.leak_rounds for d in docs),
            presence_rewrites=sum(d.presence_rounds for d in docs),
            max_rewrites=max(d.leak_rounds + d.presence_rounds for d in docs),
            residual_leaks=sum(len(d.leaks) for d in docs),
            residual_missing=sum(len(d.missing) for d in docs),
            residual_documents=flagged,
            on_residual=policy,
            insights_below_minimum=sum(
                1 for n in holders.values() if n < e.min_documents_per_insight
            ),
            insights_in_no_document=sum(1 for n in holders.values() if n == 0),
            input_tokens=self.tokens[0],
            output_tokens=self.tokens[1],
            cost_usd=round(cost, 6),
        )
        recipe = {
            "entry": e.model_dump(),
            "cfg": self.cfg.model_dump(exclude={"haystacks", "prompts"}),
            "prompts": {n: p.sha for n, p in sorted(self.prompts.items())},
            "seeds": [hashlib.sha256(t.encode()).hexdigest() for _, t in self.seed_texts],
            "seed": self.seed,
        }
        derivation = Derivation(
            kind="synthesized",
            collection=COLLECTION,
            sources=[p for p, _ in self.seed_texts],
            target_tokens=None,
            n_tokens=n_tokens,
            seed=self.seed,
            recipe_sha=hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest(),
            figures=self.figures,
        )
        where = f"{self.hid} (synthesized)"
        return normalise(
            self.hid,
            parse_raw_haystack(raw, where),
            source_file=where,
            domain=e.domain,
            derived=derivation,
        )


def _covers(text: str | None) -> bool:
    return boolean(text, "covers")


def _numbers_of(key: str, n: int) -> Callable[[str | None], list[int]]:
    return lambda t: numbers(t, key, n)
