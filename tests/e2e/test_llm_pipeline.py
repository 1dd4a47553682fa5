"""`dvc repro` with a model and judges behind the OpenAI-compatible test server (real HTTP).

One haystack, two subtopics, two context settings. Checks the metrics against the judgements,
the usage and cost, the MLflow record, the response cache, a SIGKILL mid-stage, injected faults,
a judge that answers garbage, a missing key, and that the key never lands in a file or a log.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import (
    BIN,
    ROOT,
    SUMMHAY_TARGETS,
    list_entries,
    run,
    slice_crud_rag,
    slice_crux,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def project(shared_project: Path) -> Path:
    """This module's projects share the session's DVC cache (`conftest.share_dvc_cache`): the
    stages every sliced DAG holds run once, not in each test."""
    return shared_project


# A recognisable key made at run time (so no file holds it, this one included).
FAKE_KEY = "sk-lfbench-FAKE-" + uuid.uuid4().hex
KEY_ENV = "LFBENCH_TEST_API_KEY"
RESPONDER = "tests.e2e.summhay_responder"
HEAD = "prompt_head"
AGREEMENT_SAMPLES = 2  # the server log's field with the start of the last user message


def _configure(
    proj: Path,
    base_url: str,
    *,
    judges: dict[str, dict[str, Any]] | None = None,
    subtopics: int = 2,
    model_extra: dict[str, Any] | None = None,
) -> None:
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 10,
        "max_retries": 6,
    }
    params["runtime"] = "local"
    # keep the entries the default long2rag stages use, on a small slice
    builtin_models = {k: v for k, v in params["models"].items() if v["provider"] == "long2rag-lead"}
    builtin_judges = {
        k: v for k, v in params["judges"].items() if v["provider"] == "long2rag-overlap"
    }
    # The local judge's training stage is always in the DAG: keep it, on one haystack.
    local = params["judges"]["local"]
    local["train"]["haystacks"] = ["news1"]
    builtin_judges["local"] = local
    params["long2rag"]["derived"].update(haystacks=["news1"], subtopics=1)
    params["long2rag"]["models"] = list(builtin_models)
    params["long2rag"]["judges"] = [k for k in builtin_judges if k != "local"]
    params["models"] = {
        **builtin_models,
        "tiny": {
            **endpoint,
            "model": "tiny-summarizer",
            "settings": ["oracle", "bm25"],
            "price_input_per_1m": 1.0,
            "price_output_per_1m": 2.0,
            **(model_extra or {}),
        },
    }
    judges = judges or {"llm": {"mode": "per_insight"}, "llm-batch": {"mode": "batched"}}
    params["judges"] = builtin_judges | {
        name: {
            **endpoint,
            "model": "tiny-judge",
            "price_input_per_1m": 0.5,
            "price_output_per_1m": 1.5,
            **extra,
        }
        for name, extra in judges.items()
    }
    slice_crux(params)
    slice_crud_rag(params)
    params["summhay"]["haystacks"] = ["news1"]
    params["summhay"]["lengths"]["haystacks"] = []  # no length study here
    params["summhay"]["subtopics"] = subtopics
    params["summhay"]["models"] = ["tiny"]
    params["summhay"]["judges"] = list(judges)
    # The agreement stage scores the first annotated summaries with each judge too.
    params["summhay"]["agreement"] = {"max_samples": AGREEMENT_SAMPLES, "bootstrap_resamples": 20}
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    list_entries(proj)


def _env() -> dict[str, str]:
    return {KEY_ENV: FAKE_KEY}


def _rows(proj: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads((proj / "metrics/summhay.json").read_text())["rows"]
    return rows


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _usage(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(path.read_text())
    return out


def _is_generation(request: dict[str, Any]) -> bool:
    """Generation prompts start with the documents' description, judge prompts do not."""
    return str(request.get(HEAD, "")).startswith("Below are")


def _server(tmp_path: Path, name: str, **kw: Any) -> TestServer:
    return TestServer(
        responder=f"{RESPONDER}:{kw.pop('responder', 'respond')}",
        log_path=tmp_path / f"{name}.log",
        cwd=ROOT,
        **kw,
    )


