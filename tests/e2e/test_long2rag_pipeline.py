"""Long²RAG end to end through the OpenAI-compatible test server (real HTTP, real DVC, MLflow).

Three questions of a user's file without key points: the construct stage builds them with an
LLM (decomposition, two extraction rounds, aggregation with one repaired exactly-one violation,
the score filter); a model answers in the long-context and a RAG setting; two LLM judges (one
call per key point, and batched) decide entailment; the aggregate's KPR is recomputed here by
hand from the judgements. Then: a forced re-run is served from the response cache, and a
SIGKILLed generation resumes from the journal without sending a finished item again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import BIN, ROOT, run
from tests.e2e import long2rag_responder as R

pytestmark = pytest.mark.slow

KEY_ENV = "LFBENCH_TEST_API_KEY"
ENV = {KEY_ENV: "sk-lfbench-test-long2rag"}
WORDS = ["river", "engine", "harvest", "orbit", "ledger", "canyon", "violin", "glacier"]


def _question(n: int, merge_twice: bool = False) -> dict[str, Any]:
    docs = []
    for d in range(1, 6):
        w = WORDS[(n + d) % len(WORDS)]
        facts = [
            f"Fact {k} of document {d} for question {n} concerns the {w} topic."
            for k in (1, 2, 3, 4)
        ]
        filler = [
            f"Filler sentence {k} mentions unrelated weather details number {k}." for k in range(60)
        ]
        docs.append({"doc_id": f"q{n}d{d}", "text": " ".join(facts + filler), "title": f"Doc {d}"})
    q = f"What do the documents say about the {WORDS[n]} topic?"
    return {
        "item_id": f"q{n}",
        "question": q + (" MERGE-TWICE" if merge_twice else ""),
        "domain": ["Biology", "History"][n % 2],
        "category": "Explanatory",
        "documents": docs,
    }


def _configure(proj: Path, base_url: str, **gen_extra: Any) -> None:
    rows = [_question(1, merge_twice=True), _question(2), _question(3)]
    src = proj / "inputs/long2rag/questions.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 10,
    }
    params["runtime"] = "local"
    params["models"]["tiny"] = {**endpoint, "model": "tiny-answerer", **gen_extra}
    params["judges"]["llm"] = {**endpoint, "model": "tiny-judge", "mode": "per_insight"}
    params["judges"]["llm-batch"] = {**endpoint, "model": "tiny-judge", "mode": "batched"}
    params["judges"]["builder"] = {**endpoint, "model": "tiny-builder"}
    l2 = params["long2rag"]
    l2["source"] = "inputs/long2rag/questions.jsonl"
    l2["construction"]["llm"] = "builder"
    l2["construction"]["decompose"] = True
    l2["settings"] = ["long_context", "rag_512"]
    l2["models"] = ["tiny"]
    l2["judges"] = ["llm", "llm-batch"]
    # in every judge stage's DAG: a small training run (all haystacks: some 25 CPU-s more)
    params["judges"]["local"]["train"]["haystacks"] = ["news1"]
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _usage(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(path.read_text())
    return out


def _server(tmp_path: Path, name: str, latency_ms: int = 2) -> TestServer:
    return TestServer(
        responder="tests.e2e.long2rag_responder:respond",
        log_path=tmp_path / f"{name}.log",
        cwd=ROOT,
        latency_ms=latency_ms,
    )


def test_long2rag_end_to_end(project: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with _server(tmp_path, "l2r") as srv:
        _configure(project, srv.base_url)
        run(["dvc", "repro", "long2rag-aggregate"], project, env=ENV)
        requests = srv.log()
        again = run(["dvc", "repro", "-f", "-s", "long2rag-construct"], project, env=ENV)
        assert len(srv.log()) == len(requests), again.stderr  # all from the response cache
    print(f"long2rag e2e: {time.monotonic() - t0:.1f} s")

    # ---- construction
    ds = _jsonl(project / "datasets/long2rag.jsonl")
    assert [q["item_id"] for q in ds] == ["q1", "q2", "q3"]
    for q in ds:
        assert q["sub_questions"] == ["first sub-question", "second sub-question"]
        # 5 documents x (2 points in round 1 + 1 in round 2), merged in pairs: 15 -> 8
        assert q["meta"]["extracted_points"] == 15 and q["meta"]["merged_points"] == 8
        assert q["key_points"], q["item_id"]
        # kept: exactly the points the responder scored 0.9 (>= 0.7); 0.4 ones are dropped
        assert all(kp["score"] == R.filter_score(kp["text"]) == 0.9 for kp in q["key_points"])
        doc_ids = [d["doc_id"] for d in q["documents"]]
        for kp in q["key_points"]:
            assert kp["doc_id"] in doc_ids and kp["doc_id"] == kp["support"][0]
            # a merged point is two extracted sentences of this question's documents
            assert kp["text"].count(f"for question {q['item_id'][1:]} ") in (1, 2)
    heads = [r["prompt_head"] for r in requests]
    n_filter = sum(1 for h in heads if h.startswith("Decide how likely"))
    assert n_filter == 3 * 8
    n_extract = sum(1 for h in heads if h.startswith("You build the reference answer key"))
    n_aggregate = sum(1 for h in heads if h.startswith("You merge the key points"))
    n_decompose = sum(1 for h in heads if h.startswith("You help someone research"))
    n_repair = sum(1 for h in heads if h.startswith("Your previous reply could not be used"))
    assert (n_decompose, n_extract, n_aggregate, n_repair) == (3, 30, 3, 1)
    c_usage = _usage(project / "datasets/long2rag.usage.json")
    assert c_usage["requests_sent"] == 0 and c_usage["cache_hits"] == 61  # the forced re-run

    # ---- generation: both settings; RAG holds at most 512 document tokens
    gens = _jsonl(project / "generations/long2rag/tiny.jsonl")
    assert len(gens) == 6 and all(g["status"] == "ok" for g in gens)
    assert Counter(g["setting"] for g in gens) == {"long_context": 3, "rag_512": 3}
    for g in gens:
        if g["setting"] == "rag_512":
            assert 0 < g["meta"]["context_tokens"] <= 512 and g["meta"]["chunks"]
        else:
            assert g["meta"]["context_tokens"] > 2000 and g["meta"]["chunks"] == []

    # ---- judging and KPR by hand
    n_kp = {q["item_id"]: len(q["key_points"]) for q in ds}
    per_point = _jsonl(project / "judgements/long2rag/tiny/llm.jsonl")
    batched = _jsonl(project / "judgements/long2rag/tiny/llm-batch.jsonl")
    assert sum(len(j["verdicts"]) for j in per_point) == 2 * sum(n_kp.values())
    assert _usage(project / "judgements/long2rag/tiny/llm.usage.json")["requests_sent"] == (
        2 * sum(n_kp.values())
    )
    assert _usage(project / "judgements/long2rag/tiny/llm-batch.usage.json")["requests_sent"] == 6
    texts = {(q["item_id"], kp["kp_id"]): kp["text"] for q in ds for kp in q["key_points"]}
    metrics = json.loads((project / "metrics/long2rag.json").read_text())
    rows = {(r["setting"], r["judge"]): r for r in metrics["rows"]}
    assert set(rows) == {(s, j) for s in ("long_context", "rag_512") for j in ("llm", "llm-batch")}
    for (setting, judge_name), row in rows.items():
        js = per_point if judge_name == "llm" else batched
        recalls = []
        for j in js:
            if j["setting"] != setting:
                continue
            labels = [v["label"] for v in j["verdicts"]]
            # the responder's verdict of each claim, so the judge's labels were taken as given
            assert labels == [
                R.verdict(texts[(j["item_id"], v["target_id"])]) for v in j["verdicts"]
            ]
            recalls.append(labels.count("yes") / len(labels))
        assert len(recalls) == 3
        assert row["kpr"] == pytest.approx(sum(recalls) / 3)
        assert row["n_scored"] == 3 and row["n_key_points"] == sum(n_kp.values())
        assert row["n_excluded"] == 0 and row["n_invalid_verdicts"] == 0
        assert set(row["by_domain"]) == {"Biology", "History"}
        assert 0.0 <= row["kpr"] <= 1.0
    # the two judges give the same labels: free-marginal kappa 1 on every unit
    (agree,) = metrics["agreement"]
    assert agree["n_units_binary"] == 2 * sum(n_kp.values())
    assert agree["kappa_free_binary"] == pytest.approx(1.0)
    assert agree["kappa_free_three_way"] == pytest.approx(1.0)

    # ---- MLflow: metric kpr, lineage tags, the plot
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("long2rag")
    runs = client.search_runs(
        [exp.experiment_id], filter_string="tags.`lfbench.current` = 'true'", max_results=100
    )
    assert len(runs) == 4
    r = next(
        x
        for x in runs
        if x.data.tags["judge.name"] == "llm" and x.data.tags["setting"] == "rag_512"
    )
    assert r.data.metrics["kpr"] == pytest.approx(rows[("rag_512", "llm")]["kpr"])
    assert r.data.tags["dataset.source"] == "inputs/long2rag/questions.jsonl"
    assert r.data.tags["model.provider"] == "openai" and r.data.tags["dvc.stage_md5"] != "unknown"
    files = {f.path for f in client.list_artifacts(r.info.run_id)}
    assert {"kpr_by_domain_and_category.png", "row.json", "items.jsonl"} <= files
    assert math.isfinite(r.data.metrics["kpr.domain.Biology"])


def test_long2rag_generate_sigkill_resumes_from_journal(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "kill", latency_ms=400) as srv:
        _configure(project, srv.base_url, max_concurrency=1)
        run(["dvc", "repro", "long2rag-construct"], project, env=ENV)
        before_gen = len(srv.log())
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **ENV}
        proc = subprocess.Popen(
            ["dvc", "repro", "long2rag-generate@tiny"],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        journal = project / ".lfbench/journal/long2rag-generate_tiny.jsonl"

        def journaled() -> list[dict[str, Any]]:
            done = []
            for ln in (journal.read_text() if journal.exists() else "").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    done.append(json.loads(ln))
            return done

        deadline = time.monotonic() + 120
        while len(journaled()) < 2:
            assert proc.poll() is None, "the stage ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.5)
        done = journaled()
        sent_before = srv.log()[before_gen:]
        assert 2 <= len(done) < 6
        run(["dvc", "repro", "long2rag-generate@tiny"], project, env=ENV)
        after = srv.log()[before_gen + len(sent_before) :]
    gens = _jsonl(project / "generations/long2rag/tiny.jsonl")
    assert len(gens) == 6 and all(g["status"] == "ok" for g in gens)
    resent = Counter(r["body_sha256"] for r in after)
    assert sum(resent.values()) == 6 - len(done) and max(resent.values()) == 1
    finished = {r["body_sha256"] for r in sent_before if r["served"]}
    assert len(finished - set(resent)) >= len(done)
