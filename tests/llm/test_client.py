"""The LLM client over real HTTP against the test server: cache, journal, retries, faults, cost,
rate limit, and that the API key never reaches a log."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import LfbenchError
from pipeline.llm.client import (
    ChatRequest,
    ChatResult,
    EndpointConfig,
    UsageReport,
    cache_key,
    clear_journal,
    resolve_api_key,
    run_chat_sync,
    write_usage,
)
from pipeline.testing.server import TestServer
from tests.conftest import ROOT

FAKE_KEY = "sk-lfbench-UNIT-FAKE-0d9c8b7a6f5e4d3c"
KEY_ENV = "LFBENCH_UNIT_TEST_KEY"

# Scripted behaviour, keyed by a marker in the last user message.
SCRIPT: list[dict[str, Any]] = [
    {"match": "[429-once]", "faults": ["429"]},
    {"match": "[500-twice]", "faults": ["500", "500"]},
    {"match": "[hang-once]", "faults": ["hang"]},
    {"match": "[malformed-once]", "faults": ["malformed"]},
    {"match": "[truncated]", "faults": ["truncated"], "reply": "0123456789abcdefghij"},
    {"match": "[bad-request]", "status": 400, "reply": "this request is invalid"},
    {"match": "[always-500]", "status": 500, "reply": "down"},
    {"match": "[fixed]", "reply": "a fixed answer"},
    {"match": "[drip-twice]", "faults": ["drip", "drip"]},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    log = tmp_path_factory.mktemp("llm-server") / "requests.log"
    with TestServer(script=SCRIPT, hang_s=20.0, retry_after=1, log_path=log, cwd=ROOT) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, FAKE_KEY)


def endpoint(srv: TestServer, **kw: Any) -> EndpointConfig:
    settings: dict[str, Any] = {
        "base_url": srv.base_url,
        "model": "unit-model",
        "api_key_env": KEY_ENV,
        "max_concurrency": 8,
        "timeout_s": 5.0,
        "max_retries": 4,
    }
    settings.update(kw)
    return EndpointConfig(**settings)


def reqs(n: int, tag: str = "", prefix: str | None = None) -> list[ChatRequest]:
    """n distinct requests; `prefix` (default: a fresh uuid) keeps tests apart in the log."""
    prefix = prefix or uuid.uuid4().hex[:12]
    return [
        ChatRequest(
            key=f"item-{i}",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"{prefix} question {i} {tag}".strip()},
            ],
            prompt_sha="p1",
        )
        for i in range(n)
    ]


def log_for(srv: TestServer, requests: list[ChatRequest]) -> list[dict[str, Any]]:
    heads = {r.messages[-1]["content"][:200] for r in requests}
    return [r for r in srv.log() if r["prompt_head"] in heads]


def run(ep: EndpointConfig, rs: list[ChatRequest], tmp: Path | None = None, **kw: Any) -> Any:
    return run_chat_sync(
        ep,
        rs,
        cache_path=kw.pop("cache_path", tmp / "cache.sqlite" if tmp else None),
        journal_path=kw.pop("journal_path", None),
        label=kw.pop("label", "unit"),
        progress=False,
        **kw,
    )


# ---------------------------------------------------------------- cache


def test_second_run_is_served_from_the_cache(server: TestServer, tmp_path: Path) -> None:
    ep = endpoint(server)
    rs = reqs(6)
    first, rep1 = run(ep, rs, tmp_path)
    assert [r.key for r in first] == [r.key for r in rs]  # in order
    assert all(r.status == "ok" and r.source == "api" for r in first)
    assert rep1.requests_sent == 6 and rep1.cache_misses == 6 and rep1.cache_hits == 0
    assert len(log_for(server, rs)) == 6

    second, rep2 = run(ep, rs, tmp_path)
    assert len(log_for(server, rs)) == 6  # nothing sent
    assert [r.text for r in second] == [r.text for r in first]
    assert all(r.source == "cache" and r.requests == 0 for r in second)
    assert rep2.requests_sent == 0 and rep2.cache_hits == 6 and rep2.cache_misses == 0
    assert rep2.cost_usd == 0.0
    # a trailing slash on the base URL is the same endpoint
    _, rep3 = run(endpoint(server, base_url=server.base_url + "/"), rs, tmp_path)
    assert rep3.cache_hits == 6 and len(log_for(server, rs)) == 6


def test_cache_key_changes_with_each_keyed_field() -> None:
    ep = EndpointConfig(base_url="http://127.0.0.1:1/v1", model="m")
    req = ChatRequest(key="k", messages=[{"role": "user", "content": "hi"}], prompt_sha="p")
    base = cache_key(ep, req)
    changed_endpoint = [
        {"base_url": "http://127.0.0.1:2/v1"},
        {"model": "m2"},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"max_tokens": 77},
        {"seed": 1},
        {"seed": None},
    ]
    changed_request = [
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"messages": [{"role": "system", "content": "hi"}]},
        {"prompt_sha": "q"},
        {"sample": 1},
        {"max_tokens": 78},
        {"response_format": {"type": "json_object"}},
    ]
    keys = [base]
    for change in changed_endpoint:
        keys.append(cache_key(ep.model_copy(update=change), req))
    for change in changed_request:
        keys.append(cache_key(ep, ChatRequest(**{**req.__dict__, **change})))
    assert len(set(keys)) == len(keys)
    # request.max_tokens equal to the endpoint's default is the same effective request
    assert cache_key(ep, ChatRequest(**{**req.__dict__, "max_tokens": 1024})) == base
    # what does not change the answer does not change the key; the item key neither
    same = [
        {"base_url": "http://127.0.0.1:1/v1/"},
        {"api_key_env": "OTHER"},
        {"max_concurrency": 3},
        {"timeout_s": 5.0},
        {"max_retries": 0},
        {"price_input_per_1m": 3.0},
        {"requests_per_minute": 10.0},
    ]
    for change in same:
        assert cache_key(ep.model_copy(update=change), req) == base, change
    assert cache_key(ep, ChatRequest(**{**req.__dict__, "key": "other"})) == base


# ---------------------------------------------------------------- retries and faults


def test_429_waits_for_retry_after(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(2, "[429-once]")
    results, rep = run(endpoint(server), rs, tmp_path)
    assert all(r.status == "ok" and r.requests == 2 and r.retries == 1 for r in results)
    assert rep.retries == 2 and rep.requests_sent == 4
    log = log_for(server, rs)
    for body in {r["body_sha256"] for r in log}:
        attempts = sorted((r for r in log if r["body_sha256"] == body), key=lambda r: r["time"])
        assert [a["fault"] for a in attempts] == ["429", None]
        assert attempts[1]["time"] - attempts[0]["time"] >= 1.0  # Retry-After: 1


def test_500_is_retried(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(2, "[500-twice]")
    results, _ = run(endpoint(server), rs, tmp_path)
    assert all(r.status == "ok" and r.requests == 3 and r.retries == 2 for r in results)
    assert [r["status"] for r in log_for(server, rs)].count(500) == 4


def test_hang_times_out_and_is_retried(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(1, "[hang-once]")
    t0 = time.monotonic()
    results, _ = run(endpoint(server, timeout_s=1.0), rs, tmp_path)
    assert time.monotonic() - t0 < 10
    (r,) = results
    assert r.status == "ok" and r.requests == 2 and r.retries == 1
    served = [x for x in log_for(server, rs) if x["served"]]
    assert len(served) == 1


def test_timeout_s_is_a_deadline_for_the_whole_attempt(server: TestServer, tmp_path: Path) -> None:
    """A server that sends its answer one byte a second (each read well within timeout_s) is
    given up on at timeout_s, then retried (issue 36, point 5: an attempt lasted 256 s with
    timeout_s 5, aiohttp timing each read only). The answer would take ~200 s per attempt; a
    minute's bound on the whole run fails the old code."""
    import asyncio

    from pipeline.llm.client import run_chat

    rs = reqs(1, "[drip-twice]")
    ep = endpoint(server, timeout_s=2.0, max_retries=2)
    t0 = time.monotonic()
    coro = run_chat(ep, rs, cache_path=None, journal_path=None, label="unit", progress=False)
    (r,), _ = asyncio.run(asyncio.wait_for(coro, 60.0))
    took = time.monotonic() - t0
    log = log_for(server, rs)
    assert [x["fault"] for x in log] == ["drip", "drip", None], log
    assert r.status == "ok" and r.requests == 3 and r.retries == 2
    print(f"two dripping attempts given up at timeout_s 2, the third served: {took:.1f} s")


