"""dvc.yaml as lfbench reads it (pipeline/core/dvcfile.py) is dvc.yaml as DVC reads it: every
stage of DVC's own index, matrix items and all, is lfbench's stage with the items put in."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from pipeline.core import dvcfile

ROOT = Path(__file__).resolve().parents[2]


def _value(params: dict[str, Any], ref: str) -> Any:
    """`${a.b}` of params.yaml."""
    value: Any = params
    for key in ref.strip("${}").split("."):
        value = value[key]
    return value


def _expanded(spec: dict[str, Any], params: dict[str, Any], name: str) -> dict[str, Any]:
    """A stage's matrix items, each as DVC names it, with `${item.<key>}` put in."""
    matrix = spec.get("matrix")
    if not matrix:
        return {name: spec}
    keys = list(matrix)
    lists = [_value(params, str(matrix[k])) for k in keys]
    out = {}
    for combo in itertools.product(*lists):
        items = {f"item.{k}": str(v) for k, v in zip(keys, combo, strict=True)}
        body = {k: v for k, v in spec.items() if k != "matrix"}
        out[f"{name}@{'-'.join(map(str, combo))}"] = dvcfile.fill(body, items)
    return out


def test_lfbench_reads_every_stage_as_dvc_does() -> None:
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    ours: dict[str, dict[str, Any]] = {}
    for name, spec in dvcfile.stages(ROOT / "dvc.yaml").items():
        ours |= _expanded(spec, params, name)
    stages = Repo(str(ROOT)).index.stages
    theirs = {s.addressing: s for s in stages if s.addressing != "data.dvc"}
    assert set(ours) == set(theirs)
    assert not [n for n in ours if n.startswith("shape-")]  # the shapes make no stage
    for name, stage in theirs.items():
        spec = ours[name]
        assert " ".join(str(spec["cmd"]).split()) == " ".join(str(stage.cmd).split()), name
        files = [d.def_path for d in stage.deps if not isinstance(d, ParamsDependency)]
        assert dvcfile.paths(spec.get("deps")) == files, name
        keys = [k for d in stage.deps if isinstance(d, ParamsDependency) for k in d.params]
        assert [str(p) for p in spec.get("params", [])] == keys, name
        outs = [p for kind in ("outs", "metrics", "plots") for p in dvcfile.paths(spec.get(kind))]
        assert sorted(outs) == sorted(o.def_path for o in stage.outs), name
        assert "vars" not in spec and "${bench}" not in str(spec), name


def test_a_stage_takes_its_shape_and_its_own_vars(tmp_path: Path) -> None:
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  shape-x:\n"
        "    foreach: []\n"
        "    do: &x\n"
        "      cmd: run ${bench} --in ${data} --model ${item.model}\n"
        "      deps: ['src/${bench}', '${bench}.json']\n"
        "      outs: [{'out/${bench}.json': {cache: false}}]\n"
        "  a-x:\n"
        "    <<: *x\n"
        "    vars: [{bench: a, data: d/a}]\n"
        "  b-x:\n"
        "    <<: *x\n"
        "    vars: [{bench: b, data: d/b}]\n"
        "    deps: [own]\n",
        encoding="utf-8",
    )
    got = dvcfile.stages(tmp_path / "dvc.yaml")
    assert list(got) == ["a-x", "b-x"]
    assert got["a-x"] == {
        "cmd": "run a --in d/a --model ${item.model}",
        "deps": ["src/a", "a.json"],
        "outs": [{"out/a.json": {"cache": False}}],
    }
    assert got["b-x"]["deps"] == ["own"]  # a key of its own replaces the shape's
    assert dvcfile.paths(got["b-x"]["outs"]) == ["out/b.json"]
