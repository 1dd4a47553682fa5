"""`lfbench new-benchmark` against this project's own dvc.yaml and params.yaml (fast: no repro;
tests/e2e/test_new_benchmark.py runs the result)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.authoring.scaffold import TEMPLATE, create
from pipeline.core.errors import ConfigError

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
    kinds = ("construct", "retrieve", "generate", "judge", "results", "aggregate")
    assert added == {f"toy-{s}" for s in kinds}
    assert after["plots"][:-1] == before["plots"]  # the others' plots are untouched
    # the folders its stages read: its raw data, its retrievers' outputs
    assert (root / "inputs" / "toy" / "README.md").is_file()
    assert (root / "retrievals" / "toy").is_dir() and (root / "retrievals/lineage/toy").is_dir()
    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    assert params["toy"]["judges"] == ["toy-match"]
    assert params["judges"]["toy-match"] == {"provider": "toy-match"}
    package = root / "pipeline" / "benchmarks" / "toy"
    assert (package / "__init__.py").is_file()
    # a README stub of its own (the template's manual stays with the template), a test file
    readme = (package / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# toy\n") and "The contract in one screen" not in readme
    assert not [p.name for p in package.iterdir() if "snippet" in p.name or "stub" in p.name]
    test = root / "tests" / "benchmarks" / "toy" / "test_toy.py"
    assert "from pipeline.benchmarks.toy.benchmark import Toy" in test.read_text("utf-8")
    # no dependency on the local judge's model: the benchmark does not use it
    judge = after["stages"]["toy-judge"]
    assert "models/local-judge/model.json" not in judge["deps"]
    assert all("local-judge" not in str(d) for s in added for d in after["stages"][s]["deps"])


def test_a_new_benchmark_adds_at_most_30_lines_to_dvc_yaml(tmp_path: Path) -> None:
    """Issue 43: its stages are dvc.yaml's shapes with its name (they were 118 lines)."""
    root = _project(tmp_path)
    before = (root / "dvc.yaml").read_text(encoding="utf-8").splitlines()
    create("toy", root, root / "params.yaml", root / "dvc.yaml")
    after = (root / "dvc.yaml").read_text(encoding="utf-8").splitlines()
    assert len(after) - len(before) <= 30
    assert [line for line in before if line not in after] == []  # only lines added


def test_the_scaffold_wires_the_main_metric_as_a_plot(tmp_path: Path) -> None:
    """Issue 43: the template wired no plot points. The scaffolded aggregate stage writes
    reports/<name>.points.json (an output of its stage) and dvc.yaml plots its main metric."""
    from pipeline.benchmarks._template.benchmark import Template

    root = _project(tmp_path)
    create("toy", root, root / "params.yaml", root / "dvc.yaml")
    plots = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["plots"]
    (plot,) = [p for p in plots if isinstance(p, dict) and "toy recall" in p]
    main = Template.metrics[0].name
    assert plot["toy recall"]["x"] == {"reports/toy.points.json": main}
    assert plot["toy recall"]["y"] == {"reports/toy.points.json": "run"}
    from pipeline.core import dvcfile

    aggregate = dvcfile.stages(root / "dvc.yaml")["toy-aggregate"]
    assert "reports/toy.points.json" in dvcfile.paths(aggregate["outs"])
    assert Template.results.plotted in (None, ())  # so the aggregate plots the main metric


def test_the_new_package_describes_itself_not_the_template(tmp_path: Path) -> None:
    """Issue 43: its `__init__.py` said it was "a small working benchmark to start a new one
    from (`lfbench new-benchmark NAME` copies this folder, renaming `toy`)"."""
    import ast

    root = _project(tmp_path)
    create("toy", root, root / "params.yaml", root / "dvc.yaml")
    init = (root / "pipeline" / "benchmarks" / "toy" / "__init__.py").read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(init)) or ""
    assert doc.startswith("toy: ") and "README.md in this folder" in doc
    assert "renaming" not in doc and "start a new one" not in doc and "_template" not in init
    assert "register(Toy())" in init


def test_with_the_local_judge_its_judge_stages_depend_on_its_model(tmp_path: Path) -> None:
    root = _project(tmp_path)
    create("toy", root, root / "params.yaml", root / "dvc.yaml", local_judge=True)
    after = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    assert "models/local-judge/model.json" in after["stages"]["toy-judge"]["deps"]
    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    assert params["toy"]["judges"] == ["toy-match", "local"]


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


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("class", "is a Python keyword"),
        ("lambda", "is a Python keyword"),
        ("b" * 65, "is 65 characters long; at most 64"),
        ("b" * 300, "is 300 characters long"),
        ("my-bench", "must match"),
        ("Toy", "must match"),
        ("9lives", "must match"),
        ("benchmark", "would name a class Benchmark"),
        ("match", "would name a class Match"),
        ("fact", "would name a class Fact"),
        ("item", "would name a class Item"),
    ],
)
def test_a_name_python_or_the_file_system_cannot_hold_is_refused_before_writing(
    tmp_path: Path, name: str, reason: str
) -> None:
    """Issue 26, point 9: `new-benchmark class` wrote a package that was a SyntaxError, a
    300-character name an OSError half way."""
    root = _project(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=reason):
        create(name, root, root / "params.yaml", root / "dvc.yaml")
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_broken_benchmark_package_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lfbench check` imports every package: a package that cannot be imported is a clear
    error naming it (and where), never a traceback."""
    from pipeline.core import registry

    pkg = tmp_path / "lfb_broken_benchmarks"
    for sub, code, _ in BROKEN:
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text(code, encoding="utf-8")
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    from pipeline.core import packages

    monkeypatch.setattr(registry, "PACKAGE", "lfb_broken_benchmarks")
    monkeypatch.setattr(packages, "PACKAGE", "lfb_broken_benchmarks")
    registry.names.cache_clear()
    try:
        assert registry.names() == tuple(sorted(sub for sub, _, _ in BROKEN))
        for sub, _, reason in BROKEN:
            with pytest.raises(ConfigError) as e:
                registry.get(sub)
            assert f"benchmark package lfb_broken_benchmarks.{sub} cannot be imported" in str(
                e.value
            )
            assert reason in str(e.value) and "line 2" in str(e.value)
    finally:
        registry.names.cache_clear()


BROKEN = [
    ("syntax", "x = 1\nfrom pipeline.benchmarks.class.benchmark import Class\n", "syntax error"),
    ("imports", "x = 1\nfrom pipeline.core.benchmark import Nothing\n", "ImportError"),
    ("raises", "x = 1\nraise RuntimeError('half written')\n", "RuntimeError: half written"),
]


def test_check_refuses_a_local_judge_its_judge_stage_does_not_depend_on(tmp_path: Path) -> None:
    """A benchmark scaffolded without --local-judge whose section later lists `local`: its judge
    stage must then depend on the local judge's model (else DVC does not train it first)."""
    from pipeline.core.params import load_params
    from pipeline.env.deps import missing_models

    params = load_params(ROOT / "params.yaml")
    assert missing_models(ROOT, params) == []
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    judge = doc["stages"]["summhay-judge"]
    judge["deps"] = [d for d in judge["deps"] if d != "models/local-judge/model.json"]
    dvc = tmp_path / "dvc.yaml"
    dvc.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    assert missing_models(ROOT, params, dvc) == [
        "summhay-judge: models/local-judge/model.json (judges.local)"
    ]
