"""CRUX end to end through the OpenAI-compatible test server (real HTTP, real DVC, MLflow).

Three reports with their documents in a user's file: the construct stage builds CRUX data with
an LLM (passages, the query, the sub-questions, the rating of every pair, one repaired rating
answer; a sub-question no passage answers is dropped), the contexts are ranked (Z* and bm25),
and an LLM rating judge rates them (every pair once, whatever the contexts that hold it). All of
it under 20% injected faults (429, 500, hangs): nothing lost, no answer asked for twice. Then a
SIGKILL mid-construction and mid-judging: the re-run resumes from the journal and sends no
finished request again.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import ROOT, run, slice_summhay
from tests.e2e import crux_responder as R
from tests.e2e.resume import jsonl, kill_after

pytestmark = pytest.mark.slow

KEY_ENV = "LFBENCH_TEST_API_KEY"
ENV = {KEY_ENV: "sk-lfbench-test-crux"}

REPORTS = [
    {
        "id": "harbour",
        "reference": "The festival was about lanterns. Visitors talked about boats. "
        "The mayor spoke about budgets. Nobody wrote about dragons.",
        "documents": [
            "Hundreds of lanterns lit the harbour. The lantern makers came from far away. "
            "Rain fell late in the evening.",
            "Boats crowded the bay all weekend. The council approved the budgets for next "
            "year. Music played all night.",
        ],
        "domain": "local news",
    },
    {
        "id": "station",
        "reference": "The crowd argued about garble. The report is about trains.",
        "documents": [
            "A garble of voices filled the station hall. Trains left on time despite it.",
            "The station opened in 1901. Its clock still works.",
        ],
        "domain": "local news",
    },
    {
        "id": "library",
        "reference": "The town cared about books. The architect talked about windows.",
        "documents": [
            "The new library holds ten thousand books. Its windows face the park. Children "
            "read there after school.",
        ],
    },
]


def _configure(proj: Path, base_url: str, **judge_extra: Any) -> None:
    src = proj / "inputs" / "crux" / "mine.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in REPORTS), encoding="utf-8")
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 1.0,
        "max_retries": 8,
    }
    params["runtime"] = "local"
    params["judges"]["local"]["train"]["haystacks"] = ["news1"]  # in every judge stage's DAG
    params["judges"]["builder"] = {**endpoint, "model": "tiny-builder", **judge_extra}
    # it rates the released retrievers' contexts (no model calls): asked for by name
    params["judges"]["rater"] = {
        **endpoint,
        "model": "tiny-rater",
        "models": ["crux-contexts"],
        **judge_extra,
    }
    params["models"]["crux-contexts"]["retrievers"] = ["zstar", "bm25"]
    crux = params["crux"]
    crux["source"] = "inputs/crux/mine.jsonl"
    crux["construction"]["llm"] = "builder"
    crux["judges"] = ["crux-labels", "rater"]
    crux["judge_sample"] = None
    crux["scoring"]["cutoffs"] = ["zstar", 2, "budget"]
    crux["scoring"]["bootstrap_resamples"] = 50
    crux["answers"]["generations"] = None
    slice_summhay(params)  # crux-aggregate depends on SummHay's outputs: build few
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def _server(tmp_path: Path, name: str, **kw: Any) -> TestServer:
    return TestServer(
        responder="tests.e2e.crux_responder:respond",
        log_path=tmp_path / f"{name}.log",
        cwd=ROOT,
        **kw,
    )


def test_crux_construction_and_llm_judge_under_faults(project: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with _server(
        tmp_path,
        "faults",
        latency_ms=5,
        fault_rate=0.2,
        faults=["429", "500", "hang"],
        hang_s=3.0,
        retry_after=1,
        seed=11,
    ) as srv:
        _configure(project, srv.base_url)
        run(["dvc", "repro", "crux-aggregate"], project, env=ENV)
        log = srv.log()
    print(f"crux e2e: {time.monotonic() - t0:.1f} s, {len(log)} requests")
    faults = Counter(r["fault"] for r in log if r["fault"])
    assert sum(faults.values()) >= 5, faults  # faults were injected, and survived
    served = Counter(r["body_sha256"] for r in log if r["served"])
    assert max(served.values()) == 1  # no answer was asked for twice

    # ---- construction: passages, query, sub-questions, ratings, exactly as the model answered
    cols = {c["collection_id"]: c for c in jsonl(project / "datasets" / "crux.jsonl")}
    assert set(cols) == {"harbour", "station", "library"}
    harbour = cols["harbour"]
    (q,) = harbour["queries"]
    assert q["query"] == "Write a report on The festival was about lanterns."
    assert [s["text"] for s in q["subquestions"]] == [
        f"What does the report say about {w}?" for w in ("lanterns", "boats", "budgets")
    ]
    # nobody's passages mention dragons: dropped, not scored
    assert [s["text"] for s in q["dropped"]] == ["What does the report say about dragons?"]
    passages = {p["pid"]: p["text"] for p in harbour["passages"]}
    assert len(passages) == 4  # two documents, two halves each
    for pid, text in passages.items():
        want = [R.rating(s["text"], text) for s in q["subquestions"]]
        assert q["ratings"].get(pid, [0, 0, 0]) == want
    # "The lantern makers..." answers the lanterns question in part (3): still answerable
    assert sorted(q["ratings"].values()) == [[0, 0, 5], [0, 5, 0], [3, 0, 0], [5, 0, 0]]
    assert len(q["zstar"]) == 3
    assert cols["library"]["domain"] == "custom" and cols["station"]["domain"] == "local news"
    c_usage = json.loads((project / "datasets" / "crux.usage.json").read_text())
    assert c_usage["errors"] == 0 and c_usage["retries"] >= 1

    # ---- the LLM rating judge: each pair once, its ratings those the model gave
    judged = jsonl(project / "judgements" / "crux" / "crux-contexts" / "rater.jsonl")
    assert {(j["item_id"], j["setting"]) for j in judged} == {
        (i, s) for i in cols for s in ("zstar", "bm25")
    }
    assert all(j["status"] == "ok" for j in judged)
    texts = {
        (c["collection_id"], s["qid"]): s["text"]
        for c in cols.values()
        for s in c["queries"][0]["subquestions"]
    }
    allp = {p["pid"]: p["text"] for c in cols.values() for p in c["passages"]}
    pairs = set()
    for j in judged:
        for v in j["verdicts"]:
            pid, _, qid = v["target_id"].rpartition("#")
            assert int(v["label"]) == R.rating(texts[(j["item_id"], qid)], allp[pid])
            pairs.add((j["item_id"], pid, qid))
    rated = Counter(r["model"] for r in log if r["served"])
    garble = sum(1 for item, _, qid in pairs if "garble" in texts[(item, qid)])
    assert garble == 4  # the station's four passages, each against the garbled question
    # every judged pair asked once (the contexts share them), the garbled ones repaired once
    assert rated["tiny-rater"] == len(pairs) + garble
    j_usage = json.loads(
        (project / "judgements" / "crux" / "crux-contexts" / "rater.usage.json").read_text()
    )
    # first pass and repair pass: one item per request
    assert j_usage["items"] == len(pairs) + garble and j_usage["errors"] == 0

    # ---- the rows: the LLM agrees with the labels its own construction gave
    metrics = json.loads((project / "metrics" / "crux.json").read_text())
    rows = {(r["domain"], r["retriever"], r["cutoff"], r["judge"]): r for r in metrics["rows"]}
    for (domain, ret, cut, judge), row in rows.items():
        if judge == "rater":
            twin = rows[(domain, ret, cut, "crux-labels")]
            assert row["coverage"] == twin["coverage"] and row["n_scored"] == twin["n_scored"]
    assert rows[("local news", "zstar", "zstar", "crux-labels")]["coverage"] == 100.0
    agreement = {a["domain"]: a for a in metrics["agreement"]}
    assert set(agreement) == {"local news", "custom", "all"}
    a = agreement["all"]
    assert (a["judge"], a["n_invalid"], a["kappa"], a["n"]) == ("rater", 0, 1.0, len(pairs))


def test_crux_sigkill_mid_construction_and_mid_judging_resume(
    project: Path, tmp_path: Path
) -> None:
    with _server(tmp_path, "kill", latency_ms=150) as srv:
        _configure(project, srv.base_url, max_concurrency=1)
        journals = project / ".lfbench" / "journal"
        # construction: killed after 6 answers (the passages step and some of the next ones)
        done = kill_after(project, "crux-construct", journals / "crux-construct.jsonl", 6, ENV)
        assert not (project / "datasets" / "crux.jsonl").exists()
        before = srv.log()
        run(["dvc", "repro", "crux-construct"], project, env=ENV)
        after = srv.log()[len(before) :]
        # every journaled answer is kept (an answer served but not yet journaled when the kill
        # came may be asked again); nothing is asked twice in the resumed run
        finished = {r["body_sha256"] for r in before if r["served"]}
        again = Counter(r["body_sha256"] for r in after)
        assert done >= 6 and len(finished - set(again)) >= done
        assert max(again.values()) == 1
        cols = {c["collection_id"]: c for c in jsonl(project / "datasets" / "crux.jsonl")}
        assert set(cols) == {"harbour", "station", "library"}
        for c in cols.values():
            (q,) = c["queries"]
            texts = {p["pid"]: p["text"] for p in c["passages"]}
            for pid, row in q["ratings"].items():
                assert row == [R.rating(s["text"], texts[pid]) for s in q["subquestions"]]

        # judging: killed after 5 ratings
        # the judge stages depend on the local judge's model (trained on one haystack here)
        run(["dvc", "repro", "crux-generate@crux-contexts", "local-judge-train"], project, env=ENV)
        journal = journals / "crux-judge_crux-contexts-rater.jsonl"
        mark = len(srv.log())
        done = kill_after(project, "crux-judge@crux-contexts-rater", journal, 5, ENV)
        killed = srv.log()[mark:]
        run(["dvc", "repro", "crux-judge@crux-contexts-rater"], project, env=ENV)
        after = srv.log()[mark + len(killed) :]
    finished = {r["body_sha256"] for r in killed if r["served"]}
    again = Counter(r["body_sha256"] for r in after)
    assert done >= 5 and len(finished - set(again)) >= done
    assert max(again.values()) == 1
    judged = jsonl(project / "judgements" / "crux" / "crux-contexts" / "rater.jsonl")
    assert len(judged) == 6 and all(j["status"] == "ok" for j in judged)
