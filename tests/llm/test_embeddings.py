"""Embeddings through an OpenAI-compatible `/v1/embeddings` endpoint (the test server over real
HTTP, the real `openai` client): order, dedupe, injected faults, the journal (a second run and a
resumed run send no text twice), garbage answers, a missing key; and cosine similarity."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import LfbenchError
from pipeline.core.types import EndpointConfig
from pipeline.llm import embeddings as E
from pipeline.testing.server import TestServer, text_vector
from tests.conftest import ROOT

KEY_ENV = "LFBENCH_EMBED_TEST_KEY"
TEXTS = [f"第{i}条新闻：海滨市地铁线路今天开通，设站{i}座。" for i in range(150)]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-embed-test")


def endpoint(url: str, **kw: object) -> EndpointConfig:
    return EndpointConfig.model_validate(
        {"base_url": url, "model": "tiny-embed", "api_key_env": KEY_ENV, "timeout_s": 1.0,
         "max_retries": 8, **kw}
    )  # fmt: skip


def served(log: list[dict[str, object]]) -> Counter[str]:
    return Counter(str(r["body_sha256"]) for r in log if r["served"])


def test_vectors_in_order_deduped_and_journaled(tmp_path: Path) -> None:
    with TestServer(log_path=tmp_path / "log", cwd=ROOT) as srv:
        ep = endpoint(srv.base_url, price_input_per_1m=2.0)
        texts = [*TEXTS[:70], TEXTS[0], TEXTS[1]]  # two repeats: sent once
        vectors, report = E.embed_remote(ep, texts, tmp_path / "j.jsonl", label="t")
        first = srv.log()
        again, report2 = E.embed_remote(ep, texts, tmp_path / "j.jsonl", label="t")
        assert len(srv.log()) == len(first)  # a second run: every vector from the journal
    want = np.asarray([text_vector(t) for t in texts], dtype=np.float32)
    assert vectors.shape == (72, 64) and np.allclose(vectors, want, atol=1e-6)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(again, vectors)
    assert sum(int(r["n_inputs"]) for r in first) == 70  # type: ignore[call-overload]
    assert (report.requests_sent, report.cache_misses, report.journal_hits) == (2, 70, 0)
    assert report.input_tokens > 0 and report.cost_usd == pytest.approx(
        report.input_tokens * 2.0 / 1e6
    )
    assert (report2.requests_sent, report2.journal_hits) == (0, 70)


def test_injected_faults_change_nothing(tmp_path: Path) -> None:
    with TestServer(
        log_path=tmp_path / "log", cwd=ROOT, fault_rate=0.2, faults=["429", "500", "hang"],
        hang_s=3.0, retry_after=0.2, seed=7,
    ) as srv:  # fmt: skip
        ep = endpoint(srv.base_url)
        vectors, report = E.embed_remote(ep, TEXTS, tmp_path / "j.jsonl", label="t", batch_size=8)
        log = srv.log()
    assert sum(1 for r in log if r["fault"]) >= 2 and report.requests_sent == 19
    assert report.retries == sum(1 for r in log if r["fault"])
    assert max(served(log).values()) == 1
    assert np.allclose(vectors, np.asarray([text_vector(t) for t in TEXTS]), atol=1e-6)


def test_a_resumed_run_sends_only_the_missing_texts(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    with TestServer(log_path=tmp_path / "log", cwd=ROOT) as srv:
        ep = endpoint(srv.base_url)
        E.embed_remote(ep, TEXTS[:64], journal, label="t")  # a first run that stopped here
        # a kill mid-write leaves a torn last line: ignored
        with journal.open("a", encoding="utf-8") as f:
            f.write('{"key": "torn", "vec')
        mark = len(srv.log())
        vectors, report = E.embed_remote(ep, TEXTS, journal, label="t")
        resumed = srv.log()[mark:]
    assert sum(int(r["n_inputs"]) for r in resumed) == len(TEXTS) - 64  # type: ignore[call-overload]
    assert (report.journal_hits, report.cache_misses) == (64, len(TEXTS) - 64)
    assert np.allclose(vectors, np.asarray([text_vector(t) for t in TEXTS]), atol=1e-6)


def test_garbage_answers_and_a_missing_key_are_named_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestServer(cwd=ROOT) as srv:
        ep = endpoint(srv.base_url)
        with pytest.raises(LfbenchError) as e:
            E.embed_remote(ep, ["a garbage-embedding text"], tmp_path / "j.jsonl", label="judge-x")
        assert "judge-x" in str(e.value) and "tiny-embed" in str(e.value)
        assert "unusable answer" in str(e.value)
        monkeypatch.delenv(KEY_ENV)
        with pytest.raises(LfbenchError, match=KEY_ENV):
            E.embed_remote(ep, ["x"], tmp_path / "k.jsonl", label="judge-x")
    assert not (tmp_path / "k.jsonl").exists()
    # the key never reaches the journal
    assert "sk-embed-test" not in json.dumps(E.read_journal(tmp_path / "j.jsonl"))


def test_cosine_pairs_by_hand() -> None:
    a = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 1.0]], dtype=np.float32)
    b = np.array([[0.0, 2.0], [3.0, 4.0], [-1.0, -1.0]], dtype=np.float32)
    assert np.allclose(E.cosine_pairs(a, b), [0.0, 1.0, -1.0])


def test_the_local_fallback_is_minilm_unit_length() -> None:
    v = E.embed_local(["海滨市地铁开通。", "海滨市地铁开通。", "The weather is fine."])
    assert v.shape == (3, 384) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sims = E.cosine_pairs(v[:2], v[1:])
    assert sims[0] == pytest.approx(1.0, abs=1e-6) and sims[1] < 0.9
    assert "not the paper's model" in E.LOCAL_MODEL


def test_timeout_s_is_a_deadline_for_each_attempt(tmp_path: Path) -> None:
    """A server sending its vectors a byte at a time (each read well within timeout_s) is given
    up on at timeout_s and asked again (issue 36, point 5, for embeddings): the first two
    attempts of the batch drip (minutes each), the third is served. Before, each read was timed
    only: the call outlived the test's minute."""
    import threading

    out: dict[str, object] = {}
    with TestServer(
        log_path=tmp_path / "log", cwd=ROOT, faults=["drip"], fault_rate=1.0,
        max_faults_per_request=2, drip_s=0.2,
    ) as srv:  # fmt: skip
        ep = endpoint(srv.base_url, timeout_s=1.0, max_retries=3)

        def call() -> None:
            out["result"] = E.embed_remote(ep, TEXTS[:2], tmp_path / "j.jsonl", label="t")

        worker = threading.Thread(target=call, daemon=True)
        worker.start()
        worker.join(60.0)
        log = srv.log()
        assert not worker.is_alive(), "a dripping answer held the call past a minute"
    vectors, report = out["result"]  # type: ignore[misc]
    assert [r["fault"] for r in log] == ["drip", "drip", None]
    assert report.retries == 2 and report.requests_sent == 1
    assert np.allclose(vectors, np.asarray([text_vector(t) for t in TEXTS[:2]]), atol=1e-6)
