"""Long²RAG schema validation, construction parsers, the judges' adapters, context building."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.long2rag import construction, derived, generation, judging
from pipeline.benchmarks.long2rag.params import Long2ragGeneration, Long2ragParams
from pipeline.benchmarks.long2rag.schema import KeyPoint, L2Document, Question, parse_questions
from pipeline.core import registry
from pipeline.core.errors import DataError
from pipeline.core.parse import ParseError
from pipeline.core.records import Generation, Judgement
from pipeline.data.haystacks import RawHaystack, normalise
from pipeline.stages.common import FileInputs
from pipeline.stages.judge import coverage_judgements

FILES = FileInputs(Path("/"))
NO_CTX: Any = None


def load_questions(path: Path, n_documents: int | None = 5) -> list[Question]:
    return parse_questions(FILES.jsonl(str(path)), str(path), n_documents)


# ---------------------------------------------------------------- schema


def _record(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "item_id": "q1",
        "question": "Why?",
        "domain": "Biology",
        "category": "Causal",
        "documents": [{"doc_id": f"d{i}", "text": f"Text {i}."} for i in range(1, 6)],
        "key_points": [{"text": "A point.", "doc_id": "d2"}],
    }
    rec.update(over)
    return rec


def _write(tmp_path: Path, *recs: dict[str, Any]) -> Path:
    p = tmp_path / "qs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return p


def test_loader_reads_a_valid_file_and_numbers_key_points(tmp_path: Path) -> None:
    (q,) = load_questions(_write(tmp_path, _record()))
    assert q.key_points[0].kp_id == "kp1" and q.key_points[0].doc_id == "d2"
    assert q.documents[0].url is None


@pytest.mark.parametrize(
    ("rec", "field", "message"),
    [
        (_record(question=""), "question", "at least 1 character"),
        (_record(documents=_record()["documents"][:4]), "documents", "expected 5"),
        (_record(key_points=[{"text": "x", "doc_id": "d9"}]), "key_points[0].doc_id", "d9"),
        (_record(key_points=[{"text": "", "doc_id": "d1"}]), "key_points[0].text", "at least"),
        (
            _record(documents=[{"doc_id": "d1", "text": "t"}] * 5),
            "documents",
            "appears twice",
        ),
        (_record(domain=None), "domain", "valid string"),
    ],
)
def test_loader_errors_name_line_item_and_field(
    tmp_path: Path, rec: dict[str, Any], field: str, message: str
) -> None:
    path = _write(tmp_path, _record(item_id="ok"), rec)
    with pytest.raises(DataError) as e:
        load_questions(path)
    assert e.value.file == f"{path}:2" and e.value.item == "q1"
    assert e.value.field == field and message in str(e.value)


def test_loader_rejects_duplicate_ids_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="item_id already used on line 1"):
        load_questions(_write(tmp_path, _record(), _record()))
    p = tmp_path / "bad.jsonl"
    p.write_text('{"item_id": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl:1.*not valid JSON"):
        load_questions(p)


# ---------------------------------------------------------------- construction parsers


def test_exactly_once_check_names_missing_and_doubled_points() -> None:
    construction.check_exactly_once([[1, 2], [3]], 3)
    with pytest.raises(ParseError) as e:
        construction.check_exactly_once([[1, 2], [2], [5]], 4)
    msg = str(e.value)
    assert "[3, 4] are in no merged point" in msg
    assert "[2] are in more than one" in msg
    assert "number(s) [5]" in msg


def test_parse_aggregation() -> None:
    ok = json.dumps(
        {"key_points": [{"text": "A", "sources": [2, 1]}, {"text": "B", "sources": [3]}]}
    )
    assert construction.parse_aggregation(ok, 3) == [("A", [2, 1]), ("B", [3])]
    with pytest.raises(ParseError, match="no merged point"):
        construction.parse_aggregation(ok, 4)
    with pytest.raises(ParseError, match="sources"):
        construction.parse_aggregation('{"key_points": [{"text": "A", "sources": []}]}', 1)
    with pytest.raises(ParseError, match="not valid JSON"):
        construction.parse_aggregation("merged: A", 1)


def test_parse_score_and_lists() -> None:
    assert construction.parse_score('{"score": 0.7}') == 0.7
    for bad in ('{"score": 1.5}', '{"score": "high"}', '{"score": true}'):
        with pytest.raises(ParseError):
            construction.parse_score(bad)
    assert construction.parse_string_list('{"points": [" a ", "", "b"]}', "points") == ["a", "b"]
    with pytest.raises(ParseError):
        construction.parse_string_list('{"points": "a"}', "points")


# ---------------------------------------------------------------- judges


def test_llm_verdict_parsers() -> None:
    assert judging.parse_single('{"verdict": "[Yes]"}') == "yes"
    with pytest.raises(ParseError, match="verdict"):
        judging.parse_single('{"verdict": "probably"}')
    good, bad = judging.parse_batch(
        json.dumps(
            {
                "verdicts": [
                    {"claim_id": "kp1", "verdict": "no"},
                    {"claim_id": "kp2", "verdict": "maybe"},
                ]
            }
        ),
        ["kp1", "kp2", "kp3"],
    )
    assert good == {"kp1": "no"} and set(bad) == {"kp2", "kp3"}


@dataclass(frozen=True)
class _V:
    label: str
    bullet: int | None
    proba: tuple[float, float, float]


class KeywordCoverage:
    """A small deterministic coverage judge (the local judge's judge_many interface): FULL when
    a bullet contains the insight's first word and its last word, PARTIAL when only the first."""

    sha = "keyword-v1"

    def __init__(self) -> None:
        self.seen: list[tuple[list[str], list[str]]] = []

    def judge_many(self, cases: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[list[_V]]:
        out = []
        for insights, bullets in cases:
            self.seen.append((list(insights), list(bullets)))
            row = []
            for ins in insights:
                first, last = ins.split()[0].lower(), ins.split()[-1].lower().strip(".")
                label, at = "NO_COVERAGE", None
                for k, b in enumerate(bullets, start=1):
                    low = b.lower()
                    if first in low and last in low:
                        label, at = "FULL_COVERAGE", k
                        break
                    if first in low and label == "NO_COVERAGE":
                        label, at = "PARTIAL_COVERAGE", k
                row.append(_V(label, at, (0.0, 0.0, 1.0)))
            out.append(row)
        return out


def _judged(judge: Any, kps: list[tuple[str, str]], answer: str) -> Judgement:
    """One answer judged by a coverage judge through the stage layer, as Long²RAG sees it."""
    q = Question(
        item_id="q",
        question="?",
        domain="d",
        category="c",
        documents=[L2Document(doc_id="d1", text="x")],
        key_points=[KeyPoint(kp_id=k, text=t, doc_id="d1") for k, t in kps],
    )
    gen = Generation(
        benchmark="long2rag",
        item_id="q",
        model="m",
        system="m",
        setting="long_context",
        status="ok",
        text=answer,
    )
    # Long2RAG's coverage cases do not read the context
    (j,) = coverage_judgements(registry.get("long2rag"), NO_CTX, "kw", judge, {"q": q}, [gen])
    return j


def test_local_adapter_maps_coverage_to_entailment() -> None:
    judge = KeywordCoverage()
    answer = "- Rivers flood in spring.\n- Engines need oil and fuel. Unrelated words here."
    kps = [("kp1", "Rivers flood spring"), ("kp2", "Engines need water"), ("kp3", "Birds sing")]
    j = _judged(judge, kps, answer)
    assert j.judge_prompt_sha == "keyword-v1" and j.status == "ok"
    vs = j.verdicts
    assert [(v.target_id, v.label, v.link) for v in vs] == [
        ("kp1", "yes", 1),
        ("kp2", "neutral", 2),
        ("kp3", "no", None),
    ]
    assert [v.raw for v in vs] == ["FULL_COVERAGE", "PARTIAL_COVERAGE", "NO_COVERAGE"]
    # the key points are the insights, the answer's sentences (markers removed) the bullets
    assert judge.seen == [
        (
            ["Rivers flood spring", "Engines need water", "Birds sing"],
            ["Rivers flood in spring.", "Engines need oil and fuel.", "Unrelated words here."],
        )
    ]


def test_local_adapter_rejects_a_judge_that_miscounts() -> None:
    class Short:
        sha = "short"

        def judge_many(
            self, cases: Sequence[tuple[Sequence[str], Sequence[str]]]
        ) -> list[list[_V]]:
            return [[] for _ in cases]

    with pytest.raises(ValueError, match="0 verdicts for 1 units"):
        _judged(Short(), [("kp1", "x")], "y.")


def test_overlap_judge() -> None:
    judge = judging.OverlapCoverage(full=0.6, partial=0.3)
    ((full, partial, none),) = judge.judge_many(
        [
            (
                ["Glaciers melt faster in warm summers", "Glaciers feed rivers downstream", "Cats"],
                ["In warm summers glaciers melt faster.", "Rivers are long."],
            )
        ]
    )
    assert (full.label, full.bullet) == ("FULL_COVERAGE", 1)
    # content words glaciers, feed, rivers, downstream: "rivers" (1/4) in bullet 2, "glaciers" in 1
    assert partial.label == "NO_COVERAGE"
    assert (none.label, none.bullet) == ("NO_COVERAGE", None)
    ((v,),) = judge.judge_many([(["glaciers feed rivers downstream"], ["Glaciers feed lakes."])])
    assert (v.label, v.bullet) == ("PARTIAL_COVERAGE", 1)  # 2 of 4 words


# ---------------------------------------------------------------- generation


def _question(texts: list[str]) -> Question:
    return Question(
        item_id="q",
        question="solar panels efficiency",
        domain="d",
        category="c",
        documents=[L2Document(doc_id=f"d{i}", text=t) for i, t in enumerate(texts)],
    )


def test_rag_context_respects_the_budget_and_picks_relevant_chunks() -> None:
    filler = " ".join(f"Weather note {k} about rain and clouds." for k in range(80))
    target = "Solar panels efficiency rose to record levels in new cells."
    q = _question([filler, filler + " " + target, filler, filler, filler])
    cfg = Long2ragGeneration(chunk_tokens=32, chunk_overlap=4)
    ctx = generation.build_context(q, "rag_64", cfg)
    assert 0 < ctx.n_tokens <= 64
    assert "Solar panels efficiency" in ctx.render()
    assert ctx.chunks[0][0] == "d1"  # the best chunk is the one with the query's words
    full = generation.build_context(q, "long_context", cfg)
    assert full.chunks == [] and full.n_tokens > 5 * 500 and target in full.render()


def test_chunks_overlap_and_cover_the_document() -> None:
    text = " ".join(f"w{k}" for k in range(300))
    chunks = generation.chunk_document(0, text, 50, 10)
    assert chunks[0].start == 0 and chunks[1].start == 40 and chunks[-1].end > chunks[-2].end
    assert all(c.end - c.start <= 50 for c in chunks)
    with pytest.raises(Exception, match="unknown setting"):
        generation.rag_budget("rag_x")


def test_lead_answer_takes_sentences_in_turn_up_to_the_word_limit() -> None:
    docs = ["A one. A two. A three.", "B one. B two."]
    assert generation.lead_answer(docs, 100) == "A one. B one. A two. B two. A three."
    assert generation.lead_answer(docs, 5) == "A one. B one. A"


# ---------------------------------------------------------------- derived dataset


def test_derived_questions_from_a_mini_haystack(haystack: dict[str, Any]) -> None:
    haystack["documents"][2]["document_text"] = "What about one? Doc three."
    hay = normalise("news1", RawHaystack.model_validate(haystack), source_file="x.json")
    qs = derived.questions_from_haystack(hay, n_documents=2, retriever="bm25")
    q1, q2 = qs
    assert q1.question == "What about one?" and q1.derived_from == "summhay"
    assert q1.domain == "news" and q1.category == "news1"
    # BM25 for "What about one?" ("what", "about" are stopwords): "one" is in d1 and d3, and the
    # shorter d1 scores higher; d2 has no query word
    assert [d.doc_id for d in q1.documents] == ["d1", "d3"]
    # i1 is in d1 and d2, i2 in d3: both among the top 2 documents
    assert [(k.kp_id, k.doc_id, k.support) for k in q1.key_points] == [
        ("i1", "d1", ["d1"]),
        ("i2", "d3", ["d3"]),
    ]
    # "two" is only in d2; then haystack order on the tie at 0
    assert [d.doc_id for d in q2.documents] == ["d2", "d1"]
    assert [(k.kp_id, k.doc_id) for k in q2.key_points] == [("i3", "d2")]
    # with one document, s1 keeps only the insight that document holds
    (q1_top1, _) = derived.questions_from_haystack(hay, n_documents=1, retriever="bm25")
    assert [k.kp_id for k in q1_top1.key_points] == ["i1"]
    assert q1_top1.meta["insights_in_haystack"] == 2


# ---------------------------------------------------------------- params


def _params(**l2: Any) -> dict[str, Any]:
    import yaml

    raw: dict[str, Any] = yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8"))
    raw["long2rag"].update(l2)
    return raw


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"settings": ["long_context", "rag_big"]}, "unknown setting 'rag_big'"),
        ({"models": ["published"]}, "provider published, which long2rag cannot run"),
        ({"judges": ["nope"]}, "not defined under judges"),
        ({"construction": {"llm": "l2r-overlap"}}, "not an openai judges entry"),
        ({"scoring": {"length_buckets": [16000, 8000]}}, "positive and increasing"),
        ({"generation": {"chunk_tokens": 16, "chunk_overlap": 16}}, "chunk_overlap"),
    ],
)
def test_params_are_checked(over: dict[str, Any], message: str) -> None:
    from pipeline.core.errors import ConfigError
    from pipeline.core.params import validate_params

    validate_params(_params(), benchmarks=["long2rag"])  # the shipped params are valid
    with pytest.raises(ConfigError, match=message):
        validate_params(_params(**over), benchmarks=["long2rag"])


