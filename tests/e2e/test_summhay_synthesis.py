"""SummHay haystack synthesis end to end: `dvc repro summhay-construct` against the test server
(real HTTP) with a scripted model that plants a leak and a missing insight
(tests/e2e/synthesis_responder.py); then a SIGKILL mid-synthesis and the resume."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.data.haystacks import Haystack
from pipeline.testing.server import TestServer
from tests.conftest import ROOT, run
from tests.e2e import synthesis_responder as R
from tests.e2e.resume import jsonl, kill_after

pytestmark = pytest.mark.slow

KEY_ENV = "LFBENCH_TEST_API_KEY"
ENV = {KEY_ENV: "sk-lfbench-test-synthesis"}
NEWS = {
    "id": "harbour-town",
    "topic": "a harbour town's summer season",
    "domain": "news",
    "subtopics": 3,
    "insights_per_subtopic": 3,
    "documents": 12,
    "insights_per_document": 3,
    "min_documents_per_insight": 2,
    "words_per_document": 120,
    "seed_documents": ["inputs/summhay/harbour.txt"],
}
CONVERSATION = {
    "id": "harbour-talk",
    "topic": "neighbours talk about the summer",
    "domain": "conversation",
    "participants": ["Ana", "Ben", "Chloe"],
    "subtopics": 2,
    "insights_per_subtopic": 2,
    "documents": 4,
    "min_documents_per_insight": 2,
    "words_per_document": 120,
}


def _configure(proj: Path, base_url: str, **judge_extra: Any) -> None:
    (proj / "inputs" / "summhay" / "harbour.txt").write_text(
        "The harbour town had a busy summer. Markets and festivals drew visitors.\n"
    )
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["runtime"] = "local"
    params["judges"]["writer"] = {
        "provider": "openai",
        "base_url": base_url,
        "model": "tiny-writer",
        "api_key_env": KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 2.0,
        "max_retries": 8,
        **judge_extra,
    }
    s = params["summhay"]
    s["haystacks"] = ["news1"]
    s["lengths"]["haystacks"] = []
    s["synthesis"].update(llm="writer", haystacks=[NEWS, CONVERSATION])
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def _server(tmp_path: Path, name: str, **kw: Any) -> TestServer:
    return TestServer(
        responder="tests.e2e.synthesis_responder:respond",
        log_path=tmp_path / f"{name}.log",
        cwd=ROOT,
        **kw,
    )


def _synthesized(proj: Path) -> dict[str, Haystack]:
    hays = [Haystack.model_validate(r) for r in jsonl(proj / "datasets" / "summhay.jsonl")]
    assert [h.haystack_id for h in hays if h.derived is None] == ["news1"]
    return {h.haystack_id: h for h in hays if h.derived is not None}


def _check_exact(hay: Haystack) -> None:
    """The map is exact: each document holds the codes of its insights and no other."""
    text_of = {i.insight_id: i.text for s in hay.subtopics for i in s.insights}
    all_codes = {c for t in text_of.values() for c in R.codes(t)}
    for d in hay.documents:
        want = {c for i in d.insight_ids for c in R.codes(text_of[i])}
        assert R.codes(d.text) & all_codes == want, d.document_id
    for s in hay.subtopics:
        for i in s.insights:
            assert i.gold_docs == [
                d.position for d in hay.documents if i.insight_id in d.insight_ids
            ]
            assert len(i.gold_docs) >= 2


def test_synthesis_catches_and_fixes_a_leak_and_a_missing_insight(
    project: Path, tmp_path: Path
) -> None:
    with _server(tmp_path, "faults", fault_rate=0.15, faults=["429", "500"], seed=3) as srv:
        _configure(project, srv.base_url)
        run(["dvc", "repro", "summhay-construct"], project, env=ENV)
        log = srv.log()
    served = Counter(r["body_sha256"] for r in log if r["served"])
    assert max(served.values()) == 1  # nothing asked twice, faults and retries included
    assert sum(1 for r in log if r["fault"]) >= 3

    hays = _synthesized(project)
    assert set(hays) == {"syn-harbour-town", "syn-harbour-talk"}
    news = hays["syn-harbour-town"]
    assert news.domain == "news" and news.derived is not None
    f = news.derived.figures
    # subtopics: 5 proposed, "Harbour again" overlaps "Harbour", the first 3 of the rest kept
    assert [s.name for s in news.subtopics] == ["Harbour", "Market", "Festival"]
    assert (f["subtopics_proposed"], f["subtopics_dropped_overlap"]) == (5, 1)
    # insights: per subtopic 5 asked; the unspecific ones (3), the restated 1101 (duplicate
    # check), Market's "Festival ..." (categorisation check) dropped; Festival keeps 3 of 4
    assert [[i.text for i in s.insights] for s in news.subtopics] == [
        [R.insight(1, 1), R.insight(1, 2), R.insight(1, 3)],
        [R.insight(2, 1), R.insight(2, 2), R.insight(2, 4)],
        [R.insight(3, 1), R.insight(3, 2), R.insight(3, 3)],
    ]
    assert f["insights_proposed"] == 15
    assert (f["insights_dropped_unspecific"], f["insights_dropped_repeat"]) == (3, 1)
    assert (f["insights_dropped_category"], f["insights_dropped_surplus"]) == (1, 1)
    # the planted leak (document 1) and missing insight (document 2): caught and rewritten
    assert f["leak_rewrites"] >= 1 and f["presence_rewrites"] >= 1
    assert (f["residual_leaks"], f["residual_missing"], f["documents"]) == (0, 0, 12)
    assert f["insights_below_minimum"] == 0 and f["residual_documents"] == []
    d1, d2 = news.documents[0], news.documents[1]
    assert len(d1.insight_ids) == 3 and len(d2.insight_ids) == 3
    heads = [r["prompt_head"] for r in log if r["served"]]
    removes = sum(1 for h in heads if h.startswith("Rewrite the document below so that it no"))
    adds = sum(1 for h in heads if h.startswith("Rewrite the document below so that it also"))
    assert (removes, adds) == (f["leak_rewrites"], f["presence_rewrites"])
    _check_exact(news)
    assert [s.query for s in news.subtopics] == [
        f"What happened with {n}?" for n in ("Harbour", "Market", "Festival")
    ]
    assert f["input_tokens"] > 0 and f["output_tokens"] > 0

    talk = hays["syn-harbour-talk"]
    assert talk.domain == "conversation" and talk.participants == ["Ana", "Ben", "Chloe"]
    g = talk.derived.figures if talk.derived else {}
    assert g["chapter_checks_failed"] == 1 and g["chapter_regenerations"] == 1
    assert all(
        re.match(r"^(Ana|Ben|Chloe): ", ln)
        for d in talk.documents
        for ln in d.text.split("\n")
        if ln
    )
    _check_exact(talk)
    # the oracle retriever's scores: the subtopic's insights each document holds
    for s in news.subtopics:
        own = {i.insight_id for i in s.insights}
        assert s.retriever_scores["oracle"] == [
            float(len(own & set(d.insight_ids))) for d in news.documents
        ]
    usage = json.loads((project / "datasets" / "summhay.usage.json").read_text())
    assert usage["errors"] == 0 and usage["requests_sent"] == len(log)  # faults included


def test_synthesis_killed_mid_way_resumes_with_nothing_sent_twice(
    project: Path, tmp_path: Path
) -> None:
    journal = project / ".lfbench" / "journal" / "summhay-construct.jsonl"
    with _server(tmp_path, "kill", latency_ms=100) as srv:
        _configure(project, srv.base_url, max_concurrency=1)
        done = kill_after(project, "summhay-construct", journal, 20, ENV)
        assert not (project / "datasets" / "summhay.jsonl").exists()
        before = srv.log()
        run(["dvc", "repro", "summhay-construct"], project, env=ENV)
        after = srv.log()[len(before) :]
        resumed = (project / "datasets" / "summhay.jsonl").read_bytes()
        # the same synthesis from scratch (no cache, no journal) gives the same bytes
        shutil.rmtree(project / ".lfbench")
        run(
            [
                "lfbench", "run", "construct", "--benchmark", "summhay", "--data", "data/summhay",
                "--out", str(tmp_path / "fresh.jsonl"),
            ],
            project,
            env=ENV,
        )  # fmt: skip
    finished = {r["body_sha256"] for r in before if r["served"]}
    again = Counter(r["body_sha256"] for r in after)
    assert done >= 20 and len(finished - set(again)) >= done
    assert max(again.values()) == 1
    assert (tmp_path / "fresh.jsonl").read_bytes() == resumed
    for hay in _synthesized(project).values():
        _check_exact(hay)
