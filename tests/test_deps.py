"""Code dependencies that cannot go stale: for every stage of dvc.yaml, the import closure of the
code it runs must lie under the stage's deps (pipeline/env/deps.py, also run by
`lfbench check`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import ConfigError
from pipeline.env import deps

ROOT = Path(__file__).resolve().parents[1]


def rel(files: set[Path]) -> set[str]:
    return {str(f.relative_to(ROOT)) for f in files}


def test_every_stage_of_dvc_yaml_depends_on_the_code_it_runs() -> None:
    checked = deps.check(ROOT)
    stages = {c.stage for c in checked}
    assert {
        "summhay-construct",
        "summhay-judge",
        "local-judge-train",
        "long2rag-aggregate",
    } <= stages
    assert {c.stage: c.uncovered for c in checked if c.uncovered} == {}


def test_the_image_recipe_stage_depends_on_every_file_the_recipe_hashes(tmp_path: Path) -> None:
    """A lock the recipe hashes but the stage does not depend on: changing it left
    build/image.json (and every stage's record of it) stale."""
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    doc["stages"]["image"]["deps"].remove("requirements-image.lock")
    broken = tmp_path / "dvc.yaml"
    broken.write_text(yaml.safe_dump(doc), encoding="utf-8")
    found = {c.stage: c.uncovered for c in deps.check(ROOT, broken) if c.uncovered}
    assert found == {"image": ["requirements-image.lock"]}


def test_a_missing_folder_is_found(tmp_path: Path) -> None:
    """Remove the stage layer from one stage's deps: the check names that stage and the files."""
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    judge = doc["stages"]["summhay-judge"]  # its deps are its shape's (shared with the others)
    judge["deps"] = [d for d in judge["deps"] if d != "pipeline/stages"]
    broken = tmp_path / "dvc.yaml"
    broken.write_text(yaml.safe_dump(doc), encoding="utf-8")
    bad = {c.stage: c.uncovered for c in deps.check(ROOT, broken) if c.uncovered}
    assert list(bad) == ["summhay-judge"]
    assert "pipeline/stages/judge.py" in bad["summhay-judge"]
    assert all(f.startswith("pipeline/stages/") for f in bad["summhay-judge"])


def test_the_closure_follows_function_level_imports_and_stays_in_its_benchmark() -> None:
    (judge,) = [c for c in deps.check(ROOT) if c.stage == "summhay-judge"]
    files = rel(judge.files)
    # imported inside functions: the local judge (stages/judge.py) and the dense retriever
    assert {"pipeline/local_judge/model.py", "pipeline/retrieval/dense.py"} <= files
    # the stage loads one benchmark: no other package is in its code, nor in its deps
    assert not any(f.startswith("pipeline/benchmarks/long2rag") for f in files)
    assert "pipeline/benchmarks/long2rag" not in judge.deps
    # cli.py's function-level imports serve other commands (report, compare, ui)
    assert "pipeline/results/report.py" not in files and "pipeline/results/compare.py" not in files
    # the generate stage does not run the judges
    (gen,) = [c for c in deps.check(ROOT) if c.stage == "summhay-generate"]
    assert not any(f.startswith("pipeline/judging/") for f in rel(gen.files))


def test_suggest_gives_folder_level_deps() -> None:
    (judge,) = [c for c in deps.check(ROOT) if c.stage == "long2rag-judge"]
    suggested = deps.suggest(ROOT, judge.files)
    assert "pipeline/benchmarks/long2rag" in suggested and "pipeline/stages" in suggested
    assert all(s in judge.deps for s in suggested)


def test_a_module_that_does_not_parse_is_an_error_naming_it(tmp_path: Path) -> None:
    """`lfbench check` follows imports through the code: a file with a syntax error is named
    with its line (issue 26, point 9), not an ast traceback."""
    pkg = tmp_path / "pipeline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pipeline import broken\n", encoding="utf-8")
    (pkg / "broken.py").write_text("x = 1\ndef oops(:\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.py, line 2: a syntax error"):
        deps.closure(tmp_path, ["pipeline"])


def test_the_committed_dvc_lock_matches_the_committed_code() -> None:
    """`dvc status` finds no code or params change against dvc.lock: a change to a stage's code
    (or to params.yaml) is committed with the dvc.lock of a `dvc repro` (else the fresh-clone
    test, minutes later, finds every changed stage re-running). Only checked when the working
    tree is clean: an edit in progress is not a stale lock yet."""
    import json

    from tests.conftest import run

    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], ROOT).stdout
    if dirty.strip():
        pytest.skip(f"uncommitted changes in the checkout:\n{dirty}")
    status = json.loads(run(["dvc", "status", "--json"], ROOT).stdout or "{}")
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    produced = [out["path"].rstrip("/") for st in lock.values() for out in st.get("outs", [])]

    def is_output(path: str) -> bool:  # an output, or a folder that holds outputs
        return any(
            p == path or p.startswith(path + "/") or path.startswith(p + "/") for p in produced
        )

    stale = []
    for stage, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):
                continue
            for path, state in change.get("changed deps", {}).items():
                # params.yaml's changes are {key: modified|new|deleted}
                params = isinstance(state, dict)
                if params or (state == "modified" and not is_output(path.rstrip("/"))):
                    stale.append(f"{stage}: {path} {state}")
    assert not stale, "dvc.lock is stale (run `make repro` and commit it):\n" + "\n".join(stale)
