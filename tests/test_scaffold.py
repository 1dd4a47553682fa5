"""`lfbench new-benchmark` against this project's own dvc.yaml and params.yaml (fast: no repro;
tests/e2e/test_new_benchmark.py runs the result)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import ConfigError
from pipeline.tools.scaffold import TEMPLATE, create

ROOT = Path(__file__).resolve().parents[1]


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    shutil.copytree(
        ROOT / "pipeline" / "benchmarks" / TEMPLATE,
        root / "pipeline" / "benchmarks" / TEMPLATE,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, root / name)
    return root


def test_the_stages_and_section_land_in_this_projects_files(tmp_path: Path) -> None:
    root = _project(tmp_path)
    before = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    create("toy", root, root / "params.yaml", root / "dvc.yaml")
    after = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    added = set(after["stages"]) - set(before["stages"])
    assert added == {f"toy-{s}" for s in ("construct", "generate", "judge", "aggregate")}
    assert after["plots"] == before["plots"]  # the other top-level keys are untouched
    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    assert "toy" in params
    assert (root / "pipeline" / "benchmarks" / "toy" / "__init__.py").is_file()


def test_a_dvc_yaml_whose_last_key_is_not_stages_is_refused_untouched(tmp_path: Path) -> None:
    root = _project(tmp_path)
    dvc = root / "dvc.yaml"
    doc = yaml.safe_load(dvc.read_text(encoding="utf-8"))
    dvc.write_text(
        yaml.safe_dump({"stages": doc["stages"], "plots": doc["plots"]}, sort_keys=False),
        encoding="utf-8",
    )
    files = {p: p.read_bytes() for p in (dvc, root / "params.yaml")}
    with pytest.raises(ConfigError, match=r"dvc\.yaml.*`stages:` the last key"):
        create("toy", root, root / "params.yaml", dvc)
    assert {p: p.read_bytes() for p in files} == files
    assert not (root / "pipeline" / "benchmarks" / "toy").exists()