def test_llm_pipeline_end_to_end(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "e2e", latency_ms=5) as srv:
        _configure(project, srv.base_url)
        out = run(["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env())
        log = out.stdout + out.stderr
        requests = srv.log()
        # a forced re-run of the generation is served from the response cache: 0 requests
        gens_first = _jsonl(project / "generations/summhay/tiny.jsonl")
        usage_first = _usage(project / "generations/summhay/tiny.usage.json")
        again = run(["dvc", "repro", "-f", "-s", "summhay-generate@tiny"], project, env=_env())
        log += again.stdout + again.stderr
        assert len(srv.log()) == len(requests)
        # a forced re-run of the agreement stage (answers from the cache) times its judges
        # again: their speed is re-logged in place, no MLflow run is made or superseded
        agree = run(["dvc", "repro", "-f", "-s", "summhay-agreement"], project, env=_env())
        log += agree.stdout + agree.stderr
        assert "mlflow agreement: 0 runs created" in agree.stderr, agree.stderr[-3000:]
        assert "0 superseded" in agree.stderr and len(srv.log()) == len(requests)
    usage_again = _usage(project / "generations/summhay/tiny.usage.json")
    assert usage_again["requests_sent"] == 0 and usage_again["cache_hits"] == 4
    assert _jsonl(project / "generations/summhay/tiny.jsonl") == gens_first
    run(
        ["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env()
    )  # judges and aggregate: unchanged inputs

    gens = _jsonl(project / "generations/summhay/tiny.jsonl")
    assert len(gens) == 4 and all(g["status"] == "ok" for g in gens)  # 2 subtopics x 2 settings
    assert {g["setting"] for g in gens} == {"oracle", "bm25"}

    per_insight = _jsonl(project / "judgements/summhay/tiny/llm.jsonl")
    batched = _jsonl(project / "judgements/summhay/tiny/llm-batch.jsonl")
    n_verdicts = sum(len(j["verdicts"]) for j in per_insight)
    assert n_verdicts == sum(len(j["verdicts"]) for j in batched) > 0
    # one call per (insight, summary) vs one per summary, and nothing else was sent
    # ... plus the agreement stage: both judges on the first annotated summaries
    labels = json.loads((project / "data/summhay/eval_benchmark_data.json").read_text())
    annotated = labels[:AGREEMENT_SAMPLES]
    n_agree = sum(len(x["reference_insights"]) for x in annotated)
    served = [r for r in requests if r["served"]]
    assert len(served) == len(requests) == 4 + n_verdicts + 4 + n_agree + AGREEMENT_SAMPLES

    # agreement with people, recomputed from the scripted judge's labels
    from sklearn.metrics import cohen_kappa_score

    from tests.e2e.summhay_responder import _verdict

    cls = {"FULL_COVERAGE": 2, "PARTIAL_COVERAGE": 1, "NO_COVERAGE": 0}
    hum = {"fully_covered": 2, "partially_covered": 1, "not_covered": 0}
    ours, theirs = [], []
    for x in annotated:
        text = {i["insight_id"]: i["insight"] for i in x["reference_insights"]}
        for a in x["annotation"]:
            ours.append(cls[_verdict(text[a["insight_id"]], len(x["summary"]))["coverage"]])
            theirs.append(hum[a["coverage"]])
    agreement = json.loads((project / "metrics/agreement.json").read_text())["rows"]
    vs_human = {r["judge"]: r for r in agreement if r["reference"] == "human"}
    for name in ("llm", "llm-batch"):
        assert vs_human[name]["n"] == n_agree and vs_human[name]["source"] == "judged by lfbench"
        assert vs_human[name]["cohen_kappa"] == pytest.approx(
            cohen_kappa_score(ours, theirs, labels=[0, 1, 2])
        )
        # its judge card: cost per 1,000 verdicts from the recorded cost; its speed is run
        # state, recorded by the agreement stage beside the cache (.lfbench/timing)
        card = vs_human[name]["card"]
        assert card["cost_status"] == "measured" and card["throughput_stage"] == "summhay-agreement"
        assert card["cost_per_1000"] == pytest.approx(vs_human[name]["cost_usd"] / n_agree * 1000)
    from pipeline.stages.timing import read_throughput

    speeds = read_throughput(project, "summhay-agreement")
    assert {speeds[n].n_judgements for n in ("llm", "llm-batch")} == {n_agree}
    assert all(speeds[n].judgements_per_second for n in ("llm", "llm-batch"))
    # judge vs judge is measured on the released systems' summaries both judges scored: the
    # agreement stage does not read your own models' judgements (adding a model does not re-run
    # it), and this run has no released system (tests/benchmarks/summhay/test_agreement.py
    # checks the pair rows)
    assert not [r for r in agreement if r["reference"] != "human"]

    gen_usage = usage_first
    pi_usage = _usage(project / "judgements/summhay/tiny/llm.usage.json")
    b_usage = _usage(project / "judgements/summhay/tiny/llm-batch.usage.json")
    assert gen_usage["requests_sent"] == 4 and gen_usage["cache_misses"] == 4
    assert pi_usage["requests_sent"] == n_verdicts and b_usage["requests_sent"] == 4
    assert b_usage["input_tokens"] < pi_usage["input_tokens"]

    # metrics: coverage recomputed by hand from the judge's labels, cost from the token counts
    rows = {(r["setting"], r["judge"]): r for r in _rows(project) if r["mode"] == "paper"}
    assert set(rows) == {(s, j) for s in ("oracle", "bm25") for j in ("llm", "llm-batch")}
    for (setting, judge_name), row in rows.items():
        js = per_insight if judge_name == "llm" else batched
        labels = [v["label"] for j in js if j["setting"] == setting for v in j["verdicts"]]
        credit = {"FULL_COVERAGE": 100.0, "PARTIAL_COVERAGE": 50.0, "NO_COVERAGE": 0.0}
        assert row["coverage"] == pytest.approx(sum(credit[x] for x in labels) / len(labels))
        assert row["n_scored"] == 2 and row["n_invalid_verdicts"] == 0
        g_tok = [g["usage"] for g in gens if g["setting"] == setting]
        j_tok = [j["usage"] for j in js if j["setting"] == setting]
        cost = sum(u["input_tokens"] * 1.0 + u["output_tokens"] * 2.0 for u in g_tok) / 1e6
        cost += sum(u["input_tokens"] * 0.5 + u["output_tokens"] * 1.5 for u in j_tok) / 1e6
        assert row["cost_usd"] == pytest.approx(cost, abs=1e-6) and cost > 0  # 6 decimals

    # MLflow: one current run per row, with usage, cost and cache counts
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("summhay")
    runs = client.search_runs(
        [exp.experiment_id], filter_string="tags.`lfbench.current` = 'true'", max_results=100
    )
    assert len(runs) == len(_rows(project))
    r = next(x for x in runs if x.data.tags["judge.name"] == "llm-batch")
    m = r.data.metrics
    # the forced re-run of generate made the runs' generate figures those of a cached pass
    assert m["generate.requests_sent"] == 0 and m["generate.cache_hits"] == 4
    assert m["judge.requests_sent"] == 4 and m["cost_usd"] > 0
    assert {"generate.cache_hits", "judge.input_tokens", "judge.wall_s"} <= set(m)
    assert r.data.tags["judge.prompt_sha"] not in ("published", "none")
    news_prompt = (project / "pipeline/benchmarks/summhay/prompts/generate_news.txt").read_bytes()
    assert r.data.tags["model.prompt_sha"] == hashlib.sha256(news_prompt).hexdigest()
    assert r.data.tags["model.provider"] == "openai"

    # the key never reaches a file of the project, the DVC files, MLflow or the logs
    assert FAKE_KEY not in log
    for path in project.rglob("*"):
        if path.is_file() and ".git" not in path.parts and "data" not in path.parts[-3:-1]:
            assert FAKE_KEY.encode() not in path.read_bytes(), path


def test_generate_sigkill_resumes_without_resending(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "kill", latency_ms=400) as srv:
        _configure(
            project,
            srv.base_url,
            subtopics=6,
            model_extra={"max_concurrency": 2, "samples": 2},
        )  # 6 subtopics x 2 settings x 2 samples (seeds differ) = 24 requests, 2 at a time
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            **_env(),
        }
        proc = subprocess.Popen(
            ["dvc", "repro", "summhay-generate@tiny"],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        journal = project / ".lfbench/journal/summhay-generate_tiny.jsonl"

        def journaled() -> list[dict[str, Any]]:
            done = []
            text = journal.read_text() if journal.exists() else ""
            for ln in text.splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line torn by the kill
                    done.append(json.loads(ln))
            return done

        deadline = time.monotonic() + 300  # a loaded 2-core machine starts DVC slowly
        while len(journaled()) < 6:  # kill once a quarter of the items are durably finished
            assert proc.poll() is None, "the stage ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.5)
        before = srv.log()
        done = journaled()
        assert 6 <= len(done) < 24

        run(["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env())
        after = srv.log()[len(before) :]

    gens = _jsonl(project / "generations/summhay/tiny.jsonl")
    assert len(gens) == 24 and all(g["status"] == "ok" for g in gens)
    gen_after = [r for r in after if _is_generation(r)]
    resent = Counter(r["body_sha256"] for r in gen_after)
    # exactly the unfinished items were sent again, each once, none that had finished
    assert sum(resent.values()) == 24 - len(done)
    assert max(resent.values()) == 1
    finished_bodies = {r["body_sha256"] for r in before if r["served"]} - set(resent)
    assert len(finished_bodies) >= len(done)


def test_faults_every_item_completes_once(project: Path, tmp_path: Path) -> None:
    with _server(
        tmp_path,
        "faults",
        latency_ms=5,
        fault_rate=0.2,
        faults=["429", "500", "hang"],
        hang_s=3.0,
        retry_after=1,
        seed=7,
    ) as srv:
        _configure(
            project,
            srv.base_url,
            judges={"llm-batch": {"mode": "batched", "timeout_s": 1.0}},
            subtopics=4,
            model_extra={"timeout_s": 1.0, "max_concurrency": 8},
        )
        run(["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env())
        log = srv.log()
    faults = Counter(r["fault"] for r in log if r["fault"])
    assert sum(faults.values()) >= 2, faults  # some faults were injected and survived
    served = Counter(r["body_sha256"] for r in log if r["served"])
    assert max(served.values()) == 1  # no answer was asked for twice
    gens = _jsonl(project / "generations/summhay/tiny.jsonl")
    assert len(gens) == 8 and all(g["status"] == "ok" for g in gens)
    js = _jsonl(project / "judgements/summhay/tiny/llm-batch.jsonl")
    assert len(js) == 8 and all(j["status"] == "ok" for j in js)
    assert len(served) == 8 + 8 + AGREEMENT_SAMPLES  # + the agreement stage, batched
    usage = _usage(project / "generations/summhay/tiny.usage.json")
    assert usage["retries"] >= 1 and usage["errors"] == 0


def test_garbage_judge_is_counted_invalid_not_scored(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "garbage", latency_ms=1, responder="garbage_judge") as srv:
        _configure(project, srv.base_url, judges={"llm": {"mode": "per_insight"}})
        run(["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env())
        n_judge_calls = sum(1 for r in srv.log() if not _is_generation(r))
    js = _jsonl(project / "judgements/summhay/tiny/llm.jsonl")
    n = sum(len(j["verdicts"]) for j in js)
    assert n > 0 and all(v["status"] == "invalid" for j in js for v in j["verdicts"])
    assert all(j["status"] == "invalid" for j in js)
    rows = [r for r in _rows(project) if r["mode"] == "paper"]
    assert sum(r["n_invalid_verdicts"] for r in rows) == n
    assert all(r["coverage"] is None and r["n_insights"] == 0 for r in rows)
    report = (project / "reports/summhay.md").read_text()
    assert "invalid" in report.lower()
    usage = _usage(project / "judgements/summhay/tiny/llm.usage.json")
    assert usage["requests_sent"] == 2 * n  # each: one call and one repair
    # The agreement stage met the same garbage on the annotated summaries: counted, not scored.
    labels = json.loads((project / "data/summhay/eval_benchmark_data.json").read_text())
    n_agree = sum(len(x["reference_insights"]) for x in labels[:AGREEMENT_SAMPLES])
    assert n_judge_calls == 2 * n + 2 * n_agree
    agreement = json.loads((project / "metrics/agreement.json").read_text())["rows"]
    [row] = [r for r in agreement if r["judge"] == "llm" and r["reference"] == "human"]
    assert row["n"] == 0 and row["n_invalid"] == n_agree and row["cohen_kappa"] is None


def test_repaired_answers_are_not_invalid(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "repair", latency_ms=1, responder="first_answer_garbage_judge") as srv:
        _configure(project, srv.base_url, judges={"llm-batch": {"mode": "batched"}})
        run(["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env())
        assert srv.log()
    js = _jsonl(project / "judgements/summhay/tiny/llm-batch.jsonl")
    assert all(j["status"] == "ok" for j in js)
    usage = _usage(project / "judgements/summhay/tiny/llm-batch.usage.json")
    assert usage["requests_sent"] == 2 * len(js)
    assert all(r["n_invalid_verdicts"] == 0 for r in _rows(project))


def test_missing_key_is_a_clear_error(project: Path, tmp_path: Path) -> None:
    with _server(tmp_path, "nokey", latency_ms=1) as srv:
        _configure(project, srv.base_url)
        assert KEY_ENV not in os.environ
        proc = run(["dvc", "repro", *SUMMHAY_TARGETS], project, check=False)
        assert srv.log() == []
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    # the first stage that needs the key names its entry: the model's generate stage, or the
    # agreement stage (its LLM judge scores the human-labelled summaries), whichever DVC runs first
    assert ("models.tiny" in err or "judges.llm" in err) and KEY_ENV in err, err[-3000:]
