"""Each stage depends on the params.yaml entries it reads, not on all of `judges` (issue 43): a
judge entry another benchmark adds marks none of its stages changed, and `lfbench check` names
an entry a stage reads that dvc.yaml does not list (pipeline/stages/entries.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.params import load_params
from pipeline.stages.entries import unlisted

ROOT = Path(__file__).resolve().parents[2]
LLM = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


def _params(tmp_path: Path, edit: Any) -> Path:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    edit(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def test_no_stage_depends_on_a_whole_list_of_entries() -> None:
    """DVC's own reading of dvc.yaml: no stage lists `judges`, `models` or `retrievers` whole
    (before: the four construct stages and summhay-agreement listed `judges`)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    whole = {
        s.addressing: k
        for s in Repo(str(ROOT)).index.stages
        for d in s.deps
        if isinstance(d, ParamsDependency)
        for k in d.params
        if k in ("judges", "models", "retrievers")
    }
    assert whole == {}


def test_the_shipped_files_list_every_entry_read() -> None:
    assert unlisted(load_params(ROOT / "params.yaml"), ROOT / "dvc.yaml") == []


def test_a_judge_the_agreement_stage_scores_must_be_listed(tmp_path: Path) -> None:
    def edit(p: dict[str, Any]) -> None:
        p["judges"]["mine"] = copy.deepcopy(LLM)
        p["summhay"]["judges"].append("mine")

    got = unlisted(load_params(_params(tmp_path, edit)), ROOT / "dvc.yaml")
    assert got == ["summhay-agreement: judges.mine (summhay.judges)"]


@pytest.mark.parametrize(
    ("section", "edit"),
    [
        ("crud_rag", lambda s: s["quest_eval"].update(llm="mine")),
        (
            "long2rag",
            lambda s: (
                s.update(source="inputs/long2rag/q.jsonl"),
                s["construction"].update(llm="mine"),
            ),
        ),
    ],
)
def test_a_construction_llm_must_be_listed(tmp_path: Path, section: str, edit: Any) -> None:
    def change(p: dict[str, Any]) -> None:
        p["judges"]["mine"] = copy.deepcopy(LLM)
        edit(p[section])

    got = unlisted(load_params(_params(tmp_path, change)), ROOT / "dvc.yaml")
    assert got == [f"{section}-construct: judges.mine ({section}'s construction LLM)"]
    # listed, it passes
    dvc = tmp_path / "dvc.yaml"
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    doc["stages"][f"{section}-construct"]["params"].append("judges.mine")
    dvc.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    assert unlisted(load_params(_params(tmp_path, change)), dvc) == []
