"""An LLM judge judges the models chosen for it (issue 36, point 19).

Adding an LLM judge to `summhay.judges` used to judge every model of the benchmark: the 78
published systems' released summaries too (26,193 of the 34,363 requests `lfbench plan` showed)
and the no-model baselines. A judge entry's `models` now lists what it judges (`all` for every
model); without it, an LLM judge judges the models with calls only. A pair it does not judge
costs nothing: its stage sends no request, `lfbench plan` says why, and the aggregate lists it
under `not_judged`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.core.errors import ConfigError
from pipeline.core.io import write_jsonl
from pipeline.core.params import validate_params
from pipeline.core.records import Generation
from pipeline.stages.common import applies
from pipeline.stages.construct import construct
from pipeline.stages.judge import judge
from pipeline.stages.plan import Planner, StageCmd
from pipeline.testing.server import TestServer

ROOT = Path(__file__).resolve().parents[2]


def _params(judge_models: Any = None, base_url: str = "http://127.0.0.1:9/v1") -> Any:
    gpt: dict[str, Any] = {"provider": "openai", "base_url": base_url, "model": "j",
                           "api_key_env": None, "max_tokens": 16, "max_retries": 0}  # fmt: skip
    if judge_models is not None:
        gpt["models"] = judge_models
    return validate_params(
        {
            "models": {
                "published": {"provider": "published", "benchmark": "summhay"},
                "lead": {"provider": "baseline", "kind": "lead", "settings": ["oracle"]},
                "mine": {
                    "provider": "openai",
                    "base_url": base_url,
                    "model": "m",
                    "api_key_env": None,
                    "settings": ["oracle"],
                },
            },
            "judges": {"local": {"provider": "local"}, "gpt": gpt},
            "summhay": {
                "haystacks": ["news1"],
                "models": ["published", "lead", "mine"],
                "judges": ["local", "gpt"],
            },
        },
        benchmarks=["summhay"],
    )


@pytest.mark.parametrize(
    ("models", "judged"),
    [
        (None, {"mine"}),  # the default: the models with calls
        ("all", {"published", "lead", "mine"}),
        (["published"], {"published"}),
        (["mine", "lead"], {"mine", "lead"}),
    ],
)
def test_an_llm_judge_judges_the_models_chosen_for_it(models: Any, judged: set[str]) -> None:
    params = _params(models)
    assert {m for m in ("published", "lead", "mine") if applies(params, m, "gpt")} == judged
    # the local judge (free) still judges every model
    assert all(applies(params, m, "local") for m in ("published", "lead", "mine"))


def test_the_pairs_not_judged_are_listed_with_why() -> None:
    from pipeline.stages.aggregate import not_judged_lines, unjudged_pairs

    pairs = unjudged_pairs(_params(), ["published", "lead", "mine"], ["local", "gpt"])
    assert [(p["model"], p["judge"]) for p in pairs] == [("published", "gpt"), ("lead", "gpt")]
    assert "judges the models with calls unless judges.gpt.models lists" in pairs[0]["reason"]
    lines = not_judged_lines(pairs)
    assert lines[0] == "### Not judged, by choice"
    assert "| lead | gpt |" in "\n".join(lines)
    listed = unjudged_pairs(_params(["mine"]), ["published", "mine"], ["gpt"])
    why = "judges.gpt.models does not list published"
    assert listed == [{"model": "published", "judge": "gpt", "reason": why}]


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (["nosuch"], "judges.gpt.models: names 'nosuch', which is not defined under models"),
        ([], "an empty list judges nothing"),
        (["mine", "mine"], "lists a name twice"),
        ("some", "judges.gpt.models"),
    ],
)
def test_a_judge_s_models_are_checked(models: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _params(models)


def test_plan_counts_nothing_for_a_pair_not_chosen(tmp_path: Path) -> None:
    """The published systems' 3,276 summaries are not planned for a judge that was not asked
    to judge them (before: every one of them, per insight)."""
    params = _params()
    cmd = StageCmd.parse(
        "summhay-judge@published-gpt",
        "lfbench run judge --benchmark summhay --model published --judge gpt --dataset"
        " datasets/summhay.jsonl --generations generations/summhay/published.jsonl"
        " --data data/summhay --out judgements/summhay/published/gpt.jsonl",
    )
    plan = Planner(tmp_path, params, [cmd.name], None).judge(cmd, "summhay", "published", "gpt")
    assert (plan.requests, plan.prompt_tokens, plan.cost_usd_max) == (0, 0, 0.0)
    assert plan.notes == [
        "not judged, by choice: an LLM judge judges the models with calls unless"
        " judges.gpt.models lists others (published is provider published; models: all for"
        " every model)"
    ]


@pytest.mark.parametrize(("models", "sent"), [(None, False), ("all", True)])
def test_the_judge_stage_of_a_pair_not_chosen_sends_nothing(
    tmp_path: Path,
    haystack: dict[str, Any],
    write_haystack: Callable[..., Path],
    models: Any,
    sent: bool,
) -> None:
    """The baseline `lead` with an LLM judge: by default its judge stage sends no request and
    writes no judgements (before: one request per insight and summary); `models: all` asks."""
    data = write_haystack(haystack, "topic_news1.json").parent
    bench = registry.get("summhay")
    with TestServer(log_path=tmp_path / "s.log", cwd=ROOT) as srv:
        params = _params(models, srv.base_url)
        ds, gens = tmp_path / "ds.jsonl", tmp_path / "lead.jsonl"
        construct(bench, params, data, ds, ROOT)
        write_jsonl(gens, [
            Generation(benchmark="summhay", item_id=f"news1/{s}", model="lead", system="lead",
                       setting="oracle", status="ok", text="- Doc one. [1]")
            for s in ("s1", "s2")
        ])  # fmt: skip
        out = tmp_path / "j" / "gpt.jsonl"
        judge(bench, params, "lead", "gpt", ds, gens, data, out, ROOT)
        log = srv.log()
    usage = json.loads(out.with_name("gpt.usage.json").read_text())
    if sent:
        assert log and usage["requests_sent"] == len(log)
        assert out.read_text().strip()
    else:
        assert log == [] and usage["requests_sent"] == 0 and usage["items"] == 0
        assert out.read_text() == ""
