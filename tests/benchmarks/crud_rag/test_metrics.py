"""CRUD-RAG's text metrics: equal to the authors' own metric functions (values recorded in
fixture/authors_metrics.json, computed outside lfbench: scripts/crud_rag_authors_values.py) to
1e-6, a case by hand, an empty output as an explicit invalid item, and `lfbench score`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.crud_rag.metrics import MetricError, judgement, text_metrics
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core.records import Generation
from tests.benchmarks.crud_rag.helpers import HERE

AUTHORS = json.loads((HERE / "fixture" / "authors_metrics.json").read_text(encoding="utf-8"))
PAIRS = {p["name"]: p for p in AUTHORS["pairs"]}
RELEASED = "crud_rag/event_summary.first1328.json"


def _texts(pair: dict[str, Any], mirror: Path | None) -> tuple[str, str]:
    if "record" not in pair:
        return pair["generation"], pair["reference"]
    if mirror is None:
        pytest.skip("no data mirror")
    rec = json.loads((mirror / RELEASED).read_text(encoding="utf-8"))[pair["record"]]
    return rec["text"][:200], rec["summary"]


@pytest.mark.parametrize("name", [n for n, p in PAIRS.items() if p["authors"]["bleu"] is not None])
def test_equal_to_the_authors_metric_functions(name: str, request: pytest.FixtureRequest) -> None:
    pair = PAIRS[name]
    mirror = request.getfixturevalue("mirror") if "record" in pair else None
    gen, ref = _texts(pair, mirror)
    want = pair["authors"]
    if not gen.strip():
        # the authors score a whitespace-only output 0; it is an invalid item here
        assert want["bleu"] == 0.0 and want["rouge_l"] == 0.0
        with pytest.raises(MetricError, match="empty output"):
            text_metrics(gen, ref)
        return
    got = text_metrics(gen, ref)
    assert got["bleu"] == pytest.approx(want["bleu"], abs=1e-6)  # as they report it: no BP
    assert got["bleu_bp"] == pytest.approx(want["bleu_bp"], abs=1e-6)
    for n in range(4):
        assert got[f"bleu{n + 1}"] == pytest.approx(want["precisions"][n], abs=1e-6)
    assert got["rouge_l"] == pytest.approx(want["rouge_l"], abs=1e-6)


def test_the_pairs_cover_what_the_issue_asks() -> None:
    assert {"chinese", "mixed", "identical", "very_short", "reordered", "empty"} <= set(PAIRS)
    # the brevity penalty matters in some: the two BLEUs differ there
    assert any(
        p["authors"]["bleu"] and p["authors"]["bleu"] != p["authors"]["bleu_bp"]
        for p in PAIRS.values()
    )
    # the authors' functions raise on an empty output (their wrapper returns None, then 0)
    assert PAIRS["empty"]["authors"]["bleu"] is None


def test_a_case_by_hand() -> None:
    """ "甲 乙 丙 丁" vs "甲 乙 丙 戊": jieba gives 7 tokens each (甲, " ", 乙, " ", 丙, " ", 丁),
    spaces kept, as the authors count them. Matching n-grams: 6 of 7 unigrams, 5 of 6 bigrams,
    4 of 5 trigrams, 3 of 4 four-grams; the same length, so BP 1; the LCS is 6 of 7 tokens."""
    got = text_metrics("甲 乙 丙 丁", "甲 乙 丙 戊")
    precisions = [6 / 7, 5 / 6, 4 / 5, 3 / 4]
    for n, p in enumerate(precisions, start=1):
        assert got[f"bleu{n}"] == pytest.approx(p)
    geo = math.exp(sum(math.log(p) for p in precisions) / 4)
    assert got["bleu"] == pytest.approx(geo) and got["bleu_bp"] == pytest.approx(geo)
    assert got["rouge_l"] == pytest.approx(6 / 7)
    assert got["length"] == 7
    # "甲 乙 丙" is 5 tokens against 7: BP = exp(1 - 7/5)
    short = text_metrics("甲 乙 丙", "甲 乙 丙 戊")
    assert short["bleu_bp"] == pytest.approx(short["bleu"] * math.exp(1 - 7 / 5))


def test_an_empty_output_is_an_invalid_verdict_not_a_zero() -> None:
    item = Item(item_id="event_summary/x", record_id="x", task="event_summary", query="q",
                fields={"event": "q"}, reference="中国队夺冠", source="t")  # fmt: skip
    gen = Generation.offline("crud_rag", item.item_id, "m", "m", "oracle", "  ", {})
    j = judgement(gen, item, "text")
    assert j.status == "invalid" and [v.status for v in j.verdicts] == ["invalid"]
    assert j.verdicts[0].raw == "empty output"
    ok = judgement(gen.model_copy(update={"text": "中国队夺冠", "status": "ok"}), item, "text")
    assert {v.target_id: float(v.label) for v in ok.verdicts}["bleu_bp"] == 0.0  # too short
    assert {v.target_id: float(v.label) for v in ok.verdicts}["rouge_l"] == 1.0


def test_lfbench_score_writes_metrics_or_an_error_per_line(tmp_path: Path) -> None:
    src = tmp_path / "mine.jsonl"
    pair = PAIRS["mixed"]
    lines = [
        {"id": "a", "generation": pair["generation"], "reference": pair["reference"], "x": 1},
        {"id": "b", "generation": "", "reference": "中国队夺冠"},
        {"id": "c", "generation": "中国队"},
    ]
    src.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), "utf-8")
    out = tmp_path / "scored.jsonl"
    lfbench = Path(sys.executable).parent / "lfbench"
    done = subprocess.run(
        [str(lfbench), "score", "--benchmark", "crud_rag", "--input", str(src), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 3 and "1 scored, 2 with an error" in done.stdout
    a, b, c = (json.loads(x) for x in out.read_text("utf-8").splitlines())
    assert a["x"] == 1 and set(a["metrics"]) >= {
        "bleu", "bleu_bp", "bleu1", "bleu2", "bleu3", "bleu4", "rouge_l"
    }  # fmt: skip
    assert a["metrics"]["bleu"] == pytest.approx(pair["authors"]["bleu"], abs=1e-6)
    assert "error" not in a and "metrics" not in b and "metrics" not in c
    assert "item b" in b["error"] and "empty output" in b["error"]
    assert "missing field 'reference'" in c["error"]
    # a line that is not JSON stops with the file and line named
    src.write_text('{"id": "a", "generation": "x", "reference": "y"}\nnot json\n', "utf-8")
    bad = subprocess.run(
        [str(lfbench), "score", "--benchmark", "crud_rag", "--input", str(src), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "line 2" in bad.stderr and str(src) in bad.stderr
    nope = subprocess.run(
        [str(lfbench), "score", "--benchmark", "crux", "--input", str(src), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert nope.returncode == 2 and "no reference scorer" in nope.stderr
