"""A model's own slice (`models.<m>.slice.<benchmark>`) and its length-study opt-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.config import Slice
from pipeline.core.errors import ConfigError
from pipeline.core.params import validate_params
from tests.conftest import ROOT

IDS = ["news1/a", "news1/b", "news2/c", "conv1/d", "news1@25k/a"]


def test_slice_selects_ids_and_haystack_prefixes_then_the_first_n() -> None:
    assert Slice(items=["news1"]).select(IDS) == ["news1/a", "news1/b"]  # not news1@25k
    assert Slice(items=["news1"], first=1).select(IDS) == ["news1/a"]
    assert Slice(items=["conv1/d", "news2/c"]).select(IDS) == [
        "news2/c",
        "conv1/d",
    ]  # dataset order
    assert Slice(first=2).select(IDS) == ["news1/a", "news1/b"]
    assert Slice().select(IDS) == IDS and Slice().describe() == "all"
    assert Slice(items=["nope"]).select(IDS) == []
    assert Slice(items=["news1"], first=1).describe() == "news1 first 1"


def _params(edit: Any) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["models"]["mine"] = {
        "provider": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "x",
        "api_key_env": None,
        "settings": ["oracle"],
        "slice": {"summhay": {"items": ["news1"], "first": 1}},
    }
    raw["summhay"]["models"].append("mine")
    edit(raw)
    return dict(raw)


def test_a_slice_is_checked_against_the_benchmarks_that_run_the_model() -> None:
    params = validate_params(_params(lambda raw: None))
    spec: Any = params.models["mine"]
    assert spec.slice["summhay"].first == 1 and spec.length_study is False
    assert params.models["lead"].length_study is True  # a baseline costs nothing

    def unused(raw: dict[str, Any]) -> None:
        raw["models"]["mine"]["slice"]["long2rag"] = {"first": 2}

    with pytest.raises(ConfigError, match=r"models\.mine\.slice\.long2rag.*does not list"):
        validate_params(_params(unused))

    def unknown(raw: dict[str, Any]) -> None:
        raw["models"]["mine"]["slice"]["nope"] = {"first": 2}

    with pytest.raises(ConfigError, match="no benchmark section 'nope'"):
        validate_params(_params(unknown))

    def zero(raw: dict[str, Any]) -> None:
        raw["models"]["mine"]["slice"]["summhay"] = {"first": 0}

    with pytest.raises(ConfigError, match="first"):
        validate_params(_params(zero))


def test_summhay_cuts_inside_haystacks_and_studies_lengths_by_opt_in(mirror: Path) -> None:
    from pipeline.benchmarks.summhay.benchmark import SummHay, studied
    from pipeline.core.config import BaselineModel, OpenAIModel
    from pipeline.core.extensions import restrict
    from pipeline.data.haystacks import Derivation, load_raw_haystack, normalise

    hay = normalise("news1", load_raw_haystack(mirror / "summhay/topic_news1.json"), "x.json")
    bench = SummHay()
    first = hay.subtopics[0].item_id
    (cut,) = restrict(bench, [hay], {first})  # SummHay's ItemsInRecords extension
    assert [s.item_id for s in cut.subtopics] == [first] and cut.documents == hay.documents
    assert restrict(bench, [hay], set()) == []
    recipe = Derivation(
        kind="recombined",
        collection="25k",
        sources=["news1"],
        target_tokens=25_000,
        n_tokens=24_000,
        seed=0,
        recipe_sha="0" * 64,
    )
    derived = hay.model_copy(update={"haystack_id": "news1@25k", "derived": recipe})
    mine = OpenAIModel(
        provider="openai", base_url="http://x/v1", model="m", api_key_env=None, settings=["oracle"]
    )
    lead = BaselineModel(provider="baseline", kind="lead", settings=["oracle"])
    assert studied("mine", mine, [hay, derived]) == [hay]  # opt-in: off for a model with calls
    assert studied("lead", lead, [hay, derived]) == [hay, derived]


def test_a_slice_naming_an_unknown_item_is_an_error_naming_it(mirror: Path) -> None:
    """Issue 36, point 13. Before: `items: [news1, news99]` ran news1 and dropped news99
    without a word."""
    from pipeline.benchmarks.summhay.benchmark import SummHay
    from pipeline.data.haystacks import load_raw_haystack, normalise
    from pipeline.stages.generate import sliced

    hay = normalise("news1", load_raw_haystack(mirror / "summhay/topic_news1.json"), "x.json")
    bench = SummHay()
    first = hay.subtopics[0].item_id
    assert bench.items(sliced(bench, [hay], Slice(items=["news1"]), "m", "d.jsonl"))
    for items, unknown in (
        (["news1", "news99"], "'news99'"),
        ([first, "news1/nope", "conv9"], "'news1/nope', 'conv9'"),
    ):
        with pytest.raises(ConfigError, match=r"models\.m\.slice\.summhay") as err:
            sliced(bench, [hay], Slice(items=items), "m", "d.jsonl")
        assert f"names no item of d.jsonl: {unknown}" in str(err.value)
