"""`lfbench plan` before a `dvc repro` of a new model and LLM judge (test server, real HTTP):
the requests it plans are the requests the server then receives, its prompt tokens are within
10% of the usage the server reports, and it sends nothing itself. Also: `dvc repro --dry` of such
a project (the DVC bug `lfbench plan` stands in for)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SUMMHAY_TARGETS, list_entries, run
from tests.e2e.test_llm_pipeline import _configure, _env, _server

pytestmark = pytest.mark.slow

LLM_SAMPLES = 2  # annotated summaries the LLM judge scores in the agreement stage


def _by_stage(plan: dict[str, Any]) -> dict[tuple[str, str | None], dict[str, Any]]:
    return {(r["stage"], r["judge"]): r for r in plan["rows"]}


def test_plan_matches_what_dvc_repro_sends(project: Path, tmp_path: Path) -> None:
    # usage counted in cl100k_base, as an OpenAI model counts (the default: a quarter of the
    # characters, some 34% more on these news prompts)
    with _server(tmp_path, "plan", latency_ms=2, tokenizer="cl100k") as srv:
        # one subtopic, two settings: 2 summaries; one per-insight LLM judge
        _configure(project, srv.base_url, judges={"llm": {"mode": "per_insight"}}, subtopics=1)
        path = project / "params.yaml"
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
        params["models"]["tiny"]["max_tokens"] = 200
        params["judges"]["llm"]["max_tokens"] = 64
        params["judges"]["llm"]["requests_per_minute"] = 600
        params["summhay"]["agreement"] = {"llm_max_samples": LLM_SAMPLES, "bootstrap_resamples": 0}
        path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        list_entries(project)
        run(["dvc", "repro", "summhay-construct"], project, env=_env())

        out = run(["lfbench", "plan", "--json"], project, env=_env())
        plan = json.loads(out.stdout)
        # `lfbench plan TARGETS`: what `dvc repro TARGETS` runs, their upstream stages with them
        # (the bug: the aggregate's plan alone, 0 requests)
        out = run(["lfbench", "plan", "--json", *SUMMHAY_TARGETS], project, env=_env())
        targeted = json.loads(out.stdout)
        assert targeted["totals"]["requests"] == plan["totals"]["requests"] > 0
        assert "summhay-generate@tiny" in targeted["stages"]
        text = run(["lfbench", "plan"], project, env=_env()).stdout
        assert srv.log() == []  # planning sent nothing

        rows = _by_stage(plan)
        gen = rows[("summhay-generate@tiny", None)]
        judge = rows[("summhay-judge@tiny-llm", "llm")]
        agree = rows[("summhay-agreement", "llm")]
        assert gen["requests"] == 2 and not gen["estimated"]
        assert judge["estimated"] and "estimated" in text
        assert agree["requests"] > 0
        # no-model stages: listed, nothing to send
        assert rows[("local-judge-train", None)]["requests"] == 0
        assert judge["time_s"] == pytest.approx((judge["requests"] - 1) * 60 / 600)
        # the clock: every stage that runs timed or named unknown, the wall time at --jobs
        # (default 8) no more than the stages one after another
        clock = plan["clock"]
        assert "summhay-generate@tiny" in clock["unknown"]  # no rate given, none measured
        assert "summhay-judge@tiny-llm" in clock["stages"]  # its rate limit
        assert 0 < clock["wall_s"] <= clock["serial_s"]

        # the other benchmarks' stages send nothing: SummHay's are the whole plan
        run(["dvc", "repro", *SUMMHAY_TARGETS], project, env=_env())
        served = [r for r in srv.log() if r["served"]]

    assert len(srv.log()) == len(served)  # no fault, no retry, no repair
    planned = plan["totals"]["requests"]
    assert planned == len(served) == gen["requests"] + judge["requests"] + agree["requests"]
    gen_usage = json.loads((project / "generations/summhay/tiny.usage.json").read_text())
    judge_usage = json.loads((project / "judgements/summhay/tiny/llm.usage.json").read_text())
    assert gen_usage["requests_sent"] == gen["requests"]
    assert judge_usage["requests_sent"] == judge["requests"]

    recorded = sum(r["prompt_tokens"] for r in served)
    estimate = plan["totals"]["prompt_tokens"]
    completion = sum(r["completion_tokens"] for r in served)
    print(
        f"\nplan: {planned} requests, {estimate} prompt tokens,"
        f" <= {plan['totals']['completion_tokens_max']} completion tokens;"
        f" served: {len(served)} requests, {recorded} prompt tokens, {completion} completion"
        f" tokens; generate {gen['prompt_tokens']} planned vs {gen_usage['input_tokens']},"
        f" judge {judge['prompt_tokens']} planned vs {judge_usage['input_tokens']}\n{text}"
    )
    assert abs(estimate - recorded) <= 0.10 * recorded
    assert completion <= plan["totals"]["completion_tokens_max"]

    # the generations deleted: DVC would re-run both stages, and the plan finds every request
    # in the response cache (the judge's exactly: it judges the cached answers)
    (project / "generations/summhay/tiny.jsonl").unlink()
    again = _by_stage(json.loads(run(["lfbench", "plan", "--json"], project, env=_env()).stdout))
    assert {("summhay-generate@tiny", None), ("summhay-judge@tiny-llm", "llm")} <= set(again)
    assert sum(r["requests"] for r in again.values()) == 0
    g2, j2 = again[("summhay-generate@tiny", None)], again[("summhay-judge@tiny-llm", "llm")]
    assert (g2["requests"], g2["cache_hits"]) == (0, 2)
    assert (j2["requests"], j2["cache_hits"], j2["estimated"]) == (0, judge["requests"], False)


def test_dry_run_on_a_new_model(project: Path) -> None:
    """`lfbench plan --dry` is `dvc repro --dry` that works on a project whose stages have yet to
    make the inputs of others (plain DVC fails on the first such stage, here every stage after
    `image`, looking it up in its run cache: treeverse/dvc#9818)."""
    _configure(project, "http://127.0.0.1:9/v1", judges={"llm": {"mode": "batched"}}, subtopics=1)
    out = run(["lfbench", "plan", "--dry"], project, env=_env())
    log = out.stdout + out.stderr
    assert "> lfbench run judge --benchmark summhay --model tiny --judge llm" in log
    assert "summhay-aggregate" in log
