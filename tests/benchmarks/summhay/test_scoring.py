"""SummHay scoring on hand-computed cases: the paper's worked examples and the edge cases.

Each expected number has its arithmetic in a comment.
"""

from __future__ import annotations

import pytest

from pipeline.benchmarks.summhay.scoring import (
    citation_prf,
    count_words,
    extract_bullets,
    extract_citations,
    macro,
    pool,
    resolve_link,
    score_summary,
    words_per_bullet,
)
from pipeline.core.records import Verdict

FULL, PARTIAL, NO = "FULL_COVERAGE", "PARTIAL_COVERAGE", "NO_COVERAGE"


def v(target: str, label: str, link: int | str | None = None, status: str = "ok") -> Verdict:
    return Verdict(target_id=target, label=label, link=link, status=status)  # type: ignore[arg-type]


# ------------------------------------------------------------------ Figure 2 of the paper

FIG2_SUMMARY = "\n".join(
    [
        "Here are the main insights regarding exam stress tips:",
        "- Students shared various methods for handling stress, including the use of meditation"
        " apps such as 'Calm' to promote relaxation and focus [79,11,46,53,54].",
        "- The **25-5 minute Pomodoro Technique** was discussed for its structure and possible"
        " positive impact on productivity and well-being [79,80].",
        "- A structured schedule for study and breaks was discussed as crucial for preventing"
        " stress and promoting effective exam preparation [80,23].",
    ]
)
FIG2_GOLD = {
    "pomodoro": [8, 32, 79, 83, 95],
    "calm": [11, 30, 46, 53, 79, 80],
    "breathing": [8, 32, 46, 53, 69, 91, 95],
}
# The preamble is line 1, so the bullets the judge links are lines 2 and 3.
FIG2_VERDICTS = [v("pomodoro", FULL, 3), v("calm", PARTIAL, 2), v("breathing", NO, "NA")]


def test_figure2_per_insight_citation_scores() -> None:
    bullets = extract_bullets(FIG2_SUMMARY)
    scores = score_summary(bullets, FIG2_VERDICTS, list(FIG2_GOLD), FIG2_GOLD)
    pomodoro, calm, breathing = scores
    # Pomodoro: cites {79, 80}, gold {8,32,79,83,95}: P = 1/2, R = 1/5, F1 = 2*.5*.2/.7 = 0.2857
    assert (pomodoro.precision, pomodoro.recall) == (0.5, 0.2)
    assert pomodoro.f1 == pytest.approx(2 / 7)
    # Calm: cites {79,11,46,53,54}, gold {11,30,46,53,79,80}: P = 4/5, R = 4/6, F1 = 0.7273
    assert calm.precision == pytest.approx(0.8)
    assert calm.recall == pytest.approx(4 / 6)
    assert calm.f1 == pytest.approx(8 / 11)
    assert not breathing.covered and breathing.f1 is None


def test_figure2_summary_scores() -> None:
    bullets = extract_bullets(FIG2_SUMMARY)
    p = pool(score_summary(bullets, FIG2_VERDICTS, list(FIG2_GOLD), FIG2_GOLD))
    # Coverage (100 + 50 + 0) / 3 = 50
    assert p.coverage == pytest.approx(50.0)
    # Citation over covered insights: (28.57 + 72.73) / 2 = 50.65 -> the paper's 51
    assert p.citation == pytest.approx(100 * (2 / 7 + 8 / 11) / 2)
    assert round(p.citation) == 51
    # Joint (100 * 0.2857 + 50 * 0.7273 + 0) / 3 = 21.65 -> the paper's table shows 22
    assert p.joint == pytest.approx((100 * 2 / 7 + 50 * 8 / 11) / 3)
    assert round(p.joint) == 22
    # The figure's "21.8" uses the F1s rounded to 0.29 and 0.73: (29 + 36.5) / 3 = 21.83
    assert abs((100 * 0.29 + 50 * 0.73) / 3 - 21.8) < 0.05


# ------------------------------------------------------------------ Figure 4 of the paper

FIG4_GOLD = {
    "breathing": [8, 32, 46, 53, 69, 91, 95],
    "walk": [11, 20, 48, 54, 80, 91],
    "pomodoro": [8, 32, 37, 48, 79, 83, 95],
    "calm": [11, 30, 46, 53, 79, 80],
    "affirmations": [13, 27, 37, 54, 68, 83],
}


