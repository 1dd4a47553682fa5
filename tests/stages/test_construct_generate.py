"""The construct and generate stages on small inputs: what they check at construct time, the
errors that name file, line, item and field, and what a failed stage leaves behind."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.core.errors import DataError, StageFailed
from pipeline.core.params import validate_params
from pipeline.stages.construct import construct
from pipeline.stages.generate import generate

ROOT = Path(__file__).resolve().parents[2]
HAY = "topic_news1.json"


def summhay_params(models: dict[str, Any]) -> Any:
    return validate_params(
        {
            "models": models,
            "judges": {"local": {"provider": "local"}},
            "summhay": {"haystacks": ["news1"], "models": list(models), "judges": ["local"]},
        },
        benchmarks=["summhay"],
    )


def test_generate_fails_on_a_released_retriever_a_setting_needs(
    haystack: dict[str, Any], write_haystack: Callable[..., Path], tmp_path: Path
) -> None:
    """The mini haystack has oracle and random scores only: a model that runs `rerank3` makes
    its own generate stage fail, naming the haystack, the subtopic and the retriever (the
    construct stage reads no model entry, so adding a model never re-runs it); `bm25`
    (computed here) and a replayed release need no released scores."""
    path = write_haystack(haystack, HAY)
    bench = registry.get("summhay")
    data = path.parent
    ok = summhay_params(
        {"lead": {"provider": "baseline", "kind": "lead", "settings": ["oracle", "bm25"]}}
    )
    assert construct(bench, ok, data, tmp_path / "ds.jsonl", ROOT) == 1
    for setting, released in (("rerank3", "rerank3"), ("longembed", "dwzhu/e5-base-4k")):
        bad = summhay_params(
            {"lead": {"provider": "baseline", "kind": "lead", "settings": ["oracle", setting]}}
        )
        assert construct(bench, bad, data, tmp_path / "ds2.jsonl", ROOT) == 1
        with pytest.raises(DataError) as e:
            generate(bench, bad, "lead", tmp_path / "ds2.jsonl", data, tmp_path / "g2.jsonl", ROOT)
        assert e.value.file == HAY and e.value.item == "news1/s1"
        # the released name is the one the file uses (longembed is `dwzhu/e5-base-4k` there)
        assert e.value.field == f"retriever.{released}"
        assert f"setting {setting} of models.lead" in str(e.value)


def test_a_question_without_key_points_and_no_model_names_line_and_item(tmp_path: Path) -> None:
    docs = [{"doc_id": f"d{i}", "text": f"Text {i}."} for i in range(1, 6)]
    lines = [
        {"item_id": "q1", "question": "A?", "domain": "x", "category": "y", "documents": docs,
         "key_points": [{"text": "A point.", "doc_id": "d1"}]},
        {"item_id": "q7", "question": "B?", "domain": "x", "category": "y", "documents": docs},
    ]  # fmt: skip
    src = tmp_path / "questions.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    raw: dict[str, Any] = {
        "models": {"lead": {"provider": "baseline", "kind": "lead"}},
        "judges": {"local": {"provider": "local"}},
        "long2rag": {"source": str(src), "models": ["lead"], "judges": ["local"]},
    }
    params = validate_params(raw, benchmarks=["long2rag"])
    with pytest.raises(DataError) as e:
        construct(registry.get("long2rag"), params, tmp_path, tmp_path / "ds.jsonl", ROOT)
    assert e.value.file == f"{src}:2" and e.value.item == "q7" and e.value.field == "key_points"
    assert "long2rag.construction.llm" in str(e.value)


def test_a_failed_stage_leaves_readable_outputs(
    haystack: dict[str, Any], write_haystack: Callable[..., Path], tmp_path: Path
) -> None:
    """The mini haystack's documents have no sentence a baseline can use: every generation is
    an error, the stage fails (exit 3) after writing its outputs, which keep the mode a plain
    write gives (not mkstemp's 0600), so a team sharing the workspace can read them."""
    path = write_haystack(haystack, HAY)
    bench = registry.get("summhay")
    params = summhay_params({"lead": {"provider": "baseline", "kind": "lead"}})
    ds = tmp_path / "out" / "ds.jsonl"
    construct(bench, params, path.parent, ds, ROOT)
    out = tmp_path / "out" / "lead.jsonl"
    with pytest.raises(StageFailed, match="2 item"):
        generate(bench, params, "lead", ds, path.parent, out, ROOT)
    umask = os.umask(0)
    os.umask(umask)
    for f in (out, out.with_name("lead.usage.json"), ds):
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f
    assert all(json.loads(line)["status"] == "error" for line in out.read_text().splitlines())
