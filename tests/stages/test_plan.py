"""`lfbench plan`'s arithmetic on hand-computed numbers: requests (distinct cache keys, less the
cache's hits) x prices, time from rate limits, a measured rate or concurrency; the stage
commands it reads; the agreement stage's cap on an LLM judge's samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.types import ChatRequest, EndpointConfig
from pipeline.llm.cache import CachedAnswer, ResponseCache
from pipeline.llm.client import cache_key
from pipeline.stages.common import llm_paths
from pipeline.stages.plan import Built, Measured, StageCmd, StagePlan, cost, duration, fill


def endpoint(**kw: object) -> EndpointConfig:
    base: dict[str, object] = {
        "base_url": "http://127.0.0.1:9/v1",
        "model": "m",
        "api_key_env": None,
        "max_tokens": 100,
        "price_input_per_1m": 2.5,
        "price_output_per_1m": 10.0,
        "max_concurrency": 8,
    }
    return EndpointConfig.model_validate(base | kw)


def test_cost_is_tokens_times_prices() -> None:
    # 1,000,000 x $2.5/1M + 200,000 x $10/1M = 2.5 + 2.0
    assert cost(endpoint(), 1_000_000, 200_000) == pytest.approx(4.5)


def test_duration_takes_the_tightest_limit() -> None:
    # 101 requests at 60/min: 100 intervals of 1 s; 30,000 tokens at 6,000/min: 300 s
    secs, basis = duration(endpoint(requests_per_minute=60, tokens_per_minute=6000), 101, 30_000)
    assert (secs, basis) == (pytest.approx(300.0), "tokens_per_minute")
    secs, basis = duration(endpoint(requests_per_minute=60), 101, 30_000)
    assert (secs, basis) == (pytest.approx(100.0), "requests_per_minute")


def test_duration_from_concurrency_or_a_measured_rate() -> None:
    # 20 requests, 8 at a time: 3 waves of 2 s
    secs, basis = duration(endpoint(), 20, 0, seconds_per_request=2.0)
    assert secs == pytest.approx(6.0) and "concurrency 8" in basis
    # an earlier run sent 50 requests in 100 s: 0.5/s, so 10 requests take 20 s
    rate = Measured(requests=50, output_tokens=5000, wall_s=100.0)
    assert rate.rate == 0.5 and rate.mean_output == 100.0
    secs, basis = duration(endpoint(), 10, 0, measured_rate=rate.rate, seconds_per_request=9.0)
    assert secs == pytest.approx(20.0) and basis.startswith("measured")
    # no limit and no pace: unknown, said so; nothing to send: no time
    assert duration(endpoint(), 10, 0)[0] is None
    assert duration(endpoint(requests_per_minute=1), 0, 0) == (0.0, "nothing to send")


def test_fill_counts_distinct_uncached_requests(tmp_path: Path) -> None:
    """Three requests built, two of them the same (sent once), one already in the response
    cache: one request to send; "hello world" is 2 cl100k tokens, its system message 1."""
    ep = endpoint(requests_per_minute=30)

    def req(text: str, key: str) -> ChatRequest:
        return ChatRequest(
            key, [{"role": "system", "content": "Hi"}, {"role": "user", "content": text}], "sha"
        )

    a, a2, b = req("hello world", "a"), req("hello world", "a2"), req("cached one", "b")
    assert cache_key(ep, a) == cache_key(ep, a2)
    cache = ResponseCache(llm_paths(tmp_path, "s")[0])
    cache.put_now([CachedAnswer(cache_key(ep, b), "old answer", "stop", 5, 2)])
    cache.close()

    plan = fill(
        StagePlan("s", "generate"), ep, [Built(a), Built(a2), Built(b)], tmp_path, "s", None, None
    )
    assert (plan.built, plan.cache_hits, plan.requests) == (2, 1, 1)
    assert plan.prompt_tokens == 1 + 2
    assert plan.completion_tokens_max == 100 and plan.completion_tokens_est is None
    assert plan.cost_usd_max == pytest.approx((3 * 2.5 + 100 * 10.0) / 1e6)
    assert plan.time_s == 0.0  # one request: no interval to wait

    # a stand-in output adds its tokens to the prompt; an earlier run's mean answer (40 tokens)
    # gives the completion estimate
    past = Measured(requests=4, output_tokens=160, wall_s=8.0)
    plan = fill(StagePlan("s", "judge"), ep, [Built(a, 7)], tmp_path, "s", past, None)
    assert plan.prompt_tokens == 3 + 7
    assert plan.completion_tokens_est == 40
    assert plan.cost_usd_est == pytest.approx((10 * 2.5 + 40 * 10.0) / 1e6)


def test_stage_cmd_reads_the_lfbench_options() -> None:
    cmd = StageCmd.parse(
        "summhay-judge@m-j",
        "lfbench run judge --benchmark summhay --model m --judge j --dataset datasets/s.jsonl"
        " --generations generations/summhay/m.jsonl --data data/summhay --out o.jsonl",
    )
    assert cmd.kind == "judge"
    assert cmd.options["generations"] == "generations/summhay/m.jsonl"
    assert cmd.options["judge"] == "j"
    assert StageCmd.parse("image", "lfbench image recipe --out build/image.json").kind == "other"


def test_an_llm_judge_scores_20_annotated_summaries_unless_asked_for_all() -> None:
    from pipeline.benchmarks.summhay.params import SummhayAgreement

    assert SummhayAgreement().llm_max_samples == 20
    assert SummhayAgreement().max_samples is None  # the other judges: all 200
    assert SummhayAgreement(llm_max_samples=None).llm_max_samples is None


def test_plan_counts_the_prompt_tokens_a_cl100k_server_reports(tmp_path: Path) -> None:
    """A request sent to the test server counting in cl100k_base: its usage's prompt tokens are
    the plan's count of the same request, and the request is then a cache hit."""
    from pipeline.llm.client import run_chat_sync
    from pipeline.stages.plan import message_tokens
    from pipeline.testing.server import TestServer

    text = "Summarize: the council voted 7-2 to fund the library's new wing in 2026."
    request = ChatRequest("k", [{"role": "user", "content": text}], "sha")
    with TestServer(tokenizer="cl100k") as srv:
        ep = endpoint(base_url=srv.base_url, max_tokens=16)
        planned = fill(StagePlan("s", "generate"), ep, [Built(request)], tmp_path, "s", None, None)
        assert planned.requests == 1
        [result], _ = run_chat_sync(
            ep, [request], cache_path=llm_paths(tmp_path, "s")[0], journal_path=None, label="s"
        )
    assert result.status == "ok"
    assert result.input_tokens == message_tokens(request) == planned.prompt_tokens
    again = fill(StagePlan("s", "generate"), ep, [Built(request)], tmp_path, "s", None, None)
    assert (again.requests, again.cache_hits) == (0, 1)