def test_malformed_json_is_retried(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(2, "[malformed-once]")
    results, _ = run(endpoint(server), rs, tmp_path)
    assert all(r.status == "ok" and r.requests == 2 for r in results)
    faults = Counter(x["fault"] for x in log_for(server, rs))
    assert faults["malformed"] == 2


def test_truncated_answer_is_returned_with_length(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(1, "[truncated]")
    (r,), _ = run(endpoint(server), rs, tmp_path)
    assert r.status == "ok" and r.requests == 1
    assert r.finish_reason == "length" and r.text == "0123456789"


def test_bad_request_fails_the_item_at_once(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(4)
    rs[1] = ChatRequest(
        key="bad",
        messages=[{"role": "user", "content": "x [bad-request]"}],
        prompt_sha=uuid.uuid4().hex,
    )
    results, rep = run(endpoint(server), rs, tmp_path)
    bad = results[1]
    assert bad.status == "error" and bad.requests == 1 and bad.retries == 0
    assert bad.error is not None and "400" in bad.error
    assert [r.status for i, r in enumerate(results) if i != 1] == ["ok"] * 3
    assert rep.errors == 1 and rep.ok == 3
    # an error is not cached: it is sent again next time
    again, rep2 = run(endpoint(server), rs, tmp_path)
    assert rep2.cache_hits == 3 and rep2.requests_sent == 1 and again[1].status == "error"


def test_item_failing_past_max_retries_is_an_error(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(3)
    rs[2] = ChatRequest(
        key="down",
        messages=[{"role": "user", "content": "y [always-500]"}],
        prompt_sha=uuid.uuid4().hex,
    )
    results, rep = run(endpoint(server, max_retries=2), rs, tmp_path)
    down = results[2]
    assert down.status == "error" and down.requests == 3 and down.retries == 2
    assert down.error is not None and "500" in down.error and "3 attempt" in down.error
    assert results[0].status == results[1].status == "ok"
    assert rep.requests_sent == 5 and rep.retries == 2 and rep.errors == 1


def test_fault_rate_every_item_ok_and_each_body_served_once(tmp_path: Path) -> None:
    with TestServer(
        fault_rate=0.2,
        faults=["429", "500", "hang", "malformed", "truncated"],
        retry_after=0.2,
        hang_s=5.0,
        seed=3,
        log_path=tmp_path / "faults.log",
        cwd=ROOT,
    ) as srv:
        rs = reqs(100)
        results, rep = run(endpoint(srv, timeout_s=1.0, max_concurrency=16), rs, tmp_path)
        log = srv.log()
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.error]
    served = Counter(x["body_sha256"] for x in log if x["served"])
    assert len(served) == 100 and set(served.values()) == {1}
    faults = Counter(x["fault"] for x in log if x["fault"])
    assert sum(faults.values()) >= 10 and len(faults) >= 3, faults
    assert rep.retries == sum(n for f, n in faults.items() if f != "truncated")
    assert rep.requests_sent == len(log)
    truncated = [r for r in results if r.finish_reason == "length"]
    assert len(truncated) == faults["truncated"]


# ---------------------------------------------------------------- journal


_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pipeline.llm.client import ChatRequest, EndpointConfig, run_chat_sync
    base_url, journal, out, prefix = sys.argv[1:5]
    ep = EndpointConfig(base_url=base_url, model="m", api_key_env=None, max_concurrency=4)
    rs = [ChatRequest(key=f"i{i}", messages=[{"role": "user", "content": f"{prefix} {i}"}],
                      prompt_sha="p") for i in range(40)]
    results, rep = run_chat_sync(ep, rs, cache_path=None, journal_path=Path(journal),
                                 label="child", progress=False)
    Path(out).write_text(json.dumps({"results": [r.model_dump() for r in results],
                                     "report": rep.model_dump()}))
    """
)


def _child(srv: TestServer, tmp: Path, prefix: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            srv.base_url,
            str(tmp / "j.jsonl"),
            str(tmp / "out.json"),
            prefix,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_journal_resume_after_sigkill(tmp_path: Path) -> None:
    prefix = uuid.uuid4().hex[:8]
    with TestServer(latency_ms=250, log_path=tmp_path / "kill.log", cwd=ROOT) as srv:
        proc = _child(srv, tmp_path, prefix)
        deadline = time.monotonic() + 30
        # answers come back in waves of 4 (concurrency 4, 250 ms): kill between two waves
        while sum(r["served"] for r in srv.log()) < 15:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.08)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        served_before = {r["body_sha256"] for r in srv.log() if r["served"]}
        time.sleep(0.4)  # the requests in flight at the kill are logged (unserved) by now
        before = srv.log()
        assert 15 <= len(served_before) < 40
        journal = (tmp_path / "j.jsonl").read_text()
        assert len([ln for ln in journal.splitlines() if ln.strip()]) >= 15

        # a torn last line, as a kill in the middle of a write would leave
        with (tmp_path / "j.jsonl").open("a") as f:
            f.write('{"cache_key": "abc", "key": "i1", "te')
        proc = _child(srv, tmp_path, prefix)
        assert proc.wait(timeout=60) == 0
        after = srv.log()[len(before) :]
    resent = Counter(r["body_sha256"] for r in after)
    assert not set(resent) & served_before  # nothing that was answered before is asked again
    assert max(resent.values()) == 1
    assert len(served_before) + len(resent) == 40
    out = json.loads((tmp_path / "out.json").read_text())
    results = [ChatResult(**r) for r in out["results"]]
    assert [r.key for r in results] == [f"i{i}" for i in range(40)]
    assert all(r.status == "ok" for r in results)
    assert sum(r.source == "journal" for r in results) == len(served_before)
    report = UsageReport(**out["report"])
    assert report.journal_hits == len(served_before) and report.requests_sent == len(resent)
    # every line of the journal now parses (the torn one was cut off before appending)
    lines = (tmp_path / "j.jsonl").read_text().splitlines()
    assert len(lines) == 40 and all(json.loads(ln) for ln in lines)
    clear_journal(tmp_path / "j.jsonl")
    assert not (tmp_path / "j.jsonl").exists()
    clear_journal(tmp_path / "j.jsonl")  # no error when already gone


def test_journal_items_are_not_sent_again_and_fill_the_cache(
    server: TestServer, tmp_path: Path
) -> None:
    ep = endpoint(server)
    rs = reqs(5)
    journal = tmp_path / "j.jsonl"
    _, rep1 = run(ep, rs[:3], cache_path=None, journal_path=journal)
    assert rep1.requests_sent == 3
    results, rep2 = run(ep, rs, tmp_path, journal_path=journal)
    assert [r.source for r in results] == ["journal"] * 3 + ["api"] * 2
    assert rep2.journal_hits == 3 and rep2.requests_sent == 2 and rep2.cache_misses == 2
    clear_journal(journal)
    _, rep3 = run(ep, rs, tmp_path, journal_path=journal)
    assert rep3.cache_hits == 5 and rep3.requests_sent == 0
    assert len(log_for(server, rs)) == 5


# ---------------------------------------------------------------- key, cost, rate, usage


def test_missing_key_names_the_variable(
    server: TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    ep = endpoint(server)
    with pytest.raises(LfbenchError, match=f"models.tiny.*{KEY_ENV}"):
        resolve_api_key(ep, "models.tiny")
    rs = reqs(1)
    with pytest.raises(LfbenchError, match=KEY_ENV):
        run(ep, rs, tmp_path, label="judges.x")
    assert log_for(server, rs) == []
    assert resolve_api_key(endpoint(server, api_key_env=None), "x")  # a placeholder


def test_api_key_never_in_logs_or_results(
    server: TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rs = [*reqs(3, "[500-twice]"), *reqs(1, "[bad-request]"), *reqs(2)]
    results, rep = run(
        endpoint(server, max_retries=1), rs, tmp_path, journal_path=tmp_path / "j.jsonl"
    )
    assert rep.errors >= 1 and caplog.records
    assert FAKE_KEY not in caplog.text
    assert all(FAKE_KEY not in r.model_dump_json() for r in results)
    write_usage(tmp_path / "usage.json", rep)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path


def test_cost_from_usage_by_hand(server: TestServer, tmp_path: Path) -> None:
    ep = endpoint(server, price_input_per_1m=3.0, price_output_per_1m=15.0)
    content = f"{uuid.uuid4().hex} [fixed] " + "x" * 57  # 32 + 9 + 57 = 98 chars
    rs = [ChatRequest(key="c", messages=[{"role": "user", "content": content}], prompt_sha="p")]
    (r,), rep = run(ep, rs, tmp_path)
    # the server counts chars // 4: 98 // 4 = 24 in, len("a fixed answer") // 4 = 3 out
    assert (r.input_tokens, r.output_tokens) == (24, 3)
    assert r.cost_usd == pytest.approx((24 * 3.0 + 3 * 15.0) / 1e6)
    assert rep.cost_usd == pytest.approx(r.cost_usd) and rep.input_tokens == 24
    (again,), rep2 = run(ep, rs, tmp_path)
    assert (again.input_tokens, again.output_tokens) == (24, 3)  # stored counts reported
    assert again.cost_usd == 0.0 and rep2.cost_usd == 0.0  # but nothing was spent


def test_rate_limit_spaces_requests(server: TestServer, tmp_path: Path) -> None:
    rs = reqs(12)
    t0 = time.monotonic()
    results, _ = run(endpoint(server, requests_per_minute=600), rs, tmp_path)
    assert time.monotonic() - t0 >= 1.0  # 12 requests at 10/s: the last starts at 1.1 s
    assert all(r.status == "ok" for r in results)
    times = sorted(x["time"] for x in log_for(server, rs))
    assert times[-1] - times[0] >= 1.0


def test_duplicate_requests_are_sent_once(server: TestServer, tmp_path: Path) -> None:
    (r,) = reqs(1)
    twins = [r, ChatRequest(**{**r.__dict__, "key": "twin"})]
    results, rep = run(endpoint(server), twins, cache_path=None)
    assert [x.key for x in results] == ["item-0", "twin"]
    assert results[0].text == results[1].text and rep.requests_sent == 1
    assert len(log_for(server, twins)) == 1


def test_usage_report_merge_and_write(tmp_path: Path) -> None:
    fields = dict.fromkeys(UsageReport.model_fields, 1)
    a = UsageReport(**{**fields, "label": "a", "cost_usd": 0.5, "wall_s": 1.5})
    b = UsageReport(**{**fields, "label": "b", "cost_usd": 0.25, "wall_s": 2.0})
    m = a.merged(b)
    assert m.label == "a" and m.items == 2 and m.cost_usd == 0.75 and m.wall_s == 3.5
    write_usage(tmp_path / "u.json", m)
    assert json.loads((tmp_path / "u.json").read_text())["requests_sent"] == 2


def test_no_key_needed_when_everything_is_cached(
    server: TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rs = reqs(2)
    run(endpoint(server), rs, tmp_path)
    monkeypatch.delenv(KEY_ENV)
    results, rep = run(endpoint(server), rs, tmp_path)
    assert rep.cache_hits == 2 and all(r.status == "ok" for r in results)


def test_journal_entry_edited_on_disk_is_refused_counted_and_fetched_again(
    server: TestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26 point 3: a journal line edited on disk is not served (checksum), it is counted
    (journal_corrupt), warned about once, and exactly its request is sent again."""
    ep = endpoint(server)
    rs = reqs(4, "[fixed]")
    journal = tmp_path / "j.jsonl"
    _, rep1 = run(ep, rs, cache_path=None, journal_path=journal)
    assert rep1.requests_sent == 4 and rep1.journal_corrupt == 0
    lines = journal.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4 and all("checksum" in json.loads(ln) for ln in lines)
    edited = json.loads(lines[2])
    edited["text"] = "an answer nobody gave"
    lines[2] = json.dumps(edited)
    journal.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = len(log_for(server, rs))
    with caplog.at_level(logging.WARNING, logger="lfbench.llm"):
        results, rep2 = run(ep, rs, cache_path=None, journal_path=journal)
    assert all(r.text == "a fixed answer" for r in results)
    assert rep2.journal_corrupt == 1 and rep2.journal_hits == 3 and rep2.requests_sent == 1
    again = log_for(server, rs)[before:]
    request = next(r for r in rs if r.key == edited["key"])  # lines are in finishing order
    assert [r["prompt_head"] for r in again] == [request.messages[-1]["content"]]
    warnings = [r for r in caplog.records if "fail their checksum" in r.getMessage()]
    assert len(warnings) == 1 and edited["key"] in warnings[0].getMessage()
    # the answer fetched again is journalled: a third run sends nothing and counts nothing
    _, rep3 = run(ep, rs, cache_path=None, journal_path=journal)
    assert rep3.requests_sent == 0 and rep3.journal_corrupt == 0 and rep3.journal_hits == 4


def test_journal_written_before_checksums_is_read_as_legacy(
    server: TestServer, tmp_path: Path
) -> None:
    """A journal whose lines carry no checksum (written by an older lfbench) is still read."""
    ep = endpoint(server)
    rs = reqs(3, "[fixed]")
    journal = tmp_path / "j.jsonl"
    run(ep, rs, cache_path=None, journal_path=journal)
    old = [json.loads(ln) for ln in journal.read_text(encoding="utf-8").splitlines()]
    for d in old:
        del d["checksum"]
    journal.write_text("".join(json.dumps(d) + "\n" for d in old), encoding="utf-8")
    _, rep = run(ep, rs, cache_path=None, journal_path=journal)
    assert rep.journal_hits == 3 and rep.requests_sent == 0 and rep.journal_corrupt == 0
    # checksummed on read: every line now carries one (later lines never mix with unchecked)
    lines = [json.loads(ln) for ln in journal.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3 and all("checksum" in d for d in lines)


# ---------------------------------------------------------------- what counts as sent


def test_a_request_that_never_left_the_client_is_not_counted_as_sent(
    server: TestServer, tmp_path: Path
) -> None:
    """`requests_sent` counts requests that reached a server (issue 36, point 9: credentials in
    the URL failed every request in the client, the usage file said 12 sent, the server got 0).
    A URL the client cannot send to (params refuse it; built here past the check) and a port
    where nothing listens: errors, 0 sent; a served request: 1 sent, as the server's log says."""
    import socket

    rs = reqs(2)
    creds = server.base_url.replace("http://", "http://user:pw@")
    unsendable = EndpointConfig.model_construct(
        **{**endpoint(server).model_dump(), "base_url": creds}
    )
    results, rep = run(unsendable, rs, tmp_path, cache_path=None)
    assert [r.status for r in results] == ["error", "error"] and log_for(server, rs) == []
    assert rep.requests_sent == 0 and all(r.requests == 0 for r in results), rep

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    results, rep = run(endpoint(server, base_url=closed, max_retries=1), rs, tmp_path)
    assert [r.status for r in results] == ["error", "error"]
    assert "could not connect" in (results[0].error or ""), results[0].error
    assert rep.requests_sent == 0 and rep.retries == 2, rep

    _, rep = run(endpoint(server), rs, tmp_path)
    assert rep.requests_sent == 2 == len(log_for(server, rs))
