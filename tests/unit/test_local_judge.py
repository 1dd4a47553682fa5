"""The local judge: features on hand-made cases, the leakage guard, a tiny train -> judge run."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.benchmarks.summhay.local_judge import (
    annotated_haystacks,
    human_cases,
    published_cases,
    training_split,
)
from pipeline.core.config import LocalJudge as LocalJudgeSpec
from pipeline.core.errors import DataError
from pipeline.judging.embeddings import Embedder, EmbeddingCache, text_key
from pipeline.judging.features import FEATURE_NAMES, clean_text, numbers, unit_rows
from pipeline.judging.local import LocalJudge
from pipeline.judging.train import (
    LabelledCase,
    Matrix,
    build_matrix,
    fit,
    leave_one_group_out,
    model_file,
)
from tests.conftest import mini_haystack

# ---------------------------------------------------------------- features


def test_clean_text_strips_citations_markers_and_emphasis() -> None:
    assert clean_text("* **Sales rose:** by 5% [3][12] [4, 7]") == "Sales rose: by 5%"
    assert clean_text("- plain [1]") == "plain"
    assert clean_text("## Header") == "Header"
    assert clean_text("2024 was a year [1]") == "2024 was a year"  # a leading number stays


def test_numbers_ignore_citations() -> None:
    assert numbers("Revenue of $1,200 in 2023 [4][5]") == {"1200", "2023"}


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_unit_rows_hand_computed() -> None:
    # Unit u = e1; bullets: b0 at 60 degrees (cos .5), b1 = e1 (cos 1), b2 = e2 (cos 0).
    u = _unit([1, 0])[None, :]
    b = np.stack([_unit([0.5, math.sqrt(3) / 2]), _unit([1, 0]), _unit([0, 1])])
    units = ["sales rose 5 percent in 2023"]
    bullets = ["profits fell", "sales rose sharply in 2023", "weather"]
    (row,) = unit_rows(units, bullets, u, b)
    f = dict(zip(FEATURE_NAMES, row.values, strict=True))
    assert row.top == 1
    assert f["sim_top1"] == pytest.approx(1.0)
    assert f["sim_top2"] == pytest.approx(0.5)
    assert f["sim_gap"] == pytest.approx(0.5)
    assert f["sim_mean_bullet"] == pytest.approx(0.5)
    # centroid (0.5 + 1 + 0, .866 + 0 + 1) / 3 -> cos with e1 = 1.5 / |(1.5, 1.866)| = .6265
    assert f["sim_centroid"] == pytest.approx(1.5 / math.hypot(1.5, 1 + math.sqrt(3) / 2))
    # unit content words {sales, rose, 5, percent, 2023}; top bullet {sales, rose, sharply, 2023}
    assert f["recall_top1"] == pytest.approx(3 / 5)
    assert f["recall_best"] == pytest.approx(3 / 5)
    assert f["recall_all"] == pytest.approx(3 / 5)
    assert f["jaccard_top1"] == pytest.approx(3 / 6)
    assert f["numbers_found"] == pytest.approx(1 / 2)  # 2023 found, 5 not
    assert f["has_numbers"] == 1.0
    assert f["log_unit_words"] == pytest.approx(math.log1p(6))
    assert f["log_top1_words"] == pytest.approx(math.log1p(5))
    assert f["log_n_bullets"] == pytest.approx(math.log(3))


def test_unit_rows_without_bullets() -> None:
    (row,) = unit_rows(["a 5 b"], [], _unit([1, 0])[None, :], np.zeros((0, 2), np.float32))
    assert row.top is None
    assert row.values[:10] == (0.0,) * 10
    assert len(row.values) == len(FEATURE_NAMES)


def test_embedding_cache_round_trip(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path / "e.sqlite")
    v = np.linspace(-1, 1, 384).astype(np.float32)
    cache.put_many([(text_key("x"), v)])
    got = cache.get_many([text_key("x"), text_key("y")])
    assert list(got) == [text_key("x")]
    assert np.allclose(got[text_key("x")], v, atol=1e-3)


# ---------------------------------------------------------------- leakage


def _eval_item(subtopic_id: str, insight_id: str, topic: str) -> dict[str, Any]:
    return {
        "topic": topic,
        "subtopic_id": subtopic_id,
        "summkey": "k",
        "summary": ["## Title", "* bullet one [1]", "* bullet two [2]"],
        "reference_insights": [{"insight_id": insight_id, "insight": "Insight text."}],
        "annotation": [
            {"insight_id": insight_id, "coverage": "partially_covered", "candidate_id": "1"}
        ],
    }


def test_annotated_haystacks_found_by_subtopic_insight_or_topic(tmp_path: Path) -> None:
    data = tmp_path / "summhay"
    data.mkdir()
    base = mini_haystack()
    for n in (1, 2, 3, 4):
        h = copy.deepcopy(base)
        h["topic"] = f"topic {n}"
        for s in h["subtopics"]:
            s["subtopic_id"] = f"{s['subtopic_id']}-{n}"
            for i in s["insights"]:
                i["insight_id"] = f"{i['insight_id']}-{n}"
            for evs in s["eval_summaries"].values():
                for e in evs:
                    e["insight_id"] = f"{e['insight_id']}-{n}"
        for d in h["documents"]:
            d["insights_included"] = [f"{i}-{n}" for i in d["insights_included"]]
        (data / f"topic_news{n}.json").write_text(json.dumps(h))
    eval_path = data / "eval.json"
    eval_path.write_text(
        json.dumps(
            [
                _eval_item("s1-1", "zz", "other"),  # news1 by subtopic id
                _eval_item("zz", "i3-2", "other"),  # news2 by insight id
                _eval_item("zz", "zz", "topic 3"),  # news3 by topic
            ]
        )
    )
    ids = ["news1", "news2", "news3", "news4"]
    found = annotated_haystacks(eval_path, data, ids)
    assert sorted(found) == ["news1", "news2", "news3"]
    assert "subtopic ids" in found["news1"] and "insight ids" in found["news2"]
    spec = LocalJudgeSpec(provider="local", train={"haystacks": ids})
    train_ids, excluded = training_split(spec, data, eval_path)
    assert train_ids == ["news4"] and sorted(excluded) == ["news1", "news2", "news3"]
    cases = published_cases(data, train_ids)
    assert {c.group for c in cases} == {"news4"}
    assert len(cases) == 2 and cases[0].labels == ("FULL_COVERAGE", "PARTIAL_COVERAGE")
    assert cases[0].links == (2, 3) and cases[1].links == (None,)
    # Human labels: candidate_id counts from 0 (on the lines, header included).
    (h,) = human_cases(data / "eval.json")[:1]
    assert h.labels == ("PARTIAL_COVERAGE",) and h.links == (2,)
    assert h.bullets == ("## Title", "* bullet one [1]", "* bullet two [2]")


def test_bad_annotated_file_names_the_field(tmp_path: Path) -> None:
    p = tmp_path / "eval.json"
    p.write_text(json.dumps([{"topic": "t"}]))
    with pytest.raises(DataError, match=r"eval.json.*\[0\].*subtopic_id"):
        human_cases(p)


def test_training_data_holds_no_summary_from_an_annotated_haystack(mirror: Path) -> None:
    """On the real release: news3 is annotated, and no training summary shares a subtopic,
    an insight or a topic with the human-annotated set."""
    data = mirror / "summhay"
    eval_path = data / "eval_benchmark_data.json"
    spec = LocalJudgeSpec(provider="local")
    train_ids, excluded = training_split(spec, data, eval_path)
    assert "news3" in excluded and "news3" not in train_ids
    assert train_ids  # something is left to train on
    ann = json.loads(eval_path.read_text())
    ann_subtopics = {a["subtopic_id"] for a in ann}
    ann_insights = {r["insight_id"] for a in ann for r in a["reference_insights"]}
    ann_insight_texts = {r["insight"] for a in ann for r in a["reference_insights"]}
    ann_summaries = {"\n".join(a["summary"]) for a in ann}
    cases = published_cases(data, train_ids)
    assert len(cases) > 1000
    for c in cases:
        assert c.group in train_ids
        assert c.case_id.split("/", 1)[1].split("#")[0] not in ann_subtopics
        assert not set(c.units) & ann_insight_texts
        assert "\n".join(c.bullets) not in ann_summaries
    from pipeline.data.haystacks import haystack_file, load_raw_haystack

    for hid in train_ids:
        raw = load_raw_haystack(data / haystack_file(hid))
        assert not {i.insight_id for s in raw.subtopics for i in s.insights} & ann_insights


# ---------------------------------------------------------------- train -> judge


def _case(group: str, units: list[str], bullets: list[str], labels: list[str]) -> LabelledCase:
    links = [None if lab == "NO_COVERAGE" else 1 for lab in labels]
    return LabelledCase(
        group, f"{group}#{len(units)}", tuple(units), tuple(bullets), tuple(labels), tuple(links)
    )


FACTS = [
    ("The company opened forty new stores in Texas.", "Forty new stores opened across Texas."),
    ("The chief executive resigned in March.", "In March the CEO stepped down."),
    ("Quarterly revenue fell by ten percent.", "Revenue for the quarter dropped ten percent."),
    ("A new loyalty program launched for members.", "Members got a new loyalty program."),
    ("The firm closed its factory in Ohio.", "Its Ohio factory was shut down by the firm."),
    ("Shares rose after the earnings call.", "After the earnings call the stock went up."),
]
FILLER = ["The weather was sunny at the beach.", "A cat slept on the warm sofa."]


def test_train_then_judge_end_to_end(tmp_path: Path) -> None:
    cases = []
    for k, (unit, para) in enumerate(FACTS):
        other = FACTS[(k + 1) % len(FACTS)][0]
        cases.append(
            _case(
                f"g{k % 2}", [unit, other], [para, FILLER[k % 2]], ["FULL_COVERAGE", "NO_COVERAGE"]
            )
        )
        half = " ".join(para.split()[:3])
        cases.append(
            _case(f"g{k % 2}", [unit], [FILLER[0], half + " something."], ["PARTIAL_COVERAGE"])
        )
    emb = Embedder(tmp_path / "cache.sqlite")
    m = build_matrix(cases, emb)
    model = fit(m.x, m.y, c=1.0, class_weight=None)
    path = tmp_path / "model.json"
    path.write_text(model_file(model, {"n_train": len(m.y)}))
    # Deterministic: the same data gives the same bytes (vectors now come from the cache).
    m2 = build_matrix(cases, Embedder(tmp_path / "cache.sqlite"))
    assert (
        model_file(fit(m2.x, m2.y, c=1.0, class_weight=None), {"n_train": len(m.y)})
        == path.read_text()
    )

    judge = LocalJudge.load(path)
    assert len(judge.sha) == 64
    unit, para = FACTS[0]
    (verdicts, empty) = judge.judge_many(
        [
            ([unit, "Penguins live in Antarctica."], [FILLER[1], para + " [4]", FILLER[0]]),
            ([unit], []),
        ]
    )
    assert verdicts[0].label == "FULL_COVERAGE" and verdicts[0].bullet == 2
    assert verdicts[1].label == "NO_COVERAGE" and verdicts[1].bullet is None
    assert sum(verdicts[0].proba) == pytest.approx(1.0)
    assert empty[0].label == "NO_COVERAGE" and empty[0].bullet is None


def test_load_refuses_a_foreign_file(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"format": "other"}))
    with pytest.raises(DataError, match=r"m\.json.*format"):
        LocalJudge.load(p)
    with pytest.raises(DataError, match="not found"):
        LocalJudge.load(tmp_path / "missing.json")


def test_agreement_stage_scores_annotated_summaries_with_the_local_judge(tmp_path: Path) -> None:
    """The agreement stage's hook: bullets numbered as the annotators' (header line included)."""
    from pipeline.benchmarks.summhay.agreement import Label, judge_annotated_other, load_labels
    from pipeline.core.config import Params

    cases = []
    for k, (unit, para) in enumerate(FACTS):
        other = FACTS[(k + 1) % len(FACTS)][0]
        cases.append(
            _case("g", [unit, other], [para, FILLER[k % 2]], ["FULL_COVERAGE", "NO_COVERAGE"])
        )
        half = " ".join(para.split()[:3])
        cases.append(_case("g", [unit], [FILLER[0], half + " something."], ["PARTIAL_COVERAGE"]))
    m = build_matrix(cases, Embedder(None))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.json").write_text(
        model_file(fit(m.x, m.y, c=1.0, class_weight=None), {})
    )
    unit, para = FACTS[2]
    labels = tmp_path / "labels.json"
    labels.write_text(
        json.dumps(
            [
                {
                    "subtopic_id": "s1",
                    "summkey": "summary_subtopic_oracle_sysA",
                    "summary": ["## Title", f"* {FILLER[0]} [1]", f"* {para} [2]"],
                    "reference_insights": [
                        {"insight_id": "i1", "insight": unit},
                        {"insight_id": "i2", "insight": "Penguins live in Antarctica."},
                    ],
                    "annotation": [
                        {"insight_id": "i1", "coverage": "fully_covered", "candidate_id": "2"},
                        {
                            "insight_id": "i2",
                            "coverage": "not_covered",
                            "candidate_id": "no_selection",
                        },
                    ],
                }
            ]
        )
    )
    params = Params.model_validate(
        {
            "models": {"published": {"provider": "published"}},
            "judges": {
                "local": {
                    "provider": "local",
                    "model_path": "models/m.json",
                    "embedding_cache": False,
                }
            },
            "summhay": {"models": ["published"], "judges": ["local"]},
        }
    )
    samples = load_labels(labels)
    out, sha = judge_annotated_other(params, "local", samples, tmp_path)
    assert len(sha) == 64
    got = out[samples[0].sample_id]
    assert got["i1"] == Label("FULL", 3) == samples[0].human["i1"]
    assert got["i2"] == Label("NO", None)


def test_leave_one_haystack_out_needs_two_haystacks() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, len(FEATURE_NAMES)))
    y = np.arange(30) % 3
    zeros = np.zeros(30, dtype=int)
    one = Matrix(x, y, np.array(["news1"] * 30), zeros, zeros)
    assert leave_one_group_out(one, c=1.0, class_weight=None)["pooled"] is None
    two = Matrix(x, y, np.array(["news1", "news2"] * 15), zeros, zeros)
    result = leave_one_group_out(two, c=1.0, class_weight=None)
    assert set(result["per_group"]) == {"news1", "news2"}
    assert result["pooled"]["n"] == 30


def test_vectors_do_not_depend_on_the_number_of_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each text is encoded alone on one BLAS thread: computed in this process, in 2 worker
    processes, or read back from the cache, a vector has the same bits."""
    texts = [f"Sentence number {i} about {w}." for i, w in enumerate(["rain", "tax", "AI"] * 30)]
    monkeypatch.setenv("LFBENCH_EMBED_WORKERS", "1")
    serial = Embedder(tmp_path / "a.sqlite", chunk=16)
    one = serial.embed(texts)
    monkeypatch.setenv("LFBENCH_EMBED_WORKERS", "2")
    parallel = Embedder(tmp_path / "b.sqlite", chunk=16)
    two = parallel.embed(texts)
    assert serial.computed == parallel.computed == len(set(texts)) == 90
    assert np.array_equal(one, two)
    reread = Embedder(tmp_path / "b.sqlite")
    assert np.array_equal(reread.embed(texts), two) and reread.computed == 0
    assert np.allclose(np.linalg.norm(two, axis=1), 1.0, atol=2e-3)
    monkeypatch.setenv("LFBENCH_EMBED_WORKERS", "two")
    with pytest.raises(ValueError, match="LFBENCH_EMBED_WORKERS"):
        Embedder(None).embed(["one more text"] * 100 + [f"t{i}" for i in range(100)])