def test_plot_bytes_are_deterministic() -> None:
    from pipeline.benchmarks.long2rag.report import plot_png

    row = {
        "system": "s",
        "setting": "rag_512",
        "judge": "j",
        "by_domain": {"news": {"kpr": 0.5, "n_questions": 2}},
        "by_category": {
            "c1": {"kpr": None, "n_questions": 0},
            "c2": {"kpr": 1.0, "n_questions": 1},
        },
    }
    png = plot_png(row)
    assert png.startswith(b"\x89PNG") and png == plot_png(row)
    # the figure is reused across rows: a row drawn after another gives the bytes it gives
    # first (no bar, title or scale left over from the other row)
    from pipeline.benchmarks.long2rag import report

    other = {**row, "system": "t", "by_category": {"c1": {"kpr": 0.9}, "c2": {"kpr": 0.1}}}
    assert plot_png(other) != png
    assert plot_png(row) == png
    report._FIGURES.clear()
    assert plot_png(row) == png


# ---------------------------------------------------------------- a model's own settings


SLOW = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "slow"}


def _slow(settings: Any) -> dict[str, Any]:
    raw = _params(models=["lead", "extractive", "slow"])
    raw["models"]["slow"] = {**SLOW, "settings": settings}
    return raw


@pytest.mark.parametrize("settings", [["rag_512"], {"long2rag": ["rag_512"]}])
def test_a_slow_model_runs_only_the_settings_it_picks(settings: Any) -> None:
    from pipeline.core.params import validate_params
    from pipeline.core.prompts import Prompt

    params = validate_params(_slow(settings))
    section = params.section("long2rag", Long2ragParams)
    q = _question(["Solar panels are efficient. " * 40] * 5)
    prompt = Prompt(path="p.txt", text="${question}\n${documents}", sha="p")
    planned = generation.plan(section, "slow", params.models["slow"], [q], prompt)
    assert [p.setting for p in planned] == ["rag_512"]
    # the other models keep every setting of the section (lead's [oracle, bm25] are SummHay's)
    lead = generation.offline(section, "lead", params.models["lead"], [q])
    assert [g.setting for g in lead] == ["long_context", "rag_512", "rag_1024", "rag_2048"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["rag_64"], r"models\.slow\.settings: unknown setting 'rag_64': no benchmark has it"
         r" \(those that run 'slow': long2rag: long_context, rag_512, rag_1024, rag_2048;"),
        ({"long2rag": ["rag_512", "oracle"]}, r"models\.slow\.settings\.long2rag: unknown"
         r" setting 'oracle' \(long2rag has: long_context, rag_512, rag_1024, rag_2048\)"),
        ({"summhay": ["oracle"]}, r"models\.slow\.settings\.summhay: summhay\.models does not"
         r" list 'slow'"),
        ({"crux": ["x"]}, r"models\.slow\.settings\.crux: crux\.models does not list 'slow'"),
        ({"nope": ["x"]}, r"models\.slow\.settings\.nope: no benchmark section 'nope'"),
    ],
)  # fmt: skip
def test_an_unknown_setting_of_a_model_is_refused(settings: Any, message: str) -> None:
    from pipeline.core.errors import ConfigError
    from pipeline.core.params import validate_params

    with pytest.raises(ConfigError, match=message):
        validate_params(_slow(settings))


