"""The local judge: features on hand-made cases, the leakage guard, a tiny train -> judge run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import DataError
from pipeline.core.records import LabelledCase
from pipeline.local_judge.embeddings import Embedder, EmbeddingCache, text_key
from pipeline.local_judge.features import (
    ALIGN_NAMES,
    CONTRAST_NAMES,
    FEATURE_NAMES,
    clean_text,
    entities,
    negated,
    numbers,
    unit_rows,
)
from pipeline.local_judge.model import LocalJudge
from pipeline.local_judge.train import (
    Matrix,
    build_matrix,
    fit,
    fit_and_evaluate,
    leave_one_group_out,
    model_file,
)
from tests.conftest import encoder_beside

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


def test_alignment_features_hand_computed() -> None:
    """What a verdict turns on: the other direction of the overlap, stems, bigrams, numbers in
    the nearest bullet, named entities and a negation on one side only."""
    units = ["Prices at Acme Corp did not rise 5 percent in 2023"]
    bullets = ["Acme Corp prices rose in 2023", "Weather was mild"]
    (row,) = unit_rows(
        units, bullets, _unit([1, 0])[None, :], np.stack([_unit([1, 0.2]), _unit([0, 1])])
    )
    f = dict(zip(FEATURE_NAMES, row.values, strict=True))
    assert set(ALIGN_NAMES) | set(CONTRAST_NAMES) <= set(f)
    # unit words {prices, acme, corp, rise, 5, percent, 2023};
    # bullet words {acme, corp, prices, rose, 2023}
    assert f["prec_top1"] == pytest.approx(4 / 5)
    assert f["recall_top1"] == pytest.approx(4 / 7)
    assert f["recall_top1_stem"] == pytest.approx(4 / 7)  # "price" stems; rise/rose do not
    assert f["bigram_top1"] == pytest.approx(1 / 6)  # (acme, corp) of 6 bigrams
    assert f["numbers_top1"] == pytest.approx(1 / 2)
    assert f["log_numbers_missing"] == pytest.approx(math.log1p(1))  # 5 is nowhere
    assert f["entities_found"] == f["entities_top1"] == f["has_entities"] == 1.0
    assert f["negation_mismatch"] == 1.0
    assert f["share_sim_above_half"] == pytest.approx(0.5)
    assert entities("Sales at Foot Locker fell. Then Nike left.") == {"foot locker", "nike"}
    assert negated("it didn't") and negated("No rise") and not negated("nothing changed")


def test_contrast_features_tell_topic_words_from_an_insight_own_words() -> None:
    """Two insights of one topic share "store"; the bullet holds the first one's own words."""
    units = ["store sales rose", "store staff left"]
    bullets = ["sales rose at the store"]
    u = np.stack([_unit([1, 0]), _unit([0, 1])])
    first, second = unit_rows(units, bullets, u, _unit([1, 0.5])[None, :])
    f1 = dict(zip(FEATURE_NAMES, first.values, strict=True))
    f2 = dict(zip(FEATURE_NAMES, second.values, strict=True))
    assert f1["distinct_share"] == f2["distinct_share"] == pytest.approx(2 / 3)
    assert (f1["distinct_top1"], f2["distinct_top1"]) == (1.0, 0.0)
    assert (f1["top_is_mine"], f2["top_is_mine"]) == (1.0, 0.0)
    margin = (1 - 0.5) / math.hypot(1, 0.5)
    assert f1["sim_margin_units"] == pytest.approx(margin)
    assert f2["sim_margin_units"] == pytest.approx(-margin)
    assert (f1["sim_z_case"], f2["sim_z_case"]) == (pytest.approx(1.0), pytest.approx(-1.0))


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
    emb = Embedder(encoder_beside(tmp_path / "cache.sqlite"))
    m = build_matrix(cases, emb)
    model = fit(m.x, m.y, c=1.0, class_weight=None)
    path = tmp_path / "model.json"
    path.write_text(model_file(model, {"n_train": len(m.y)}))
    # Deterministic: the same data gives the same bytes (vectors now come from the cache).
    m2 = build_matrix(cases, Embedder(encoder_beside(tmp_path / "cache.sqlite")))
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
    from pipeline.benchmarks.summhay.agreement import Label
    from pipeline.core import registry
    from pipeline.core.params import validate_params
    from pipeline.stages.agreement import judge_labelled
    from pipeline.stages.common import context

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
    params = validate_params(
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
    bench = registry.get("summhay")
    ctx = context(bench, params, Path.cwd())
    assert bench.agreement is not None
    samples = bench.agreement.load(ctx, json.loads(labels.read_text()), str(labels))
    judged, info = judge_labelled(bench, ctx, samples, {}, tmp_path)
    assert len(info["local"].sha) == 64 and info["local"].source == "judged by lfbench"
    # for its judge card: free, 2 verdicts, timed by the agreement stage
    assert info["local"].free and info["local"].n_judgements == 2
    assert info["local"].wall_s is not None and info["local"].wall_s > 0
    assert info["local"].timing_stage == "summhay-agreement"
    got = judged["local"][samples[0].sample_id]
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


def test_fits_side_by_side_give_the_fits_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full fit and the leave-one-out fits run in forked processes: the models and the
    evaluation are the same bytes as fitted one after another in this process."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(90, len(FEATURE_NAMES)))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    zeros = np.zeros(90, dtype=int)
    m = Matrix(x, y, np.array(["news1", "news2", "news4"] * 30), zeros, zeros)
    model, logo = fit_and_evaluate(m, c=1.0, class_weight="balanced")
    assert model is not None
    alone = fit(m.x, m.y, c=1.0, class_weight="balanced")
    assert model_file(model, {}) == model_file(alone, {})
    monkeypatch.setenv("LFBENCH_WORKERS", "1")
    model1, logo1 = fit_and_evaluate(m, c=1.0, class_weight="balanced")
    assert model1 is not None and model_file(model1, {}) == model_file(model, {})
    assert json.dumps(logo1, sort_keys=True) == json.dumps(logo, sort_keys=True)
    assert set(logo["per_group"]) == {"news1", "news2", "news4"}
    assert leave_one_group_out(m, c=1.0, class_weight="balanced") == logo


def test_vectors_do_not_depend_on_the_number_of_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each text is encoded alone on one BLAS thread: computed in this process, in 2 worker
    processes, or read back from the cache, a vector has the same bits."""
    texts = [f"Sentence number {i} about {w}." for i, w in enumerate(["rain", "tax", "AI"] * 30)]
    monkeypatch.setenv("LFBENCH_EMBED_WORKERS", "1")
    serial = Embedder(encoder_beside(tmp_path / "a.sqlite"), chunk=16)
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
