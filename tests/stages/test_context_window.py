"""A model entry's `context_window` (issue 36, point 18): SummHay packs a small window's RAG
contexts to fit it, and `lfbench plan` counts and names the requests that still do not fit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.core.errors import ConfigError
from pipeline.core.params import validate_params
from pipeline.core.types import ChatRequest, EndpointConfig
from pipeline.stages.common import context, read_dataset
from pipeline.stages.construct import construct
from pipeline.stages.plan import Built, StagePlan, fill, message_tokens

ROOT = Path(__file__).resolve().parents[2]


def _params(**entry: Any) -> Any:
    model = {
        "provider": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "m",
        "api_key_env": None,
        "settings": ["oracle", "bm25", "full"],
        "max_tokens": 512,
    }
    return validate_params(
        {
            "models": {"local": model | entry},
            "judges": {"local": {"provider": "local"}},
            "summhay": {"haystacks": ["news1"], "models": ["local"], "judges": ["local"]},
        },
        benchmarks=["summhay"],
    )


def test_a_model_entry_declares_its_context_window() -> None:
    assert _params(context_window=8192).models["local"].context_window == 8192
    assert _params().models["local"].context_window is None
    with pytest.raises(ConfigError, match=r"models\.local\.context_window"):
        _params(context_window=100)


def test_plan_names_the_requests_that_do_not_fit(tmp_path: Path) -> None:
    ep = EndpointConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=None,
                        max_tokens=100, context_window=1000)  # fmt: skip
    built = [
        Built(ChatRequest(f"k{n}", [{"role": "user", "content": "word " * n}], "sha"))
        for n in (100, 899, 900, 901, 5000)
    ]
    sizes = [message_tokens(b.request) for b in built]
    plan = fill(StagePlan("s", "generate"), ep, built, tmp_path, "s", None, None)
    over = [b.request.key for b, n in zip(built, sizes, strict=True) if n + 100 > 1000]
    assert over[-2:] == ["k901", "k5000"] and "k100" not in over and plan.over_context == len(over)
    assert plan.notes == [
        f"{len(over)} of 5 requests will not fit the context window (1,000 tokens; prompt in"
        f" cl100k_base + max_tokens, up to {sizes[-1] + 100:,}): {', '.join(over)}. A server"
        " refuses them (HTTP 400) or, started with a larger context than the model was trained"
        " for, answers them with nonsense"
    ]
    none = fill(StagePlan("s", "generate"), ep.model_copy(update={"context_window": None}),
                built, tmp_path, "s", None, None)  # fmt: skip
    assert none.over_context == 0 and none.notes == []


def test_summhay_packs_a_small_window_s_rag_contexts_to_fit(mirror: Path, tmp_path: Path) -> None:
    data = tmp_path / "summhay"
    data.mkdir()
    shutil.copy(mirror / "summhay" / "topic_news1.json", data)
    bench = registry.get("summhay")
    ds = tmp_path / "summhay.jsonl"
    construct(bench, _params(), data, ds, ROOT)
    dataset = read_dataset(bench, ds)[:1]

    def planned(**entry: Any) -> list[Any]:
        params = _params(**entry)
        ctx = context(bench, params, ROOT, data)
        return list(bench.plan_generations(ctx, "local", params.models["local"], dataset))

    wide, narrow = planned(), planned(context_window=8192)
    assert len(wide) == len(narrow) == 3 * len(dataset[0].subtopics)
    for w, n in zip(wide, narrow, strict=True):
        assert (w.item_id, w.setting) == (n.item_id, n.setting)
        tokens = message_tokens(n.request)
        if n.setting == "full":  # the whole haystack: nothing to fit, left as it is
            assert n.request == w.request and "context_budget" not in n.meta
            assert tokens > 8192
            continue
        # the section's 15,000 tokens of documents do not fit: fewer documents, and the prompt
        # fits with room for the answer and a model tokenizer's 15% more tokens
        assert message_tokens(w.request) > 15000 and "context_budget" not in w.meta
        assert tokens * 1.15 + 512 <= 8192
        assert n.meta["context_budget"] < 15000
        assert set(n.meta["context_docs"]) < set(w.meta["context_docs"])
