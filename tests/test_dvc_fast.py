"""A cluster worker's shortcuts through DVC's own steps (pipeline/dvc_internals.py): they must
not change what DVC computes, only how often it parses the same text or opens the same remote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import dvc_workspace, run


def counting_parser() -> tuple[Any, list[tuple[str, str]]]:
    """DVC's own parser (the original, under any memo installed), counting its calls."""
    from dvc.utils.serialize import _yaml

    real = getattr(_yaml.parse_yaml, "__wrapped__", _yaml.parse_yaml)
    calls: list[tuple[str, str]] = []

    def parse(text: str, path: str, typ: str = "safe") -> Any:
        calls.append((path, typ))
        return real(text, path, typ=typ)

    return parse, calls


def test_the_same_yaml_text_is_parsed_once_and_each_caller_gets_its_own_copy() -> None:
    from dvc.utils.serialize import YAMLFileCorruptedError

    from pipeline.dvc_internals import _memoized

    parse, calls = counting_parser()
    memo = _memoized(parse)
    text = "stages:\n  a:\n    cmd: echo 1\n    params: [x, 'on']\n    n: 010\n"
    first = memo(text, "dvc.yaml")
    first["stages"]["a"]["cmd"] = "changed by a caller"
    second = memo(text, "dvc.yaml")
    assert second == parse(text, "dvc.yaml")  # what DVC's parser gives: YAML 1.2 ('on', 10)
    assert second["stages"]["a"]["params"] == ["x", "on"] and second["stages"]["a"]["n"] == 10
    assert len(calls) == 2  # one by the memo, one just above
    memo(text.replace("echo 1", "echo 2"), "dvc.yaml")
    assert len(calls) == 3  # another text, parsed
    memo(text, "dvc.yaml", typ="rt")
    memo(text, "dvc.yaml", typ="rt")
    assert [t for _, t in calls].count("rt") == 2  # round-trip documents are not shared
    for _ in range(2):  # a broken text fails every time, nothing kept
        with pytest.raises(YAMLFileCorruptedError):
            memo("a: [1,\n", "broken.yaml")
    assert calls[-2:] == [("broken.yaml", "safe"), ("broken.yaml", "safe")]


def test_dvc_with_the_memo_sees_the_pipeline_as_dvc_alone_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A toy pipeline reproduced by `dvc` (no memo): in this process, with the memo installed,
    DVC finds every stage up to date and makes the same lock entries, parsing params.yaml once
    (not once per stage that depends on it)."""
    from dvc.repo import Repo, lock_repo
    from dvc.stage.serialize import to_single_stage_lockfile
    from dvc.utils import strictyaml
    from dvc.utils.serialize import _yaml

    from pipeline import dvc_internals

    proj = dvc_workspace(tmp_path / "p")
    stages = {
        f"s{i}": {
            "cmd": f"python -c \"open('o{i}.txt', 'w').write('{i}')\"",
            "params": ["model.name", "model.flag", f"k{i}"],
            "outs": [f"o{i}.txt"],
        }
        for i in range(4)
    }
    (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (proj / "params.yaml").write_text(
        "model:\n  name: m\n  flag: off\n" + "".join(f"k{i}: {i}\n" for i in range(4))
    )
    run(["dvc", "repro", "-q"], proj)
    parse, calls = counting_parser()
    lock = parse((proj / "dvc.lock").read_text(), "dvc.lock")["stages"]
    assert lock["s0"]["params"]["params.yaml"]["model.flag"] == "off"  # YAML 1.2: a string
    calls.clear()
    monkeypatch.setattr(_yaml, "parse_yaml", parse)
    monkeypatch.setattr(strictyaml, "parse_yaml", parse)
    monkeypatch.chdir(proj)

    def params_parses() -> int:
        calls.clear()
        with Repo(str(proj)) as repo, lock_repo(repo):
            for stage in repo.index.stages:
                assert not stage.changed(), stage
                entry = to_single_stage_lockfile(stage)
                assert json.loads(json.dumps(entry)) == lock[stage.name]
        return [Path(p).name for p, _ in calls].count("params.yaml")

    assert params_parses() >= 4  # DVC alone: at least once per stage
    monkeypatch.setattr(dvc_internals, "_installed", False)
    dvc_internals._parsed.clear()
    dvc_internals.memo_yaml()
    assert _yaml.parse_yaml is strictyaml.parse_yaml is not parse  # both of DVC's lookups
    assert params_parses() == 1


def test_a_repository_opens_each_remote_once(tmp_path: Path) -> None:
    from dvc.repo import Repo

    from pipeline.dvc_internals import one_remote_session

    proj = dvc_workspace(tmp_path / "p", tmp_path / "remote")
    with Repo(str(proj)) as repo, Repo(str(proj)) as other:
        one_remote_session(repo)
        one_remote_session(other)
        first = repo.cloud.get_remote()
        assert repo.cloud.get_remote() is first
        assert repo.cloud.get_remote(name="team") is first  # the default, by its name
        assert repo.cloud.get_remote_odb().fs is first.fs  # DVC's own lookups get it too
        assert other.cloud.get_remote() is not first  # another repository: its own
