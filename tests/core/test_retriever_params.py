"""`retrievers:` entries, the benchmarks' `retrievers` lists and settings that name them, and
the models that are whole RAG systems (`python`, `outputs`): validated like models, every error
naming the key."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.core.errors import ConfigError
from pipeline.core.params import validate_params
from tests.conftest import yaml_default

EMB = {"provider": "embeddings", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


def _base() -> dict[str, Any]:
    p = copy.deepcopy(yaml_default())
    p["retrievers"] = {"emb": dict(EMB), "mine": {"provider": "python", "entry": "mine:score"}}
    return p


def test_the_shipped_params_and_retrievers_in_every_benchmark_validate() -> None:
    p = _base()
    for b in ("summhay", "long2rag", "crux", "crud_rag"):
        p[b]["retrievers"] = ["emb", "mine"]
    p["models"]["lead"]["settings"] = ["oracle", "bm25", "emb", "mine"]
    p["long2rag"]["settings"] = ["rag_512", "rag_512@emb", "rag_1024@mine"]
    p["models"]["crux-contexts"]["retrievers"] += ["emb", "mine"]
    p["crud_rag"]["grid"]["retriever"] = ["bm25", "emb"]
    p["models"]["rag"] = {"provider": "python", "entry": "my_rag:answer"}
    p["models"]["theirs"] = {
        "provider": "outputs",
        "files": {"summhay": "inputs/systems/a.jsonl", "long2rag": "inputs/systems/b.jsonl"},
    }
    p["summhay"]["models"] += ["rag", "theirs"]
    p["long2rag"]["models"] += ["rag", "theirs"]
    p["crux"]["models"] += ["rag"]
    params = validate_params(p)
    assert set(params.retrievers) == {"emb", "mine"}
    assert params.retrievers["emb"].provider == "embeddings"


Edit = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Edit:
    def edit(p: dict[str, Any]) -> None:
        *keys, last = path.split(".")
        node = p
        for k in keys:
            node = node[k]
        node[last] = value

    return edit


CASES: list[tuple[str, list[Edit], str]] = [
    (
        "unknown provider",
        [_set("retrievers.x", {"provider": "faiss"})],
        r"retrievers\.x.*unknown retriever provider",
    ),
    (
        "the project's own name",
        [_set("retrievers.bm25", {"provider": "bm25"})],
        r"entry name 'bm25'.*project's own",
    ),
    ("a dot in the name", [lambda p: p["retrievers"].update({"a.b": dict(EMB)})], r"has a dot"),
    (
        "not defined",
        [_set("summhay.retrievers", ["ghost"])],
        r"summhay\.retrievers.*'ghost'.*not defined under retrievers",
    ),
    (
        "a benchmark's own name",
        [_set("retrievers.oracle", dict(EMB)), _set("summhay.retrievers", ["oracle"])],
        r"retrievers\.oracle.*one of summhay's own settings",
    ),
    (
        "a run file for another benchmark only",
        [
            _set("retrievers.r", {"provider": "run", "files": {"crux": "x.run"}}),
            _set("summhay.retrievers", ["r"]),
        ],
        r"retrievers\.r\.files.*no run file for summhay",
    ),
    (
        "a reranker over a ranking the benchmark lacks",
        [
            _set("retrievers.rr", {**EMB, "provider": "rerank", "over": "vector"}),
            _set("long2rag.retrievers", ["rr"]),
        ],
        r"retrievers\.rr\.over.*'vector' is not a ranking long2rag has",
    ),
    (
        "a malformed entry point",
        [_set("retrievers.p", {"provider": "python", "entry": "mine.py"})],
        r"not an entry point",
    ),
    (
        "a key in the URL",
        [_set("retrievers.e", {**EMB, "base_url": "http://h/v1?key=s3cr3t"})],
        r"query or fragment",
    ),
    ("an unknown key", [_set("retrievers.e", {**EMB, "windows": 3})], r"retrievers\.e\.windows"),
    (
        "a setting naming an entry the benchmark does not list",
        [_set("models.lead.settings", ["emb"])],
        r"models\.lead\.settings: unknown setting .emb..*"
        r"listed in long2rag\.retrievers, summhay\.retrievers",
    ),
    (
        "a Long2RAG budget naming an entry it does not list",
        [_set("long2rag.settings", ["rag_512@emb"])],
        r"'rag_512@emb' names 'emb'.*long2rag\.retrievers does not list",
    ),
    (
        "a CRUD-RAG knob naming nothing",
        [_set("crud_rag.grid.retriever", ["bm25", "splade"])],
        r"crud_rag\.grid: retriever 'splade'",
    ),
    (
        "CRUX contexts naming an entry it does not list",
        [_set("models.crux-contexts.retrievers", ["bm25", "emb"])],
        r"models\.crux-contexts\.retrievers: 'emb'",
    ),
    (
        "an outputs model without a file for a benchmark that runs it",
        [
            _set("models.theirs", {"provider": "outputs", "files": {"crux": "a.jsonl"}}),
            _set("long2rag.models", ["lead", "theirs"]),
        ],
        r"models\.theirs\.files.*no file for long2rag",
    ),
    (
        "a RAG system where the benchmark cannot run one",
        [
            _set("models.rag", {"provider": "python", "entry": "r:f"}),
            _set("crud_rag.models", ["rag"]),
        ],
        r"crud_rag\.models.*'rag' has provider python, which crud_rag cannot run",
    ),
]


@pytest.mark.parametrize(("what", "edits", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_retriever_or_system_is_refused_naming_the_key(
    what: str, edits: list[Edit], message: str
) -> None:
    p = _base()
    for edit in edits:
        edit(p)
    with pytest.raises(ConfigError, match=message) as err:
        validate_params(p)
    assert "s3cr3t" not in str(err.value)
