"""Scripted answers for the test server (`tests.e2e.synthesis_responder:respond`) to the prompts
of SummHay's haystack synthesis (pipeline/benchmarks/summhay/prompts/synthesis/).

Every fact ("insight") it writes carries a unique four-digit code, and a text states a fact
exactly when it holds that code: the checks answer by looking for codes, so every answer can be
recomputed by hand (`codes` below).

- subtopics: `n` subtopics named after NAMES; the fourth overlaps the first ("Harbour ...
  again"), and the overlap check says so;
- insights: `n` per subtopic, "<Name> counted <code> visitors on day <k>." (code = 1000 +
  100 x subtopic + k), except: the last insight of each subtopic has no number, date or name
  (dropped by the specificity check); the fourth of subtopic 1 restates the first's code in
  other words (the duplicate check finds it); the third of subtopic 2 is about subtopic 3's name
  (the categorisation check files it there);
- documents: the facts given, one sentence each, between filler sentences. Planted faults, by the
  request's seed (= document index with the entry's seed 0): document 1's draft also states a
  fact it was not given (a leak), document 2's draft leaves out its second fact (missing);
- chapters: the fact in a line of dialogue; the first try of document 1's first chapter leaves it
  out (the chapter check catches it, the retry has it);
- checks: leak = the listed facts whose code the document holds; presence = those it lacks;
  chapter check: whether the chapter holds the code;
- rewrites: remove deletes the sentences holding the listed codes, add appends their sentences;
- queries: "What happened with <name>?", except subtopic 2's first answer is not JSON (repaired).
"""

from __future__ import annotations

import json
import re
from typing import Any

NAMES = ("Harbour", "Market", "Festival", "Harbour again", "Library", "Council")
CODE = re.compile(r"\b(\d{4})\b")
FILLER = "The weather was mild and people talked about it."


def codes(text: str) -> set[str]:
    return set(CODE.findall(text))


def insight(si: int, k: int) -> str:
    """The k-th (1-based) insight of the si-th (1-based) subtopic, as the responder writes it."""
    name = NAMES[si - 1].split()[0]
    return f"{name} counted {1000 + 100 * si + k} visitors on day {k}."


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def _numbered(block: str) -> list[str]:
    return [ln.split(". ", 1)[1] for ln in block.strip().splitlines() if re.match(r"^\d+\. ", ln)]


def _doc_sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=\.)\s+", text.strip()) if s]


def respond(body: dict[str, Any]) -> str:
    messages = body.get("messages", [])
    task = str(messages[0].get("content", "")) if messages else ""
    first_attempt = len(messages) == 1
    seed = int(body.get("seed") or 0)
    if task.startswith("We are building a collection"):
        n = int(re.search(r"Propose (\d+) subtopics", task).group(1))  # type: ignore[union-attr]
        return json.dumps(
            {
                "subtopics": [
                    {"name": NAMES[i], "description": f"What happens around the {NAMES[i]}."}
                    for i in range(n)
                ]
            }
        )
    if task.startswith("Here are numbered subtopics"):
        listed = _numbered(_between(task, ":\n\n", "\n\nFind"))
        firsts = [s.split(":")[0].split()[0] for s in listed]
        dup = [i + 1 for i, f in enumerate(firsts) if f in firsts[:i]]
        return json.dumps({"overlapping": dup})
    if task.startswith("We are writing documents"):
        sub = task.split("Subtopic: ", 1)[1].split(":", 1)[0]
        si = NAMES.index(sub) + 1
        n = int(re.search(r"Write (\d+) insights", task).group(1))  # type: ignore[union-attr]
        out = [insight(si, k) for k in range(1, n)]
        if si == 1 and len(out) > 3:
            out[3] = f"On day 1 the visitors at the harbour numbered {1101}."
        if si == 2 and len(out) > 2:
            out[2] = f"Festival organisers counted {1203} visitors on day 3."
        out.append("people enjoyed it a lot.")
        return json.dumps({"insights": out})
    if task.startswith("Here are numbered statements"):
        listed = _numbered(_between(task, ":\n\n", "\n\nFind"))
        seen: set[str] = set()
        dup = []
        for i, s in enumerate(listed, start=1):
            c = codes(s)
            if c & seen:
                dup.append(i)
            seen |= c
        return json.dumps({"duplicates": dup})
    if task.startswith("Which subtopic does this statement"):
        statement = task.split("Statement: ", 1)[1].split("\n", 1)[0]
        listed = _numbered(task.split("Subtopics:\n", 1)[1].split("\n\nReply", 1)[0])
        for i, s in enumerate(listed, start=1):
            if s.split(":")[0].split()[0].lower() in statement.lower():
                return json.dumps({"subtopic": i})
        return json.dumps({"subtopic": 1})
    if task.startswith("Write a news article"):
        facts = _numbered(_between(task, "quote it:\n", "\n\nDo not"))
        if seed == 1 and len(facts) > 1:
            facts = [facts[0], *facts[2:]]  # leaves out its second fact
        sentences = [FILLER, *facts, FILLER]
        if seed == 0:
            given = {c for f in facts for c in codes(f)}
            leak = next(
                insight(si, k)
                for si in (1, 2, 3)
                for k in (1, 2, 3)
                if not codes(insight(si, k)) & given
            )
            sentences.insert(1, leak)
        return " ".join(sentences)
    if task.startswith("Write part "):
        fact = task.split("quote it:\n", 1)[1].split("\n", 1)[0]
        who = task.split(" between ", 1)[1].split(". ", 1)[0].split(", ")
        if seed == 0 and "Write part 1 of" in task:
            return f"{who[0]}: Hello.\n{who[1]}: Nothing new today."
        return f"{who[0]}: Did you hear? {fact}\n{who[1]}: I did."
    if task.startswith("Does this part of a conversation"):
        fact = task.split("Fact: ", 1)[1].split("\n", 1)[0]
        text = task.split("Conversation:\n", 1)[1].split("\n\nReply", 1)[0]
        return json.dumps({"covers": bool(codes(fact) & codes(text))})
    if task.startswith("Read the document, then the numbered facts"):
        doc = _between(task, "Document:\n", "\n\nFacts:")
        facts = _numbered(task.split("Facts:\n", 1)[1].split("\n\nReply", 1)[0])
        held = [i for i, f in enumerate(facts, start=1) if codes(f) & codes(doc)]
        if "fail to state" in task:
            return json.dumps({"missing": [i for i in range(1, len(facts) + 1) if i not in held]})
        return json.dumps({"present": held})
    if task.startswith("Rewrite the document below so that it no longer"):
        doc = _between(task, "Document:\n", "\n\nFacts to remove:")
        gone = {c for f in _numbered(task.split("Facts to remove:\n", 1)[1]) for c in codes(f)}
        return " ".join(s for s in _doc_sentences(doc) if not codes(s) & gone)
    if task.startswith("Rewrite the document below so that it also"):
        doc = _between(task, "Document:\n", "\n\nFacts to add:")
        facts = _numbered(task.split("Facts to add:\n", 1)[1].split("\n\nWrite", 1)[0])
        return " ".join([doc.strip(), *facts])
    if task.startswith("Turn this subtopic"):
        name = task.split("Subtopic: ", 1)[1].split(":", 1)[0]
        if name == NAMES[1] and first_attempt:
            return "What happened at the market?"
        return json.dumps({"query": f"What happened with {name}?"})
    return "I do not know this task."
