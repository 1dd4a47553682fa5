"""KPR on hand-computed cases: macro over questions, neutral, exclusions, breakdowns."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.benchmarks.long2rag.benchmark import Long2Rag
from pipeline.benchmarks.long2rag.schema import KeyPoint, L2Document, Question
from pipeline.benchmarks.long2rag.scoring import (
    QuestionVerdicts,
    breakdown,
    bucket_order,
    entailed,
    kpr,
    length_bucket,
    paired_ratings,
    question_recall,
)
from pipeline.core import aggregation
from pipeline.core.benchmark import Run
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement, Verdict
from tests.join_faults import FAULTS, faulty_run

# q1: 3 key points (yes, no, neutral)         -> 1/3   (neutral entailed: 2/3)
# q2: 1 key point  (yes)                      -> 1     (1)
# q3: 4 key points (yes, yes, neutral, no)    -> 1/2   (3/4)
# q4: no key points                           -> excluded, counted
QS = [
    QuestionVerdicts("q1", ("yes", "no", "neutral")),
    QuestionVerdicts("q2", ("yes",)),
    QuestionVerdicts("q3", ("yes", "yes", "neutral", "no")),
    QuestionVerdicts("q4", ()),
]


def test_kpr_is_the_mean_over_questions_of_per_question_recall() -> None:
    r = kpr(QS)
    assert r.kpr == pytest.approx((1 / 3 + 1 + 1 / 2) / 3)  # 0.6111, not the micro 4/8 = 0.5
    assert r.kpr == pytest.approx(0.611111, abs=1e-6)
    assert (r.n_questions, r.n_key_points, r.n_excluded_questions) == (3, 8, 1)
    assert r.invalid_verdicts == 0 and r.n_unjudged_questions == 0


def test_neutral_counts_as_entailed_when_asked() -> None:
    r = kpr(QS, neutral="entailed")
    assert r.kpr == pytest.approx((2 / 3 + 1 + 3 / 4) / 3)  # 0.8056
    assert r.kpr == pytest.approx(0.805556, abs=1e-6)


def test_only_excluded_questions_give_none_not_zero() -> None:
    r = kpr([QuestionVerdicts("q", ()), QuestionVerdicts("p", ())])
    assert r.kpr is None and r.n_questions == 0 and r.n_excluded_questions == 2
    assert kpr([]).kpr is None


def test_invalid_verdicts_leave_the_denominator_and_are_counted() -> None:
    r = kpr([QuestionVerdicts("q1", ("yes", None, "no")), QuestionVerdicts("q2", (None,))])
    assert r.kpr == pytest.approx(0.5)  # q1: 1 of 2 usable; q2: no usable verdict
    assert r.invalid_verdicts == 2 and r.n_unjudged_questions == 1 and r.n_questions == 1
    assert question_recall([None, None]) is None


def test_all_neutral_question_scores_zero_by_default() -> None:
    assert question_recall(["neutral", "neutral"]) == 0.0
    assert question_recall(["neutral", "neutral"], "entailed") == 1.0


def test_unknown_labels_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown verdict"):
        entailed("maybe")
    with pytest.raises(ValueError, match="neutral mode"):
        entailed("yes", "half")


def test_breakdown_restricts_eq2_to_each_group() -> None:
    groups = {"q1": "A", "q2": "B", "q3": "A", "q4": "B"}
    out = breakdown(QS, groups.__getitem__)
    assert out["A"].kpr == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert out["B"].kpr == pytest.approx(1.0) and out["B"].n_excluded_questions == 1


def test_length_buckets() -> None:
    edges = [8000, 16000, 25000, 32000]
    assert [length_bucket(n, edges) for n in (0, 7999, 8000, 24999, 32000, 10**6)] == [
        "<8000",
        "<8000",
        "8000-16000",
        "16000-25000",
        ">=32000",
        ">=32000",
    ]
    assert bucket_order(edges) == ["<8000", "8000-16000", "16000-25000", "25000-32000", ">=32000"]
    assert length_bucket(5, []) == "all" and bucket_order([]) == ["all"]


def test_paired_ratings_binary_and_three_way() -> None:
    a = {"u1": "yes", "u2": "neutral", "u3": None, "u4": "no"}
    b = {"u1": "yes", "u2": "no", "u3": "yes", "u5": "no"}
    assert paired_ratings(a, b) == [("yes", "yes"), ("neutral", "no")]
    assert paired_ratings(a, b, "not_entailed") == [
        ("entailed", "entailed"),
        ("not_entailed", "not_entailed"),
    ]


def _q(item: str, n_kp: int, domain: str, category: str, words: int = 2) -> Question:
    docs = [L2Document(doc_id=f"d{i}", text=" ".join(["text"] * words)) for i in range(5)]
    kps = [KeyPoint(text=f"point {k}", doc_id="d0") for k in range(n_kp)]
    return Question(
        item_id=item,
        question="?",
        domain=domain,
        category=category,
        documents=docs,
        key_points=kps,
    )


BENCH = Long2Rag()


def _ctx(edges: list[int]) -> Any:
    scoring = SimpleNamespace(neutral="not_entailed", length_buckets=edges)
    section = SimpleNamespace(scoring=scoring, judges=["j"], source="x.jsonl")
    return SimpleNamespace(section=section, params=SimpleNamespace(seed=0, models={}))


def _records() -> tuple[list[Question], list[Generation], list[Judgement]]:
    # q2's five documents hold 5 x 2000 tokens: the >=8000 bucket; q1's 10
    dataset = [
        _q("q1", 3, "news", "c1"),
        _q("q2", 1, "news", "c2", words=2000),
        _q("q4", 0, "conv", "c1"),
    ]
    gens = [
        Generation(
            benchmark="long2rag",
            item_id=i,
            model="m",
            system="m",
            setting="long_context",
            status="ok",
            text="x",
            meta={"truncated": True, "truncation": "stopped at max_tokens (5)"}
            if i == "q2"
            else {},
        )
        for i in ("q1", "q2", "q4")
    ]
    gens.append(
        Generation(
            benchmark="long2rag",
            item_id="q1",
            model="m",
            system="m",
            setting="rag_512",
            status="error",
            error="boom",
        )
    )
    labels = {"q1": ["yes", "no", "neutral"], "q2": ["yes"], "q4": []}
    js = [
        Judgement(
            benchmark="long2rag",
            generation_id=g.generation_id,
            item_id=g.item_id,
            model="m",
            system="m",
            setting=g.setting,
            judge="j",
            judge_prompt_sha="s",
            status="ok",
            verdicts=[
                Verdict(target_id=f"kp{k}", label=lab)
                for k, lab in enumerate(labels[g.item_id], start=1)
            ],
        )
        for g in gens
        if g.status == "ok"
    ]
    return dataset, gens, js


def test_rows_from_records() -> None:
    dataset, gens, js = _records()
    out = aggregation.aggregate(BENCH, _ctx([8000]), dataset, [Run("m", "j", gens, js)])
    by_setting = {r["setting"]: r for r in out.metrics["rows"]}
    lc = by_setting["long_context"]
    assert lc["kpr"] == pytest.approx((1 / 3 + 1) / 2)
    assert (lc["n_scored"], lc["n_key_points"], lc["n_excluded"]) == (2, 4, 1)
    assert lc["excluded"] == {"no key points": 1} and lc["n_items"] == 3
    assert lc["by_domain"]["news"]["kpr"] == pytest.approx(2 / 3)
    assert "conv" not in lc["by_domain"]  # its one question is excluded (no key points)
    assert lc["by_length"]["<8000"]["kpr"] == pytest.approx(1 / 3)
    assert lc["by_length"][">=8000"]["kpr"] == pytest.approx(1.0)
    # q2's answer was cut for length and kept: scored (its KPR is in the mean) and counted
    assert (lc["n_truncated"], lc["n_failed_generations"]) == (1, 0)
    rag = by_setting["rag_512"]
    assert rag["kpr"] is None and rag["n_failed_generations"] == 1 and rag["n_scored"] == 0
    assert rag["n_truncated"] == 0
    run = next(r for r in out.runs if r.params["setting"] == "long_context")
    assert [x["item_id"] for x in run.artifacts["items.jsonl"]] == ["q1", "q2"]  # type: ignore[index]
    assert run.metrics["kpr.domain.news"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("fault", FAULTS)
def test_join_errors_name_the_file_and_line(fault: str) -> None:
    """The stage layer's join, the same in every benchmark: an orphan, a duplicate or a
    missing judgement and a generation of an unknown item are errors naming file:line."""
    dataset, gens, js = _records()
    gens = [g for g in gens if g.status == "ok"]
    run, where = faulty_run(fault, gens, js, "q9")
    with pytest.raises(DataError) as e:
        aggregation.aggregate(BENCH, _ctx([8000]), dataset, [run])
    assert where in str(e.value)


def test_agreement_rows_free_marginal_kappa_by_hand() -> None:
    from pipeline.benchmarks.long2rag.aggregate import agreement_rows

    def judgement(judge: str, labels: list[str | None]) -> Judgement:
        return Judgement(
            benchmark="long2rag",
            generation_id="q1|long_context|m|0",
            item_id="q1",
            model="m",
            system="m",
            setting="long_context",
            judge=judge,
            judge_prompt_sha="s",
            status="ok",
            verdicts=[
                Verdict(
                    target_id=f"kp{k}", label=lab or "INVALID", status="ok" if lab else "invalid"
                )
                for k, lab in enumerate(labels, start=1)
            ],
        )

    a = Run("m", "a", [], [judgement("a", ["yes", "no", "neutral", "yes", "yes"])])
    b = Run("m", "b", [], [judgement("b", ["yes", "yes", "neutral", "no", None])])
    other = Run("x", "c", [], [])
    (row,) = agreement_rows([a, b, other], "not_entailed")
    # 4 units judged by both (kp5 is invalid for b).
    # three-way: agree on kp1, kp3 -> P_o = 2/4, P_e = 1/3 -> (1/2 - 1/3) / (2/3) = 0.25
    assert row["n_units_three_way"] == 4
    assert row["kappa_free_three_way"] == pytest.approx(0.25)
    # binary (neutral = not entailed): a = E N N E, b = E E N N -> P_o = 2/4, P_e = 1/2 -> 0
    assert row["kappa_free_binary"] == pytest.approx(0.0)
    # neutral counted as entailed: a = E N E E, b = E E E N -> P_o = 2/4 -> 0 as well;
    # with kp2 agreeing instead, P_o = 3/4 -> (3/4 - 1/2) / (1/2) = 0.5
    b2 = Run("m", "b", [], [judgement("b", ["yes", "no", "neutral", "no", None])])
    (row2,) = agreement_rows([a, b2], "entailed")
    assert row2["kappa_free_binary"] == pytest.approx(0.5)
    assert row2["kappa_free_three_way"] == pytest.approx((3 / 4 - 1 / 3) / (2 / 3))