@pytest.mark.parametrize(
    ("bullets", "verdicts", "expected"),
    [
        pytest.param(
            # Oracle + GPT-4o: F1 = .667, .727, .667, .545, .600
            [
                "b1 [8][11][46][53][91]",
                "b2 [11][53][54][80][91]",
                "b3 [8][11][37][53][54][79][83][95]",
                "b4 [11][53][79][83][91]",
                "b5 [37][46][83][13]",
            ],
            [
                v("breathing", PARTIAL, 1),
                v("walk", FULL, 2),
                v("pomodoro", FULL, 3),
                v("calm", PARTIAL, 4),
                v("affirmations", PARTIAL, 5),
            ],
            (70.0, 64.1, 46.0),
            id="oracle-gpt4o",
        ),
        pytest.param(
            # Random + Gemini-1.5-pro: F1 = .400, .667, .222
            ["b1 [4][46][95]", "b2 [46][53][80]", "b3 [46][74][80]", "b4 [53]", "b5 [53][95]"],
            [
                v("breathing", PARTIAL, 1),
                v("calm", PARTIAL, 2),
                v("walk", PARTIAL, 3),
                v("pomodoro", NO, "NA"),
                v("affirmations", NO, "NA"),
            ],
            (30.0, 43.0, 12.9),
            id="random-gemini",
        ),
        pytest.param(
            # Vector + GPT-3.5: every bullet cites {54,80,46}; F1 = .200, .444, 0
            ["b1 [54][80][46]"] * 5,
            [
                v("breathing", PARTIAL, 2),
                v("walk", PARTIAL, 3),
                v("pomodoro", PARTIAL, 4),
                v("calm", NO, "NA"),
                v("affirmations", NO, "NA"),
            ],
            (30.0, 21.5, 6.4),
            id="vector-gpt35",
        ),
    ],
)
def test_figure4_examples(
    bullets: list[str], verdicts: list[Verdict], expected: tuple[float, float, float]
) -> None:
    p = pool(score_summary(bullets, verdicts, list(FIG4_GOLD), FIG4_GOLD))
    assert (
        round(p.coverage or -1, 1),
        round(p.citation or -1, 1),
        round(p.joint or -1, 1),
    ) == expected


# ------------------------------------------------------------------ edge cases

GOLD = {"a": [1, 2], "b": [3]}


def test_no_bullets_paper_mode_is_a_bad_link_not_a_crash() -> None:
    # An empty summary judged FULL for "a": there is no bullet to read citations from.
    scores = score_summary([], [v("a", FULL, 1), v("b", NO, "NA")], list(GOLD), GOLD, "paper")
    a, _ = scores
    assert a.covered and a.bad_link and a.f1 == 0.0
    p = pool(scores)
    # Coverage (100 + 0) / 2 = 50; Citation 0 over 1 covered; Joint 0
    assert (p.coverage, p.citation, p.joint, p.n_bad_links) == (50.0, 0.0, 0.0, 1)


def test_no_bullets_corrected_mode_is_invalid() -> None:
    scores = score_summary([], [v("a", FULL, 1), v("b", NO, "NA")], list(GOLD), GOLD, "corrected")
    p = pool(scores)
    # "a" is left out (no bullet 1), "b" scores 0: Coverage 0 over 1 insight, no Citation.
    assert (p.coverage, p.citation, p.n_insights, p.n_invalid) == (0.0, None, 1, 1)


def test_empty_summary_with_no_coverage_has_undefined_citation() -> None:
    p = pool(score_summary([], [v("a", NO, "NA"), v("b", NO, "NA")], list(GOLD), GOLD))
    assert (p.coverage, p.citation, p.joint) == (0.0, None, 0.0)


def test_bullet_without_citations_scores_zero_citation() -> None:
    # Covered by a bullet that cites nothing: P = 0 (no citations), R = 0, F1 = 0.
    scores = score_summary(["no citation here"], [v("a", FULL, 1)], ["a"], GOLD)
    assert (scores[0].precision, scores[0].recall, scores[0].f1) == (0.0, 0.0, 0.0)
    p = pool(scores)
    assert (p.coverage, p.citation, p.joint) == (100.0, 0.0, 0.0)


def test_insight_with_no_gold_document() -> None:
    # Gold set empty: R = 0 (nothing to recall), P = 0/2 = 0, F1 = 0; Coverage still counts.
    gold = {"a": [], "b": [3]}
    scores = score_summary(
        ["x [1][2]", "y [3]"], [v("a", PARTIAL, 1), v("b", FULL, 2)], ["a", "b"], gold
    )
    assert (scores[0].precision, scores[0].recall, scores[0].f1) == (0.0, 0.0, 0.0)
    p = pool(scores)
    # Coverage (50 + 100) / 2 = 75; Citation (0 + 1) / 2 = 50; Joint (50*0 + 100*1) / 2 = 50
    assert (p.coverage, p.citation, p.joint) == (75.0, 50.0, 50.0)


def test_out_of_range_bullet_id() -> None:
    bullets = ["x [1]", "y [2]"]
    # Paper mode: bullet 7 of 2 does not exist -> no citations, F1 0, counted.
    paper = score_summary(bullets, [v("a", FULL, 7)], ["a"], GOLD, "paper")
    assert paper[0].bad_link and paper[0].f1 == 0.0
    assert pool(paper).n_bad_links == 1 and pool(paper).coverage == 100.0
    # Corrected mode: the verdict is unusable, left out and counted as invalid.
    corrected = score_summary(
        bullets, [v("a", FULL, 7), v("b", NO, "NA")], ["a", "b"], GOLD, "corrected"
    )
    p = pool(corrected)
    assert (p.n_invalid, p.n_insights, p.coverage) == (1, 1, 0.0)


