"""CRUD-RAG's RAGQuestEval end to end through the OpenAI-compatible test server (real HTTP,
real DVC, MLflow).

A user's benchmark file of Read (1-document QA) records: one whose ID the authors' released
cache holds (its questions are used as they are: no question-generation call), the others get
their questions from an LLM at construct time (one repaired answer among them); the lead
baseline answers from the retrieved chunks; an LLM judge answers each record's good questions
from each output. All of it under 20% injected faults (429, 500, hangs): nothing lost, no
request sent twice. Then a SIGKILL mid-judging: the re-run resumes from the journal and sends
no finished request again.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipeline.benchmarks.crud_rag.questeval import token_f1
from pipeline.core.records import generation_id
from pipeline.testing.server import TestServer, text_vector
from tests.conftest import ROOT, run
from tests.e2e import crud_responder as R
from tests.e2e.resume import jsonl, kill_after

pytestmark = pytest.mark.slow

KEY_ENV = "LFBENCH_TEST_API_KEY"
ENV = {KEY_ENV: "sk-lfbench-test-crud"}
CACHED = "64fa9b27b82641eb8ecbe14d"  # in the authors' QuestAnswer1Doc cache (3 questions)
NEWS = [
    "陕西西安市发放500万元体育类电子消费券，全市173家体育场馆可以使用。",
    "海滨市首条地铁线路今天开通，线路全长二十公里，设站十五座。",
    "山城县第五届苹果节今天开幕，苹果产量增长一成，节会持续三天。",
    "河口镇新建图书馆，藏书五万册，周末向市民开放。",
    "北岸区举办马拉松比赛，参赛选手超过两万人，赛道经过滨江公园。",
]
RECORDS = [
    {"ID": CACHED, "questions": "西安市发放了多少体育消费券？", "answers": "500万元"},
    {
        "ID": "qa-metro",
        "questions": "海滨市地铁线路有多长？",
        "answers": "海滨市地铁，全长二十公里",
    },
    {"ID": "qa-apple", "questions": "山城县苹果节持续几天？", "answers": "山城县苹果节，持续三天"},
    {"ID": "qa-library", "questions": "河口镇图书馆藏书多少？", "answers": "河口镇图书馆，五万册"},
    {"ID": "qa-garble", "questions": "马拉松有多少人参加？", "answers": "乱码测试，北岸区马拉松"},
]


def _configure(proj: Path, base_url: str, **judge_extra: Any) -> None:
    inputs = proj / "inputs" / "crud_rag"
    (inputs / "corpus").mkdir(parents=True, exist_ok=True)
    (inputs / "corpus" / "news.txt").write_text("\n".join(NEWS) + "\n", encoding="utf-8")
    (inputs / "mine.json").write_text(
        json.dumps({"questanswer_1doc": RECORDS}, ensure_ascii=False), encoding="utf-8"
    )
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
    params["judges"]["qg"] = {**endpoint, "model": "tiny-questions", **judge_extra}
    # it answers the questions from the baselines' outputs (no model calls): asked for
    params["judges"]["asker"] = {
        **endpoint,
        "model": "tiny-answers",
        "models": "all",
        **judge_extra,
    }
    crud = params["crud_rag"]
    crud.update(
        source="inputs/crud_rag/mine.json",
        tasks=["questanswer_1doc"],
        records=None,
        corpus="inputs/crud_rag/corpus",
        models=["lead"],
        judges=["crud-text", "asker"],
    )
    crud["grid"].update(
        base={"chunk_size": 32, "chunk_overlap": 0, "retriever": "bm25", "top_k": 2},
        chunk=[[32, 2], [64, 1]],
        chunk_overlap=[0],
        top_k=[1, 2],
    )
    crud["quest_eval"]["llm"] = "qg"
    # the embedding similarity through the same server's /v1/embeddings
    params["judges"]["crud-text"]["embedding"] = {
        k: v
        for k, v in {**endpoint, "model": "tiny-embed", **judge_extra}.items()
        if k != "provider"
    }
    path.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _gid(g: dict[str, Any]) -> str:
    return generation_id(g["item_id"], g["system"], g["setting"], g["sample"])


def _server(tmp_path: Path, name: str, **kw: Any) -> TestServer:
    return TestServer(
        responder="tests.e2e.crud_responder:respond",
        log_path=tmp_path / f"{name}.log",
        cwd=ROOT,
        **kw,
    )


def test_ragquesteval_under_faults_with_a_released_cache_entry(
    project: Path, tmp_path: Path
) -> None:
    with _server(
        tmp_path,
        "faults",
        latency_ms=5,
        fault_rate=0.2,
        faults=["429", "500", "hang"],
        hang_s=3.0,
        retry_after=1,
        seed=5,
    ) as srv:
        _configure(project, srv.base_url)
        run(["dvc", "repro", "crud_rag-aggregate"], project, env=ENV)
        log = srv.log()
    faults = Counter(r["fault"] for r in log if r["fault"])
    assert sum(faults.values()) >= 3, faults  # faults were injected, and survived
    served = Counter(r["body_sha256"] for r in log if r["served"])
    assert max(served.values()) == 1  # no answer was asked for twice

    # ---- construction: the cached record costs no call; the others got the LLM's questions
    items = {i["record_id"]: i for i in jsonl(project / "datasets" / "crud_rag.jsonl")}
    assert set(items) == {r["ID"] for r in RECORDS}
    released = json.loads(
        (project / "data/crud_rag/QuestAnswer1Doc_quest_gt_save.json").read_text()
    )
    cached = items[CACHED]["quest_eval"]
    assert cached["source"] == "released"
    assert {k: cached[k] for k in ("key_info", "question", "answers")} == released[CACHED]
    by_model = Counter(r["model"] for r in log if r["served"])
    # one question-generation call and one reference-answer call per uncached record, plus
    # one repair (the garbled record's reference answers)
    assert by_model["tiny-questions"] == 2 * 4 + 1
    sent_refs = [r for r in log if r["served"] and r["model"] == "tiny-questions"]
    assert not any("500万元" in json.dumps(r) for r in sent_refs if "prompt_head" in r)
    for rid in ("qa-metro", "qa-apple", "qa-library", "qa-garble"):
        ref = next(r["answers"] for r in RECORDS if r["ID"] == rid)
        key_info, qs = R.questions(ref)
        q = items[rid]["quest_eval"]
        assert (q["key_info"], q["question"]) == (key_info, qs)
        assert q["answers"] == [R.answer(x, ref) for x in qs] and q["source"] == "qg"
    # the questions are written back in the authors' layout, the cached entry unchanged
    written = json.loads(
        (project / "datasets/crud_rag/QuestAnswer1Doc_quest_gt_save.json").read_text()
    )
    assert written[CACHED] == released[CACHED] and set(written) == set(items)

    # ---- judging: one call per output (plus one repair per garbled output), answers as given
    gens = {_gid(g): g for g in jsonl(project / "generations/crud_rag/lead.jsonl")}
    judged = jsonl(project / "judgements/crud_rag/lead/asker.jsonl")
    assert {j["generation_id"] for j in judged} == set(gens)
    assert all(j["status"] == "ok" for j in judged)
    asked: set[tuple[str, str]] = set()
    garbled: set[tuple[str, str]] = set()
    for j in judged:
        g = gens[j["generation_id"]]
        q = items[g["item_id"].split("/", 1)[1]]["quest_eval"]
        kept = [i for i, a in enumerate(q["answers"]) if a != R.UN]
        assert [v["target_id"] for v in j["verdicts"]] == [f"q{i + 1}" for i in kept]
        for i, v in zip(kept, j["verdicts"], strict=True):
            assert v["label"] == R.answer(q["question"][i], g["text"])
        asked.add((g["item_id"], g["text"]))
        if any("乱码" in q["question"][i] for i in kept):
            garbled.add((g["item_id"], g["text"]))
    # settings that give an output the same text share its request (the response cache)
    assert len(asked) < len(judged) and garbled
    assert by_model["tiny-answers"] == len(asked) + len(garbled)

    # ---- the rows: recall and precision by hand from the answers
    rows = {
        (r["setting"], r["judge"]): r
        for r in json.loads((project / "metrics" / "crud_rag.json").read_text())["rows"]
    }
    setting = "bm25-c32-o0-k2"
    recalls, precisions = [], []
    for j in judged:
        g = gens[j["generation_id"]]
        if g["setting"] != setting:
            continue
        q = items[g["item_id"].split("/", 1)[1]]["quest_eval"]
        kept = [i for i, a in enumerate(q["answers"]) if a != R.UN]
        got = [R.answer(q["question"][i], g["text"]) for i in kept]
        answered = [(q["answers"][i], a) for i, a in zip(kept, got, strict=True) if a != R.UN]
        recalls.append(len(answered) / len(kept))
        precisions.append(
            sum(token_f1(r, a) for r, a in answered) / len(answered) if answered else 0.0
        )
    row = rows[(setting, "asker")]
    assert row["knob"] == "base" and row["n_scored"] == 5 and row["n_invalid"] == 0
    assert row["recall"] == pytest.approx(100 * sum(recalls) / 5, abs=1e-3)
    assert row["precision"] == pytest.approx(100 * sum(precisions) / 5, abs=1e-3)
    assert 0 < row["recall"] < 100  # the cached record's questions are not all answered
    text = rows[(setting, "crud-text")]
    assert text["n_scored"] == 5 and text["embedding_model"].startswith("tiny-embed at http")
    refs = {i["item_id"]: i["reference"] for i in items.values()}
    sims = []
    for g in gens.values():
        if g["setting"] == setting:
            a, b = np.asarray(text_vector(g["text"])), np.asarray(text_vector(refs[g["item_id"]]))
            sims.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    assert text["embedding_sim"] == pytest.approx(100 * sum(sims) / 5, abs=1e-3)
    # each distinct text embedded once: the outputs' and the references'
    embedded = [r for r in log if r["served"] and r["model"] == "tiny-embed"]
    distinct = {g["text"] for g in gens.values()} | set(refs.values())
    assert sum(int(r["n_inputs"]) for r in embedded) == len(distinct)
    assert "embedding similarity" in (project / "reports/crud_rag.md").read_text()
    usage = json.loads((project / "judgements/crud_rag/lead/asker.usage.json").read_text())
    assert usage["errors"] == 0 and usage["retries"] >= 1


def test_ragquesteval_sigkill_mid_judging_resumes(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "kill", latency_ms=200) as srv:
        _configure(project, srv.base_url, max_concurrency=1)
        run(["dvc", "repro", "crud_rag-generate@lead"], project, env=ENV)
        journal = project / ".lfbench" / "journal" / "crud_rag-judge_lead-asker.jsonl"
        mark = len(srv.log())
        done = kill_after(project, "crud_rag-judge@lead-asker", journal, 5, ENV)
        killed = srv.log()[mark:]
        assert not (project / "judgements/crud_rag/lead/asker.jsonl").exists()
        run(["dvc", "repro", "crud_rag-judge@lead-asker"], project, env=ENV)
        after = srv.log()[mark + len(killed) :]
    finished = {r["body_sha256"] for r in killed if r["served"]}
    again = Counter(r["body_sha256"] for r in after)
    # every journaled answer is kept (one served but not yet journaled when the kill came may
    # be asked again); nothing is asked twice in the resumed run
    assert done >= 5 and len(finished - set(again)) >= done
    assert max(again.values()) == 1
    gens = jsonl(project / "generations/crud_rag/lead.jsonl")
    judged = jsonl(project / "judgements/crud_rag/lead/asker.jsonl")
    assert len(judged) == len(gens) and all(j["status"] == "ok" for j in judged)
