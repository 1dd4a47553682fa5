"""Building blocks for the common shape of a benchmark (pure): one prompt per item, no-model
baselines over the item's documents, an LLM judge that labels each reference unit of an output,
a no-model judge that gives its verdicts by a rule, and a coverage view of an output. The
template (`pipeline/benchmarks/_template`) is written with them; a benchmark of another shape
uses the contract directly (`pipeline/core/benchmark.py`)."""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pipeline.core.benchmark import (
    Context,
    CoverageCase,
    CoverageVerdictLike,
    JudgePrompts,
    JudgeTask,
    NoModelJudge,
    Planned,
    judge_task,
    label_parser,
)
from pipeline.core.config import BaselineModel, BenchmarkParams, JudgeSpec, ModelSpec
from pipeline.core.errors import ConfigError
from pipeline.core.parse import ParseError, load_object
from pipeline.core.records import Generation, Judgement, Verdict, generation_id
from pipeline.core.types import ChatRequest

__all__ = [  # the helpers, and the contract's names a benchmark of this shape needs
    "SETTING",
    "CoverageCase",
    "CoverageVerdictLike",
    "JudgePrompts",
    "JudgeTask",
    "RuleJudge",
    "answer_sentences",
    "baseline_each",
    "choice",
    "prompt_each",
    "sentence_case",
    "unit_task",
]

P = TypeVar("P", bound=BenchmarkParams)
I = TypeVar("I")  # noqa: E741

SETTING = "documents"  # the one context setting of a benchmark that does not vary its context


def prompt_each(
    ctx: Context[Any],
    model: str,
    system: str | None,
    fields: Mapping[str, Mapping[str, str]],
    prompt: str = "generate",
    setting: str = SETTING,
) -> list[Planned]:
    """One request per item: the prompt `prompt` rendered with the item's `fields` (item id ->
    placeholder -> text)."""
    p = ctx.prompt(prompt)
    system = system or model
    out = []
    for item_id, values in fields.items():
        request = ChatRequest(
            key=generation_id(item_id, system, setting, 0),
            messages=[{"role": "user", "content": p.render(**values)}],
            prompt_sha=p.sha,
        )
        meta = {"prompt": p.path, "prompt_sha": p.sha}
        out.append(Planned(request, item_id, system, setting, 0, meta))
    return out


def baseline_each(
    benchmark: str,
    model: str,
    spec: ModelSpec,
    sources: Mapping[str, tuple[str, Sequence[str]]],
    sentences: int,
    max_words: int | None = None,
    setting: str = SETTING,
) -> list[Generation]:
    """A no-model answer per item (`spec`: a `baseline` models entry): from each item's
    (question, documents), its `lead` or most relevant (`extractive`) sentences (`spec.bullets`,
    else `sentences`), cut at `max_words` words."""
    from pipeline import baselines

    if not isinstance(spec, BaselineModel):
        raise ConfigError(f"models.{model}: provider {spec.provider!r} cannot run {benchmark}")
    pick = baselines.lead if spec.kind == "lead" else baselines.extractive
    system = spec.system or model
    out = []
    for item_id, (question, texts) in sources.items():
        docs = [baselines.Doc(n, t) for n, t in enumerate(texts, start=1)]
        text = pick(question, docs, spec.bullets or sentences)
        if max_words is not None:
            text = " ".join(text.split()[:max_words])
        meta = {"prompt_sha": f"baseline-{spec.kind}"}
        out.append(Generation.offline(benchmark, item_id, model, system, setting, text, meta))
    return out


def choice(key: str, labels: Sequence[str]) -> Callable[[str | None], str]:
    """A parser of a JSON answer `{key: label}` with one of `labels` (case, spaces and brackets
    ignored); raises ParseError (shown to the judge in the repair) otherwise."""

    def parse(text: str | None) -> str:
        value = load_object(text).get(key)
        label = value.strip().strip("[]").lower() if isinstance(value, str) else ""
        if label not in labels:
            raise ParseError(f'"{key}" must be one of {", ".join(labels)}, got {json.dumps(value)}')
        return label

    return parse


def unit_task(
    generation: Generation,
    units: Mapping[str, Mapping[str, str]],
    prompts: JudgePrompts,
    parse: Callable[[str | None], str],
) -> JudgeTask:
    """An LLM judge's asks on one output: one call per reference unit (unit id -> the judge
    prompt's placeholders), its answer a label read by `parse`."""
    return judge_task(
        generation,
        list(units),
        prompts,
        lambda u: prompts.prompt.render(**units[u]),
        lambda u: label_parser(u, parse),
    )


class RuleJudge(NoModelJudge[P, I], Generic[P, I]):
    """A judge that needs no model: each output's verdicts by a rule of the benchmark's
    (`verdicts`). `version` names the rule in the judgements (bump it when the rule changes)."""

    version = "1"

    @abstractmethod
    def verdicts(self, item: I, generation: Generation) -> list[Verdict]: ...

    def judgements(
        self,
        ctx: Context[P],
        judge: str,
        spec: JudgeSpec,
        items: Mapping[str, I],
        gens: Sequence[Generation],
    ) -> list[Judgement]:
        sha = f"{type(self).__name__.lower()}-v{self.version}"
        out = []
        for g in gens:
            verdicts = self.verdicts(items[g.item_id], g)
            status = "invalid" if any(v.status == "invalid" for v in verdicts) else "ok"
            out.append(Judgement.of(g.benchmark, g, judge, sha, status, verdicts))
        return out


_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_CITATION = re.compile(r"\s*\[\d+\]")


def answer_sentences(text: str) -> list[str]:
    """An answer's sentences, list markers and citations removed (what a coverage judge
    compares the reference units with)."""
    from pipeline.baselines import split_sentences

    out = []
    for s in split_sentences(text):
        s = _CITATION.sub("", _MARKER.sub("", s)).strip()
        if s:
            out.append(s)
    return out


def sentence_case(units: Mapping[str, str], generation: Generation) -> list[CoverageCase]:
    """A coverage judge's view of an output: the reference units (id -> text) against the
    answer's sentences."""
    return [CoverageCase(list(units.items()), answer_sentences(generation.text or ""))]
