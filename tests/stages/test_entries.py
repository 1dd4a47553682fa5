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


def test_check_fix_writes_the_entries_read_and_nothing_else(tmp_path: Path) -> None:
    """`lfbench check --fix` (entries.relist): the agreement stage lists the judges its section
    now scores, a construct stage its construction LLM; every other line stays."""
    from pipeline.stages.entries import relist

    def edit(p: dict[str, Any]) -> None:
        p["judges"]["mine"] = copy.deepcopy(LLM)
        p["summhay"]["judges"] = ["local", "mine"]
        p["crud_rag"]["quest_eval"].update(llm="mine")

    params = load_params(_params(tmp_path, edit))
    dvc = tmp_path / "dvc.yaml"
    before = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    dvc.write_text(before, encoding="utf-8")
    assert unlisted(params, dvc) != []
    assert sorted(relist(params, dvc)) == [
        "crud_rag-construct: +judges.mine",
        "summhay-agreement: +judges.mine",
        "summhay-agreement: -judges.published-gpt-4o",
    ]
    after = dvc.read_text(encoding="utf-8")
    assert unlisted(params, dvc) == []
    assert relist(params, dvc) == []  # idempotent
    gone = set(before.splitlines()) - set(after.splitlines())
    assert gone == {"      - judges.published-gpt-4o"}
    assert set(after.splitlines()) - set(before.splitlines()) == {"      - judges.mine"}
    stages = yaml.safe_load(after)["stages"]
    assert "judges.mine" in stages["crud_rag-construct"]["params"]
    assert "judges.local" in stages["summhay-agreement"]["params"]


def test_the_agreement_stage_refuses_a_judge_dvc_yaml_does_not_list(tmp_path: Path) -> None:
    """Run by `dvc repro` without `lfbench check`, the stage itself refuses to score a judge it
    does not depend on (it would be a silent stale result after that judge's next change)."""
    from pipeline.core import registry
    from pipeline.core.errors import ConfigError
    from pipeline.stages.agreement import refuse_unlisted

    def edit(p: dict[str, Any]) -> None:
        p["judges"]["mine"] = copy.deepcopy(LLM)
        p["summhay"]["judges"].append("mine")

    params = load_params(_params(tmp_path, edit), ["summhay"])  # what the stage loads
    (tmp_path / "dvc.yaml").write_text(
        (ROOT / "dvc.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"summhay-agreement: judges\.mine.*check --fix"):
        refuse_unlisted(registry.get("summhay"), params, tmp_path)
    from pipeline.stages.entries import relist

    relist(load_params(tmp_path / "params.yaml"), tmp_path / "dvc.yaml")
    refuse_unlisted(registry.get("summhay"), params, tmp_path)  # listed: runs
