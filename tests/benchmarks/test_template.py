"""The `_template` benchmark's pure parts: its dataset, its verdict parser, its recall on a
hand-computed case, and how a coverage judge's verdicts map onto its labels."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.benchmarks._template.benchmark import Item, Template, judge_task
from pipeline.blocks import answer_sentences, choice
from pipeline.core import aggregation
from pipeline.core.benchmark import JudgePrompts, Run
from pipeline.core.errors import DataError
from pipeline.core.parse import ParseError
from pipeline.core.prompts import load_prompt
from pipeline.core.records import Generation, Judgement, Verdict, validate_lines
from pipeline.local_judge.model import LocalVerdict
from pipeline.stages.common import FileInputs

ROOT = Path(__file__).resolve().parents[2]
BENCH = Template()
parse_verdict = choice("verdict", ["yes", "partial", "no"])


def examples() -> list[Item]:
    src = "pipeline/benchmarks/_template/examples.jsonl"
    return [i for _, i in validate_lines(FileInputs(ROOT).jsonl(src), Item, src)]


def test_the_examples_and_a_jsonl_file(tmp_path: Path) -> None:
    items = examples()
    assert [i.item_id for i in items] == ["ex1", "ex2", "ex3"]
    assert sum(len(i.facts) for i in items) == 8
    p = tmp_path / "items.jsonl"
    good = items[0].model_dump()
    bad = {**good, "item_id": "x2", "facts": [{"fact_id": "f1", "text": ""}]}
    p.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        validate_lines(FileInputs(tmp_path).jsonl("items.jsonl"), Item, "items.jsonl")
    assert e.value.file == "items.jsonl:2" and e.value.item == "x2"
    assert e.value.field == "facts[0].text"


def test_verdict_parser_and_the_llm_judge_s_asks() -> None:
    assert parse_verdict('{"verdict": "Yes"}') == "yes"
    assert parse_verdict('```json\n{"verdict": "[partial]"}\n```') == "partial"
    with pytest.raises(ParseError, match="must be one of yes, partial, no"):
        parse_verdict('{"verdict": "maybe"}')
    folder = "pipeline/benchmarks/_template/prompts"
    prompts = JudgePrompts(
        load_prompt(f"{folder}/judge.txt", ROOT),
        load_prompt(f"{folder}/repair.txt", ROOT),
        "",
        None,
    )
    gen = _gen("ex3")
    task = judge_task(gen, examples()[2], prompts)
    assert task.targets == ("f1", "f2") and len(task.asks) == 2
    content = task.asks[1].request.messages[0]["content"]
    assert "An answer." in content and "repair café" in content
    assert task.asks[0].parse('{"verdict": "no"}', ("f1",))[0]["f1"].label == "no"


def test_the_match_judge_by_hand() -> None:
    """ex3's facts against an answer with every word of f1 and half of f2's 4+ letter words."""
    assert BENCH.no_model_judge is not None
    gen = _gen("ex3").model_copy(update={"text": "The library lends tools and sewing machines."})
    items = {i.item_id: i for i in examples()}
    (j,) = BENCH.no_model_judge.judgements(None, "m", None, items, [gen])  # type: ignore[arg-type]
    # f2 "The library runs a repair café on Saturdays.": library of (library, runs, repair,
    # café, saturdays) -> 1/5 < 0.5: no
    assert [(v.target_id, v.label) for v in j.verdicts] == [("f1", "yes"), ("f2", "no")]


def _gen(item: str, status: str = "ok") -> Generation:
    return Generation(
        benchmark="_template",
        item_id=item,
        model="m",
        system="m",
        setting="documents",
        status=status,  # type: ignore[arg-type]
        text="An answer." if status == "ok" else None,
    )


def _judgement(gen: Generation, labels: dict[str, str]) -> Judgement:
    verdicts = [
        Verdict(target_id=f, label=lab, status="invalid" if lab == "INVALID" else "ok")
        for f, lab in labels.items()
    ]
    return Judgement(
        benchmark="_template",
        generation_id=gen.generation_id,
        item_id=gen.item_id,
        model="m",
        system="m",
        setting="documents",
        judge="j",
        judge_prompt_sha="s",
        status="ok",
        verdicts=verdicts,
    )


def test_recall_by_hand() -> None:
    """ex1: yes, partial, invalid -> (1 + 0.5) / 2 = 0.75 (the invalid verdict left out and
    counted); ex2: a judge call that failed; ex3: a failed generation. Recall over the one
    scored item: 0.75."""
    g1, g2, g3 = _gen("ex1"), _gen("ex2"), _gen("ex3", status="error")
    j1 = _judgement(g1, {"f1": "yes", "f2": "partial", "f3": "INVALID"})
    j2 = _judgement(g2, {}).model_copy(update={"status": "error", "error": "HTTP 500"})
    ctx: Any = SimpleNamespace(params=SimpleNamespace(seed=0, models={}))
    out = aggregation.aggregate(BENCH, ctx, examples(), [Run("m", "j", [g1, g2, g3], [j1, j2])])
    (row,) = out.metrics["rows"]
    assert row["recall"] == 0.75 and row["n_scored"] == 1 and row["n_invalid_verdicts"] == 1
    assert row["n_failed_judgements"] == 1 and row["n_failed_generations"] == 1
    assert row["n_items"] == 3 and row["n_invalid"] == 0
    assert out.summary == {"j": {"m/documents": 0.75}}
    (run,) = out.runs
    assert run.metrics["recall"] == 0.75 and run.model == "m" and run.judge == "j"
    assert run.artifacts["items.jsonl"] == [
        {"item_id": "ex1", "values": {"recall": 0.75}, "parts": {}, "facts": 3}
    ]
    assert "| m | documents | j | 0.750 | 3 | 1 | 1 | 1 | 1 |" in out.report


def test_a_coverage_judge_sees_facts_against_answer_sentences() -> None:
    item = examples()[0]
    gen = _gen("ex1").model_copy(
        update={"text": "- Water comes from Lake Orrin [1]. It is pumped."}
    )
    no_ctx: Any = None  # the template's coverage cases do not read the context
    assert BENCH.coverage is not None
    (case,) = BENCH.coverage.cases(no_ctx, item, gen)
    assert [t for t, _ in case.targets] == ["f1", "f2", "f3"]
    assert (
        case.bullets
        == answer_sentences(gen.text or "")
        == ["Water comes from Lake Orrin.", "It is pumped."]
    )
    v = BENCH.coverage.verdict("f1", LocalVerdict("PARTIAL_COVERAGE", 1, (0.2, 0.5, 0.3)))
    assert (v.label, v.link, v.raw) == ("partial", 1, "PARTIAL_COVERAGE")
