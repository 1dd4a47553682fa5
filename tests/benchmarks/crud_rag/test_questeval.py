"""RAGQuestEval's scores on hand-computed cases (the paper's Fig. 6 among them), its questions
from the authors' caches (no call) and the parsing of a judge's answers."""

from __future__ import annotations

import json

import pytest

from pipeline.benchmarks.crud_rag import questeval
from pipeline.benchmarks.crud_rag.schema import QuestSet
from pipeline.benchmarks.crud_rag.text import tokens
from pipeline.core import aggregation
from pipeline.core.benchmark import Ask
from pipeline.core.parse import ParseError
from tests.benchmarks.crud_rag.helpers import ctx

UN = "无法推断"


def qset(answers: list[str]) -> QuestSet:
    return QuestSet(question=[f"问题{i}" for i in range(len(answers))], answers=answers,
                    source="released")  # fmt: skip


def test_token_f1_by_hand() -> None:
    # jieba: 北京 / 举行 / 会议 vs 北京 / 举行 -> 2 common; P = 2/2, R = 2/3, F1 = 0.8
    assert tokens("北京举行会议") == ["北京", "举行", "会议"]
    assert questeval.token_f1("北京举行会议", "北京举行") == pytest.approx(0.8)
    assert questeval.token_f1("二十公里", "二十公里") == 1.0
    assert questeval.token_f1("二十公里", "三天") == 0.0
    assert questeval.token_f1("", "") == 1.0 and questeval.token_f1("三天", "") == 0.0


def test_the_papers_worked_example() -> None:
    """Fig. 6: three questions, two answerable from the output with F1 0.5 and 1: recall 2/3,
    precision 0.75 (the mean over the answered questions)."""
    # a 3-token reference answer against a 1-token output answer: P 1, R 1/3 -> F1 0.5
    q = qset(["北京举行会议", "二十公里", "三天"])
    assert questeval.token_f1("北京举行会议", "北京") == pytest.approx(0.5)
    s = questeval.score(q, {"q1": "北京", "q2": "二十公里", "q3": UN})
    assert s.recall == pytest.approx(2 / 3)
    assert s.precision == pytest.approx(0.75)
    assert (s.n_questions, s.n_answered) == (3, 2)


def test_bad_questions_are_not_asked_and_nothing_answered_scores_zero() -> None:
    q = qset(["二十公里", UN, "三天"])
    assert q.kept() == [0, 2]
    s = questeval.score(q, {"q1": UN, "q3": UN})
    assert (s.recall, s.precision, s.n_questions) == (0.0, 0.0, 2)
    # the bad question is out of the denominator too: 1 of the 2 good ones answered
    s = questeval.score(q, {"q1": "二十公里", "q3": UN})
    assert (s.recall, s.precision, s.n_answered) == (0.5, 1.0, 1)


def test_a_judge_task_asks_only_the_good_questions_and_parses_answers() -> None:
    c = ctx()
    item = next(i for i in questeval_items(c) if i.quest_eval is not None)
    from pipeline.core.benchmark import JudgePrompts
    from pipeline.core.records import Generation

    gen = Generation.offline("crud_rag", item.item_id, "m", "m", "oracle", "全长二十公里。", {})
    prompts = JudgePrompts(c.prompts["quest_answer"], c.prompts["repair"], "per_output",
                           {"type": "json_object"})  # fmt: skip
    task = questeval.judge_task(gen, item, prompts)
    assert task.targets == ("q1",)  # the cached record's second question is a bad one
    (ask,) = task.asks
    assert isinstance(ask, Ask)
    sent = ask.request.messages[0]["content"]
    assert "全长二十公里。" in sent and "地铁线路全长多少公里？" in sent and "票价" not in sent
    verdicts, errors = ask.parse(json.dumps({"answers": ["二十公里"]}), ["q1"])
    assert verdicts["q1"].label == "二十公里" and errors == {}
    _, errors = ask.parse('{"answers": ["a", "b"]}', ["q1"])
    assert "2 answers for 1 questions" in errors["q1"]
    _, errors = ask.parse("not json at all", ["q1"])
    assert set(errors) == {"q1"}


def test_answers_parsing_rules() -> None:
    assert questeval._answers('{"answers": ["甲", "", 3]}', 3) == ["甲", UN, "3"]
    with pytest.raises(ParseError):
        questeval._answers('{"answers": "甲"}', 1)


def questeval_items(c):  # type: ignore[no-untyped-def]
    from pipeline.benchmarks.crud_rag.benchmark import CrudRag

    return CrudRag().construct(c, None).records


def test_rows_of_ragquesteval_by_hand_no_questions_excluded_and_an_invalid_answer() -> None:
    from pipeline.benchmarks.crud_rag.benchmark import CrudRag
    from pipeline.core.benchmark import Run
    from pipeline.core.records import Generation, Judgement, Verdict
    from tests.benchmarks.crud_rag.helpers import ctx

    bench = CrudRag()
    base = {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25", "top_k": 1}
    grid = {"oracle": True, "chunk": [], "chunk_overlap": [], "top_k": [], "base": base}
    c = ctx(tasks=["questanswer_1doc", "event_summary"], grid=grid)
    items = {i.item_id: i for i in bench.construct(c, None).records}
    qa = items["questanswer_1doc/qa1-1"]
    assert qa.quest_eval is not None and qa.quest_eval.kept() == [0]

    def gen(item_id: str, sample: int = 0) -> Generation:
        g = Generation.offline("crud_rag", item_id, "m", "m", "oracle", "某个回答。", {})
        return g.model_copy(update={"sample": sample})

    gens = [gen(qa.item_id), gen(qa.item_id, 1), gen("event_summary/es-1")]
    answer = qa.quest_eval.answers[0]
    bad = Verdict(target_id="q1", label="INVALID", status="invalid", raw="not JSON")
    js = [
        Judgement.of(
            "crud_rag", gens[0], "qe", "sha", "ok", [Verdict(target_id="q1", label=answer)]
        ),
        Judgement.of("crud_rag", gens[1], "qe", "sha", "invalid", [bad]),
        Judgement.of("crud_rag", gens[2], "qe", "sha", "ok", []),
    ]
    agg = aggregation.aggregate(bench, c, list(items.values()), [Run("m", "qe", gens, js)])
    rows = {r["task"]: r for r in agg.metrics["rows"]}
    q, es = rows["questanswer_1doc"], rows["event_summary"]
    assert (q["precision"], q["recall"]) == (100.0, 100.0)  # its own reference answer
    assert (q["n_items"], q["n_scored"], q["n_invalid"], q["n_invalid_verdicts"]) == (2, 1, 1, 1)
    assert q["invalid_reasons"] == {"not JSON": 1}
    # a record without a good question: left out and counted (was `n_no_questions`)
    assert (es["n_items"], es["n_scored"], es["n_excluded"]) == (1, 0, 1)
    assert es["excluded"] == {"no questions": 1} and es["precision"] is None