@pytest.mark.parametrize(
    ("cap", "expected"), [({}, 20), ({"llm_max_samples": 3}, 3), ({"llm_max_samples": None}, 25)]
)
def test_the_agreement_stage_gives_an_llm_judge_its_capped_samples(
    cap: dict[str, object], expected: int
) -> None:
    from pipeline.core import registry
    from pipeline.core.params import validate_params
    from pipeline.core.records import Generation
    from pipeline.stages.agreement import llm_labelled
    from pipeline.stages.common import context

    params = validate_params(
        {
            "models": {"lead": {"provider": "baseline", "kind": "lead"}},
            "judges": {"local": {"provider": "local"}},
            "summhay": {"models": ["lead"], "judges": ["local"], "agreement": cap},
        },
        benchmarks=["summhay"],
    )
    bench = registry.get("summhay")
    ctx = context(bench, params, Path(__file__).resolve().parents[2])
    gens = [
        Generation(
            benchmark="summhay", item_id=f"i{k}", model="m", system="s", setting="x", status="ok"
        )
        for k in range(25)
    ]
    assert [g.item_id for g in llm_labelled(bench, ctx, gens)] == [f"i{k}" for k in range(expected)]


def test_stand_ins_of_two_outputs_are_two_requests(tmp_path: Path) -> None:
    """Outputs not made yet are judged through stand-ins whose prompts are alike (their text is
    unknown): each is its own request, and none is taken for a cached one."""
    ep = endpoint()
    request = ChatRequest("k", [{"role": "user", "content": "hello world"}], "sha")
    cache = ResponseCache(llm_paths(tmp_path, "s")[0])
    cache.put_now([CachedAnswer(cache_key(ep, request), "old answer", "stop", 5, 2)])
    cache.close()
    built = [Built(request, 7, "g1"), Built(request, 7, "g2"), Built(request, 7, "g2")]
    plan = fill(StagePlan("s", "judge"), ep, built, tmp_path, "s", None, None)
    assert (plan.requests, plan.cache_hits, plan.prompt_tokens) == (2, 0, 2 * (2 + 7))


