"""SummHay's training data for the local judge: the leakage guard (no case from a haystack that
people annotated) and the labelled cases it reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.summhay.training import (
    annotated_haystacks,
    human_cases,
    published_cases,
    training_split,
)
from pipeline.core.config import LocalJudge as LocalJudgeSpec
from pipeline.core.errors import DataError
from pipeline.stages.common import FileInputs
from tests.conftest import mini_haystack

FILES = FileInputs(Path("/"))


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
    found = annotated_haystacks(FILES, str(eval_path), str(data), ids)
    assert sorted(found) == ["news1", "news2", "news3"]
    assert "subtopic ids" in found["news1"] and "insight ids" in found["news2"]
    spec = LocalJudgeSpec(provider="local", train={"haystacks": ids})
    train_ids, excluded = training_split(FILES, spec, str(data), str(eval_path))
    assert train_ids == ["news4"] and sorted(excluded) == ["news1", "news2", "news3"]
    cases = published_cases(FILES, str(data), train_ids)
    assert {c.group for c in cases} == {"news4"}
    assert len(cases) == 2 and cases[0].labels == ("FULL_COVERAGE", "PARTIAL_COVERAGE")
    assert cases[0].links == (2, 3) and cases[1].links == (None,)
    # Human labels: candidate_id counts from 0 (on the lines, header included).
    (h,) = human_cases(json.loads((data / "eval.json").read_text()), "eval.json")[:1]
    assert h.labels == ("PARTIAL_COVERAGE",) and h.links == (2,)
    assert h.bullets == ("## Title", "* bullet one [1]", "* bullet two [2]")


def test_bad_annotated_file_names_the_field(tmp_path: Path) -> None:
    p = tmp_path / "eval.json"
    p.write_text(json.dumps([{"topic": "t"}]))
    with pytest.raises(DataError, match=r"eval.json.*\[0\].*subtopic_id"):
        human_cases(json.loads(p.read_text()), str(p))


def test_training_data_holds_no_summary_from_an_annotated_haystack(mirror: Path) -> None:
    """On the real release: news3 is annotated, and no training summary shares a subtopic,
    an insight or a topic with the human-annotated set."""
    data = mirror / "summhay"
    eval_path = data / "eval_benchmark_data.json"
    spec = LocalJudgeSpec(provider="local")
    train_ids, excluded = training_split(FILES, spec, str(data), str(eval_path))
    assert "news3" in excluded and "news3" not in train_ids
    assert train_ids  # something is left to train on
    ann = json.loads(eval_path.read_text())
    ann_subtopics = {a["subtopic_id"] for a in ann}
    ann_insights = {r["insight_id"] for a in ann for r in a["reference_insights"]}
    ann_insight_texts = {r["insight"] for a in ann for r in a["reference_insights"]}
    ann_summaries = {"\n".join(a["summary"]) for a in ann}
    cases = published_cases(FILES, str(data), train_ids)
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