def test_a_list_may_name_settings_of_a_benchmark_that_does_not_run_the_model() -> None:
    """lead's [oracle, bm25] are SummHay's: a project that runs lead in Long²RAG alone keeps
    it (Long²RAG runs all of its own); a name no benchmark has is refused wherever it runs."""
    from pipeline.core.errors import ConfigError
    from pipeline.core.params import validate_params

    raw = _params()
    raw["summhay"]["models"].remove("lead")
    validate_params(raw)
    raw["models"]["lead"]["settings"] = ["oracle", "rag_64"]
    with pytest.raises(ConfigError, match=r"models\.lead\.settings: unknown setting 'rag_64'"):
        validate_params(raw)
    raw["long2rag"]["models"].remove("lead")
    raw["crud_rag"]["models"].remove("lead")
    with pytest.raises(ConfigError, match=r"unknown setting 'rag_64': no benchmark has it"):
        validate_params(raw)  # run by none: its names are checked all the same


def test_the_shipped_models_keep_their_settings() -> None:
    """lead and extractive list SummHay's [oracle, bm25]: Long²RAG still runs all of its own
    for them, SummHay those two (the committed metrics do not move)."""
    from pipeline.benchmarks.summhay.params import SummhayParams, settings_of
    from pipeline.core.params import validate_params

    params = validate_params(_params())
    l2 = params.section("long2rag", Long2ragParams)
    sh = params.section("summhay", SummhayParams)
    for m in ("lead", "extractive"):
        assert generation.settings_of(l2, params.models[m]) == list(l2.settings)
        assert settings_of(params.models[m], sh.retrievers) == ["oracle", "bm25"]