def test_unparseable_bullet_id_falls_on_second_to_last_bullet_in_paper_mode() -> None:
    bullets = ["one [1]", "two [2]", "three [3]"]
    # int("2a") fails -> -1 -> bullets[-2] == "two [2]": cites {2}, gold of "a" is {1,2}
    # P = 1, R = 1/2, F1 = 2/3.
    paper = score_summary(bullets, [v("a", FULL, "2a")], ["a"], GOLD, "paper")
    assert paper[0].bullet_index == 1
    assert paper[0].f1 == pytest.approx(2 / 3)
    corrected = score_summary(bullets, [v("a", FULL, "2a")], ["a"], GOLD, "corrected")
    assert corrected[0].status == "invalid"


def test_resolve_link_rules() -> None:
    # paper: Python indexing of bullets[int(id) - 1], -1 for an unparseable id
    assert resolve_link(1, 3, "paper") == 0
    assert resolve_link("3", 3, "paper") == 2
    assert resolve_link(0, 3, "paper") == -1  # bullets[-1]: the last bullet
    assert resolve_link("NA", 3, "paper") == -2  # bullets[-2]
    assert resolve_link("NA", 1, "paper") is None  # bullets[-2] of one bullet: none
    assert resolve_link(4, 3, "paper") is None
    # corrected: only 1..n
    assert resolve_link(" 2 ", 3, "corrected") == 1
    assert resolve_link(0, 3, "corrected") is None
    assert resolve_link("NA", 3, "corrected") is None
    assert resolve_link(None, 3, "corrected") is None


def test_invalid_judge_verdict_is_counted_not_scored_zero() -> None:
    scores = score_summary(["x [1]"], [v("a", "GARBAGE", 1), v("b", FULL, 1)], ["a", "b"], GOLD)
    p = pool(scores)
    assert p.n_invalid == 1
    assert p.n_insights == 1
    assert p.coverage == 100.0  # only "b" is scored


def test_corrected_mode_flags_missing_and_duplicate_verdicts() -> None:
    gold = {"a": [1], "b": [2], "c": [3]}
    verdicts = [v("a", FULL, 1), v("a", NO, "NA"), v("b", FULL, 1)]  # "a" twice, "c" missing
    scores = score_summary(["x [1]"], verdicts, ["a", "b", "c"], gold, "corrected")
    assert [s.status for s in scores] == ["invalid", "ok", "invalid"]
    # Paper mode scores the verdicts as given, one score each.
    assert len(score_summary(["x [1]"], verdicts, ["a", "b", "c"], gold, "paper")) == 3


def test_verdict_for_unknown_insight_is_an_error() -> None:
    with pytest.raises(ValueError, match="zzz"):
        score_summary(["x"], [v("zzz", FULL, 1)], ["a"], GOLD)


def test_macro_differs_from_pooled() -> None:
    gold = {"a": [1], "b": [2], "c": [3]}
    s1 = score_summary(["x [1]"], [v("a", FULL, 1)], ["a"], gold)  # cov 100, F1 1
    s2 = score_summary(["x [9]"], [v("b", NO, "NA"), v("c", FULL, 1)], ["b", "c"], gold)
    # pooled Coverage: (100 + 0 + 100) / 3 = 66.67; macro: (100 + 50) / 2 = 75
    assert pool([*s1, *s2]).coverage == pytest.approx(200 / 3)
    m = macro([s1, s2])
    assert m.coverage == pytest.approx(75.0)
    # Citation: summary 1 -> 100, summary 2 -> 0 (cites 9, gold 3) -> macro 50
    assert m.citation == pytest.approx(50.0)
    # Joint: summary 1 -> 100; summary 2 -> (0 + 0) / 2 = 0 -> macro 50
    assert m.joint == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a [1,2]", [1, 2]),
        ("a [1][2]", [1, 2]),
        ("a [ 3 , 4 ] and [5]", [3, 4, 5]),
        ("- * **Bold** [4][46][95]", [4, 46, 95]),
        ("no [a] citations [1a]", []),
        ("empty [] and [,]", []),
    ],
)
def test_extract_citations(text: str, expected: list[int]) -> None:
    assert extract_citations(text) == expected


def test_extract_bullets_and_words() -> None:
    assert extract_bullets("  a \n\n b\n   \n") == ["a", "b"]
    assert count_words("The cat sat [1][2] down [3, 4].") == 5
    # (4 words + 2 words) / 2 bullets = 3
    assert words_per_bullet(["one two three four [1]", "five six"]) == 3.0
    assert words_per_bullet([]) is None


def test_citation_prf() -> None:
    assert citation_prf(set(), {1}) == (0.0, 0.0, 0.0)
    assert citation_prf({1, 2}, {1, 2}) == (1.0, 1.0, 1.0)
    p, r, f1 = citation_prf({1, 2, 3, 4}, {1})
    # P = 1/4, R = 1, F1 = 2 * .25 / 1.25 = 0.4
    assert (p, r, f1) == (0.25, 1.0, pytest.approx(0.4))


def test_partial_credit_is_configurable() -> None:
    scores = score_summary(["x [1][2]"], [v("a", PARTIAL, 1)], ["a"], GOLD, partial_credit=0.25)
    assert pool(scores).coverage == 25.0
