"""Whole RAG systems as models: the user's Python (`provider: python`) and answers made
elsewhere (`provider: outputs`), through the generate stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.core.benchmark import SystemAnswer
from pipeline.core.errors import DataError, StageFailed
from pipeline.core.io import read_jsonl
from pipeline.core.params import validate_params
from pipeline.core.records import Generation
from pipeline.stages.construct import construct
from pipeline.stages.generate import generate
from pipeline.stages.systems import BadAnswer, as_answer, export_outputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, mirror: Path) -> Path:
    out = tmp_path_factory.mktemp("ds") / "long2rag.jsonl"
    construct(registry.get("long2rag"), _params({}), mirror / "summhay", out, ROOT)
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "pipeline").symlink_to(ROOT / "pipeline")
    (tmp_path / "inputs" / "systems").mkdir(parents=True)
    return tmp_path


def _params(models: dict[str, Any]) -> Any:
    return validate_params(
        {
            "models": {"l2r-lead": {"provider": "long2rag-lead"}, **models},
            "judges": {"local": {"provider": "local"}},
            "long2rag": {
                "derived": {"haystacks": ["news1"], "subtopics": 3},
                "models": ["l2r-lead", *models],
                "judges": ["local"],
            },
        },
        benchmarks=["long2rag"],
    )


def _generate(root: Path, dataset: Path, mirror: Path, name: str, entry: dict[str, Any]) -> Path:
    out = root / "generations" / "long2rag" / f"{name}.jsonl"
    generate(registry.get("long2rag"), _params({name: entry}), name, dataset, mirror, out, root)
    return out


SYSTEM = """
import os

CALLS = {calls!r}

def answer(question, prefix="A"):
    with open(CALLS, "a") as f:
        f.write(question.id + "\\n")
    if os.path.exists(CALLS + ".down") and question.id.endswith("{fail}"):
        raise TimeoutError("the vector store timed out")
    used = [d.id for d in question.documents[:2]]
    return {{"answer": f"{{prefix}}: " + question.question, "passages": used}}
"""


def test_a_python_system_answers_each_question_and_resumes_only_the_failed(
    root: Path, dataset: Path, mirror: Path
) -> None:
    items = [json.loads(line)["item_id"] for line in dataset.read_text().splitlines()]
    calls = root / "calls.txt"
    code = root / "inputs" / "systems" / "rag.py"
    code.write_text(SYSTEM.format(calls=str(calls), fail=items[1][-6:]), encoding="utf-8")
    entry = {"provider": "python", "entry": "rag:answer", "options": {"prefix": "B"}}
    Path(f"{calls}.down").touch()
    with pytest.raises(StageFailed, match="1 item"):
        _generate(root, dataset, mirror, "rag", entry)
    gens = read_jsonl(root / "generations" / "long2rag" / "rag.jsonl", Generation)
    assert [g.status for g in gens] == ["ok", "error", "ok"]
    assert "raised TimeoutError: the vector store timed out" in (gens[1].error or "")
    assert gens[0].text == "B: " + json.loads(dataset.read_text().splitlines()[0])["question"]
    assert gens[0].setting == "own" and len(gens[0].meta["passages"]) == 2
    # the store is back: only the failed question is asked again (the others: the journal)
    Path(f"{calls}.down").unlink()
    out = _generate(root, dataset, mirror, "rag", entry)
    assert calls.read_text().splitlines() == [items[0], items[1], items[2], items[1]]
    usage = json.loads(out.with_name("rag.usage.json").read_text())
    assert usage["system"]["entry_point"] == "rag:answer" and len(usage["system"]["code_sha"]) == 16
    assert usage["journal_hits"] == 2
    # the same answers as an outputs file give the same generations
    rows = export_outputs(read_jsonl(out, Generation))
    path = root / "inputs" / "systems" / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    replay = _generate(
        root,
        dataset,
        mirror,
        "replayed",
        {"provider": "outputs", "files": {"long2rag": "inputs/systems/answers.jsonl"}},
    )
    a = [g.model_dump(exclude={"model", "system"}) for g in read_jsonl(out, Generation)]
    b = [g.model_dump(exclude={"model", "system"}) for g in read_jsonl(replay, Generation)]
    assert a == b


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (lambda ids: [{"item_id": "nope", "answer": "x"}], r"answers\.jsonl:1.*unknown item id"),
        (
            lambda ids: (
                [{"item_id": i, "answer": "x"} for i in ids] + [{"item_id": ids[0], "answer": "y"}]
            ),
            r"answers\.jsonl:4.*answered twice \(first at .*answers\.jsonl:1\)",
        ),
        (
            lambda ids: [{"item_id": ids[0], "answer": "x"}],
            r"answers\.jsonl.*2 of the 3 items have no answer",
        ),
        (lambda ids: [{"item_id": ids[0]}], r"answers\.jsonl:1.*'answer'"),
        (lambda ids: [{"item_id": ids[0], "answer": 3}], r"answers\.jsonl:1.*'answer' is int"),
        (
            lambda ids: [{"item_id": ids[0], "answer": "x", "passages": "d1"}],
            r":1.*'passages' is str",
        ),
        (lambda ids: [{"item_id": ids[0], "answer": "x", "score": 1}], r":1.*unknown field"),
        (lambda ids: ["just text"], r"answers\.jsonl:1.*a JSON object"),
    ],
)
def test_an_outputs_file_that_does_not_answer_the_items_is_refused_naming_file_and_line(
    root: Path, dataset: Path, mirror: Path, lines: Any, message: str
) -> None:
    ids = [json.loads(line)["item_id"] for line in dataset.read_text().splitlines()]
    path = root / "inputs" / "systems" / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines(ids)), encoding="utf-8")
    entry = {"provider": "outputs", "files": {"long2rag": "inputs/systems/answers.jsonl"}}
    with pytest.raises(DataError, match=message):
        _generate(root, dataset, mirror, "replayed", entry)


def test_an_answer_is_text_or_a_mapping_with_answer_passages_citations() -> None:
    assert as_answer("plain") == SystemAnswer("plain")
    got = as_answer({"answer": "a", "passages": [1, "d2"], "citations": [["1"], []]})
    assert got == SystemAnswer("a", ("1", "d2"), (("1",), ()))

    class Obj:
        def __init__(self) -> None:
            self.answer, self.passages = "o", ["x"]

    assert as_answer(Obj()) == SystemAnswer("o", ("x",))
    for bad, message in [
        (None, "returned NoneType"),
        ({"answer": "a", "citations": "1"}, "not a list"),
        ({"answer": "a", "passages": [True]}, "not a document id"),
    ]:
        with pytest.raises(BadAnswer, match=message):
            as_answer(bad)


def test_summhay_writes_a_systems_citations_into_its_bullets() -> None:
    from pipeline.benchmarks.summhay.benchmark import with_citations

    text, error = with_citations("- one\n- two [3]\nnot a bullet", [["1", "2"], ["9"]])
    assert error is None and text == "- one [1][2]\n- two [3]\nnot a bullet"
    assert (
        with_citations("- one", [["1"], ["2"]])[1]
        == "citations for 2 bullets, but the answer has 1"
    )