def test_an_entry_without_prices_plans_an_unknown_cost_not_zero(tmp_path: Path) -> None:
    """Issue 36, point 11. Before: a model whose entry names no prices planned cost_usd_max 0.0,
    with no note; now its cost is unknown (None, `?` in the table, the total unknown too) and a
    note says which prices to set (0 for a free local model)."""
    from pipeline.core.params import validate_params
    from pipeline.stages.plan import Plan, render, unpriced

    mine = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    params = validate_params(
        {
            "models": {
                "free": {**mine, "price_input_per_1m": 0, "price_output_per_1m": 0},
                "half": {**mine, "price_input_per_1m": 1.5},
                "mine": mine,
            },
            "judges": {"local": {"provider": "local"}},
            "summhay": {"models": ["free", "half", "mine"], "judges": ["local"]},
        },
        benchmarks=["summhay"],
    )
    assert unpriced(params.models["free"]) == []
    assert unpriced(params.models["half"]) == ["price_output_per_1m"]
    assert unpriced(params.models["mine"]) == ["price_input_per_1m", "price_output_per_1m"]
    request = ChatRequest("k", [{"role": "user", "content": "hello world"}], "sha")
    ep = endpoint(price_input_per_1m=0.0, price_output_per_1m=0.0)
    missing = unpriced(params.models["mine"])
    plan = fill(StagePlan("s", "generate", model="mine"), ep, [Built(request)], tmp_path, "s",
                Measured(4, 40, 1.0), None, unpriced=missing)  # fmt: skip
    assert plan.requests == 1 and plan.cost_usd_max is None and plan.cost_usd_est is None
    assert any("cost unknown" in n and "price_input_per_1m" in n for n in plan.notes)
    free = fill(StagePlan("s2", "generate", model="free"), ep, [Built(request)], tmp_path, "s2",
                None, None)  # fmt: skip
    assert free.cost_usd_max == 0.0 and not free.notes
    both = Plan(["s", "s2"], [plan, free], [])
    assert both.totals()["cost_usd_max"] is None
    assert (
        json.loads(json.dumps(both.to_json(), allow_nan=False))["rows"][0]["cost_usd_max"] is None
    )
    table = render(both)
    assert "cost unknown" in table and "?" in table.splitlines()[1]


def test_a_target_s_plan_has_the_stages_dvc_repro_runs_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lfbench plan TARGET` plans what `dvc repro TARGET` runs: the target and the changed
    stages upstream of it, in dvc.yaml's order (the bug: `dvc status TARGET` alone, so a plan
    of an aggregate whose generations were not made yet counted 0 requests, and `dvc repro`
    then sent 108)."""
    from pipeline.stages.plan import changed_stages
    from tests.conftest import run
    from tests.test_parallel import diamond, toy

    proj = toy(tmp_path / "p", diamond())
    monkeypatch.chdir(proj)
    assert [s.name for s in changed_stages(proj, ["d"])] == ["a", "b", "c", "d"]
    assert [s.name for s in changed_stages(proj, ["b"])] == ["a", "b"]
    run(["dvc", "repro", "a"], proj)
    assert [s.name for s in changed_stages(proj, ["d"])] == ["b", "c", "d"]
    assert [s.name for s in changed_stages(proj, [])] == ["b", "c", "d", "e"]
