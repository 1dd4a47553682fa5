"""The one door to DVC's internals (pipeline/dvc_internals.py): nothing else in pipeline/ calls
into DVC beyond its public `Repo`; another DVC version stops a command at once, naming both
versions; and each internal the door uses has a test here, on real DVC projects, that fails
when that internal changes shape. Nothing the door does is seen by DVC outside the objects it
makes (no module of DVC patched, no working directory changed)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline import dvc_internals as dvc
from tests.conftest import ROOT, dvc_workspace, run, run_env
from tests.test_parallel import diamond, times, toy

DVC_PACKAGES = ("dvc", "dvc_data", "dvc_objects", "scmrepo")
# the private or moving names of DVC the acceptance looks for outside the door
PRIVATE_NAMES = (
    "_reset",
    "_can_hash",
    "_get_stage_hash",
    "_get_cache_dir",
    "plan_repro",
    "strictyaml",
    "get_remote",
)


def _commit(path: Path, msg: str) -> None:
    run(["git", "add", "-A"], path)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg], path)


def _stages(repo: Any) -> dict[str, Any]:
    return {s.addressing: s for s in dvc.stages(repo)}


# ---------------------------------------------------------------- one door, one version


def test_no_module_but_the_door_calls_into_dvc() -> None:
    """Outside the door, pipeline/ imports nothing of DVC (data/fetch.py aside: `dvc status` and
    `dvc commit` of data.dvc through the public `Repo`) and names none of its private or
    moving names."""
    bad = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "pipeline/dvc_internals.py":
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                mods = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [(node.module, a.name) for a in node.names]
            else:
                continue
            for mod, name in mods:
                if mod.split(".")[0] not in DVC_PACKAGES:
                    continue
                if (rel, mod, name) == ("pipeline/data/fetch.py", "dvc.repo", "Repo"):
                    continue
                bad.append(f"{rel}:{node.lineno}: imports {mod}" + (f".{name}" if name else ""))
        bad += [f"{rel}: names {n}" for n in PRIVATE_NAMES if n in text]
    assert not bad, "\n".join(bad)


def test_the_door_names_both_versions_when_another_dvc_is_installed() -> None:
    """With another DVC, the door's import is one error naming the installed version and the
    one it was written for; with the written-for versions, none."""
    dvc.check_versions()
    code = textwrap.dedent(
        """
        import importlib.metadata as md
        real = md.version
        md.version = lambda name: "3.66.0" if name == "dvc" else real(name)
        try:
            import pipeline.dvc_internals
        except Exception as e:
            print(type(e).__name__, e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=run_env(), capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("UnsupportedDvc dvc 3.66.0 is installed"), out
    assert "written for dvc 3.67.1" in out and "pipeline/dvc_internals.py" in out
    assert dvc.WRITTEN_FOR["dvc"] == ("3.67.1",)


def test_lfbench_repro_stops_at_once_under_another_dvc_version(tmp_path: Path) -> None:
    """`lfbench repro` with another DVC installed (its version as the package metadata says it):
    one line naming both versions, exit status 2, nothing run."""
    proj = toy(tmp_path / "p", diamond())
    code = textwrap.dedent(
        """
        import importlib.metadata as md, sys
        real = md.version
        md.version = lambda name: "3.66.0" if name == "dvc" else real(name)
        sys.argv = ["lfbench", "repro", "--jobs", "2"]
        from pipeline.cli import main
        main()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=proj, env=run_env(), capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "dvc 3.66.0 is installed" in proc.stderr and "dvc 3.67.1" in proc.stderr
    assert not (proj / "times.log").exists() and not (proj / "dvc.lock").exists()


# ---------------------------------------------------------------- the repository


def _params_project(path: Path) -> Path:
    proj = dvc_workspace(path)
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
    return proj


def test_a_repository_reads_each_params_text_once_and_dvc_alone_is_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Repository`: its stages see the pipeline as `dvc` alone does (every stage unchanged, the
    same lock entries) while params.yaml is parsed once per stage's keys, however often DVC
    asks; a changed params.yaml is read again. DVC's parser, `ParamsDependency.read_params`
    and a plain `Repo` are as DVC made them (ParamsDependency.read_params is the internal)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo
    from dvc.utils.serialize import _yaml

    proj = _params_project(tmp_path / "p")
    monkeypatch.chdir(proj)  # DVC names stages relative to the working directory
    lock = json.loads(json.dumps(dvc.read_lock_doc(proj / "dvc.lock")["stages"]))
    assert lock["s0"]["params"]["params.yaml"]["model.flag"] == "off"  # YAML 1.2: a string
    real_parse, real_read = _yaml.parse_yaml, ParamsDependency.__dict__["read_params"]
    calls: list[str] = []

    def parse(text: str, path: str, typ: str = "safe") -> Any:
        calls.append(Path(path).name)
        return real_parse(text, path, typ=typ)

    monkeypatch.setattr(_yaml, "parse_yaml", parse)  # this test counts DVC's parses

    def params_parses(repo: Any, rounds: int = 3) -> int:
        calls.clear()
        with dvc.locked(repo):
            for _ in range(rounds):
                for stage in dvc.stages(repo):
                    assert not dvc.changed(stage), stage
                    assert dvc.lock_entry(stage) == lock[stage.name]
        return calls.count("params.yaml")

    with Repo(str(proj)) as plain:
        assert params_parses(plain) >= 12  # DVC alone: each time it asks, for every stage
    with dvc.open_repo(proj) as repo:
        assert params_parses(repo) == 1 + 4  # the index's, then once for each stage's keys
        (proj / "params.yaml").write_text((proj / "params.yaml").read_text() + "k9: 9\n")
        calls.clear()
        with dvc.locked(repo):
            s0 = _stages(repo)["s0"]
            assert not dvc.changed(s0) and not dvc.changed(s0)
        assert calls.count("params.yaml") == 1 + 1  # the index's, then s0's keys again
    assert _yaml.parse_yaml is parse and ParamsDependency.__dict__["read_params"] is real_read
    with Repo(str(proj)) as plain:
        stage = next(iter(plain.index.stages))
        assert all("read_params" not in d.__dict__ for d in stage.deps)


def _folder_project(proj: Path) -> Path:
    """A stage of a folder dependency (two files, one in a sub-folder) and a file one."""
    dvc_workspace(proj)
    (proj / "src" / "sub").mkdir(parents=True)
    (proj / "src" / "a.txt").write_text("alpha\n")
    (proj / "src" / "sub" / "b.txt").write_text("beta\n")
    (proj / "one.txt").write_text("one\n")
    doc = {
        "stages": {
            "s": {
                "cmd": "cat src/a.txt one.txt > out.txt",
                "deps": ["src", "one.txt"],
                "outs": ["out.txt"],
            }
        }
    }
    (proj / "dvc.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    run(["dvc", "repro", "-q"], proj)
    _commit(proj, "s")
    return proj


def test_a_repository_hashes_each_dependency_once_per_state_of_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Repository`: a file or folder dependency is hashed (`Output._build`, the internal) once
    while no file under it changes, however often DVC asks; an edit of the same size, a new
    file, a removed one or a changed .dvcignore is hashed again, to what a plain `Repo` finds.
    A path holding a symbolic link is hashed every time; a plain `Repo` is as DVC made it."""
    from dvc import output as dvc_output
    from dvc.output import Output
    from dvc.repo import Repo

    proj = _folder_project(tmp_path / "p")
    monkeypatch.chdir(proj)
    real_build = dvc_output.build
    built: list[str] = []

    def counting(odb: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name != "out.txt":  # the dependencies (the output is DVC's each time)
            built.append(Path(path).name)
        return real_build(odb, path, *args, **kwargs)

    monkeypatch.setattr(dvc_output, "build", counting)  # this test counts DVC's hashing

    def hashes(repo: Any) -> dict[str, str]:
        (stage,) = dvc.stages(repo)
        return {Path(d.fs_path).name: d.get_hash().value for d in stage.deps}

    def asked(repo: Any, rounds: int = 3) -> int:
        built.clear()
        with dvc.locked(repo):
            for _ in range(rounds):
                (stage,) = dvc.stages(repo)
                dvc.changed(stage)
                hashes(repo)
        return len(built)

    with Repo(str(proj)) as plain:
        assert asked(plain) >= 2 * 2 * 3  # DVC alone: both dependencies, every time
    edits = (
        lambda: (proj / "src" / "a.txt").write_text("ALPHA\n"),  # same size
        lambda: (proj / "src" / "sub" / "c.txt").write_text("new\n"),
        lambda: (proj / "src" / "sub" / "c.txt").unlink(),
        lambda: (proj / "one.txt").write_text("two\n"),
        lambda: (proj / ".dvcignore").write_text("sub/\n"),  # the last
    )
    with dvc.open_repo(proj) as repo:
        assert asked(repo) == 2  # each dependency once
        for edit in edits:
            before = hashes(repo)
            edit()
            if edits.index(edit) == len(edits) - 1:
                dvc.reload(repo)  # DVC keeps the ignore rules it read until then
            with Repo(str(proj)) as plain:
                expected = hashes(plain)
            assert hashes(repo) == expected != before, edits.index(edit)
            assert asked(repo) == 0  # hashed once more above, kept since
        with dvc.locked(repo):
            assert dvc.changed(dvc.stages(repo)[0])  # its lock entry is the first state's
        (proj / "src" / "link.txt").symlink_to(proj / "one.txt")
        assert asked(repo, rounds=2) >= 2 * 2  # src: built each time
    assert dvc_output.build is counting and "_build" in Output.__dict__
    with Repo(str(proj)) as plain:
        (stage,) = plain.index.stages
        assert all("_build" not in d.__dict__ for d in stage.deps)


def test_a_repository_reads_git_s_index_once_per_state_of_the_file(tmp_path: Path) -> None:
    """`Repository.scm.is_tracked` answers as scmrepo's `Git.is_tracked` (the internal) for
    files, folders holding tracked files, and paths absolute or relative, from git's index as
    read once per state of its file: a file added after the first question is tracked."""
    proj = _folder_project(tmp_path / "p")
    with dvc.open_repo(proj) as repo:
        scm = repo.scm
        ask = type(scm).is_tracked
        names = [
            "src",
            "src/sub",
            "src/sub/b.txt",
            "src/su",
            "one.txt",
            "out.txt",
            "nope",
            "dvc.yaml",
            "src/",
        ]
        for name in names:
            for path in (name, str(proj / name)):
                assert scm.is_tracked(path) == ask(scm, path), path
        assert scm.is_tracked(str(proj / "src")) and not scm.is_tracked(str(proj / "src/su"))
        (proj / "late.txt").write_text("late\n")
        assert not scm.is_tracked(str(proj / "late.txt"))
        run(["git", "add", "late.txt"], proj)
        assert scm.is_tracked(str(proj / "late.txt")) and ask(scm, str(proj / "late.txt"))


def test_a_repository_opens_each_remote_once(tmp_path: Path) -> None:
    """`reuse_remotes`: DataCloud.get_remote (and get_remote_odb, which DVC's pulls, pushes and
    run cache go through) gives the same remote each time; another repository its own."""
    from dvc.repo import Repo

    proj = dvc_workspace(tmp_path / "p", tmp_path / "remote")
    with dvc.open_repo(proj, reuse_remotes=True) as repo, dvc.open_repo(proj) as other:
        first = repo.cloud.get_remote()
        assert repo.cloud.get_remote() is first
        assert repo.cloud.get_remote(name="team") is first  # the default, by its name
        assert repo.cloud.get_remote_odb().fs is first.fs  # DVC's own lookups get it too
        assert other.cloud.get_remote() is not other.cloud.get_remote()  # as DVC does
    with Repo(str(proj)) as plain:
        assert plain.cloud.get_remote() is not plain.cloud.get_remote()
    fs, folder = dvc.remote_folder(proj, None, "lfbench-images")
    assert folder == str(tmp_path / "remote" / "lfbench-images")
    assert not fs.exists(folder)


def test_reload_forgets_what_the_repository_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Repo._reset`: a stage added to dvc.yaml is seen after `reload`, not before."""
    proj = toy(tmp_path / "p", diamond())
    monkeypatch.chdir(proj)  # DVC names stages relative to the working directory
    with dvc.open_repo(proj) as repo:
        assert set(_stages(repo)) == set("abcde")
        doc = diamond()
        doc["stages"]["f"] = dict(doc["stages"]["e"], cmd="python step.py f out/f.json")
        doc["stages"]["f"]["outs"] = ["out/f.json"]
        (proj / "dvc.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        assert "f" not in _stages(repo)
        dvc.reload(repo)
        assert "f" in _stages(repo)
        assert dvc.pipeline_stage_names(repo) == list("abcdef")


def test_the_lock_is_dvc_s_and_a_second_holder_is_one_clear_error(tmp_path: Path) -> None:
    """`lock_repo`: held by one repository, another's `locked` is `ProjectLocked` (DVC's
    LockError), and free again afterwards."""
    proj = toy(tmp_path / "p", diamond())
    with dvc.open_repo(proj) as one, dvc.open_repo(proj) as two:
        with (
            dvc.locked(one),
            pytest.raises(dvc.ProjectLocked, match=r"\.dvc/tmp/lock"),
            dvc.locked(two),
        ):
            pass
        with dvc.locked(two):
            pass


def test_status_without_the_lock_answers_while_another_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42: `status(lock=False)` (a running `lfbench repro` holds the lock): DVC's
    `locked` skips taking it at `_lock_depth > 0`; the same answer as with the lock, no read
    lock left in the project's rwlock file (the holder's save of a stage's outputs would
    find it busy), the lock untouched (still the holder's), the repository as before."""
    proj = toy(tmp_path / "p", diamond())
    monkeypatch.chdir(proj)
    run(["dvc", "repro", "a", "e"], proj)
    with dvc.open_repo(proj) as holder, dvc.open_repo(proj) as reader:
        with dvc.locked(holder):
            with pytest.raises(dvc.ProjectLocked):
                dvc.status(reader)
            assert set(dvc.status(reader, lock=False)) == set("bcd")
            assert set(dvc.status(reader, ["c"], lock=False)) == {"c"}
            assert reader._lock_depth == 0 and reader.tmp_dir == str(proj / ".dvc" / "tmp")
            assert not dvc.rwlock_holders(reader)
            # the holder writes a stage's outputs meanwhile: not blocked
            for name in ("b", "c"):
                stage = _stages(holder)[name]
                (proj / "out").mkdir(exist_ok=True)
                (proj / "out" / f"{name}.json").write_text("{}")
                dvc.save(stage)  # its rwlock write: no reader's entry in the way
                assert set(dvc.status(reader, lock=False)) == set("bcd")
            with pytest.raises(dvc.ProjectLocked), dvc.locked(reader):
                pass  # still the holder's
        assert set(dvc.status(reader)) == set("bcd")


def test_rwlock_holders_reads_what_dvc_writes_for_a_running_command(tmp_path: Path) -> None:
    """.dvc/tmp/rwlock (DVC's own `rwlock`, as `dvc repro` takes it around a stage's command):
    the holder's pid and command line; none once it lets go."""
    from dvc.rwlock import rwlock

    proj = toy(tmp_path / "p", diamond())
    with dvc.open_repo(proj) as repo:
        assert dvc.rwlock_holders(repo) == []
        out = str(proj / "out" / "a.json")
        with rwlock(repo.tmp_dir, repo.fs, "dvc repro a", [], [out], False):
            assert dvc.rwlock_holders(repo) == [(os.getpid(), "dvc repro a")]
        assert dvc.rwlock_holders(repo) == []


# ---------------------------------------------------------------- the plan and one stage's steps


def test_plan_is_dvc_repro_s_and_says_each_stage_s_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`collect_stages`, `get_active_graph`, `plan_repro`: the stages `dvc repro TARGET` runs,
    upstream ones first, with the graph's edges among them."""
    proj = toy(tmp_path / "p", diamond())
    monkeypatch.chdir(proj)  # as `dvc repro d` in the project
    with dvc.open_repo(proj) as repo:
        steps, upstream = dvc.plan(repo, ["d"])
        names = [s.addressing for s in steps]
        assert sorted(names) == list("abcd") and names[0] == "a" and names[-1] == "d"
        assert sorted(upstream["d"]) == ["b", "c"] and upstream["a"] == []
        steps, _ = dvc.plan(repo, [])
        assert sorted(s.addressing for s in steps) == list("abcde")
        with pytest.raises(dvc.DvcError):
            dvc.plan(repo, ["nosuchstage"])


def test_a_stage_s_steps_make_what_dvc_repro_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """changed, remove_outs, save_deps, (the command), save and commit, the lock entry
    (to_single_stage_lockfile): stage by stage through the door, the same dvc.lock entries and
    outputs as `dvc repro`; then the run cache (StageCache.restore) gives a removed output
    back without running it, and `dvc status` is clean."""
    door = toy(tmp_path / "door", diamond())
    alone = tmp_path / "alone"
    shutil.copytree(door, alone)
    run(["dvc", "repro"], alone)
    monkeypatch.chdir(door)
    entries = {}
    with dvc.open_repo(door) as repo, dvc.locked(repo):
        steps, _ = dvc.plan(repo, [])
        for stage in steps:
            assert dvc.changed(stage)
            dvc.remove_outputs(stage)
            assert not dvc.restore(repo, stage)  # nothing in the run cache yet
            dvc.save_deps(stage)
            for cmd in stage.cmd.splitlines() if isinstance(stage.cmd, str) else stage.cmd:
                subprocess.run(cmd, shell=True, cwd=door, env=run_env(), check=True)
            dvc.save(stage)
            assert not dvc.changed(stage)
            path, key = dvc.lock_file(stage)
            assert path == door / "dvc.lock" and key == stage.addressing
            entries[key] = dvc.lock_entry(stage)
    want = yaml.safe_load((alone / "dvc.lock").read_text())["stages"]
    assert json.loads(json.dumps(entries)) == want
    dvc.write_lock_doc(door / "dvc.lock", {"schema": "2.0", "stages": entries})
    assert (door / "dvc.lock").read_text() == (alone / "dvc.lock").read_text()
    assert "up to date" in run(["dvc", "status"], door).stdout

    (door / "out" / "b.json").unlink()
    before = len(times(door))
    with dvc.open_repo(door) as repo, dvc.locked(repo):
        b = _stages(repo)["b"]
        assert dvc.changed(b) and dvc.outputs_differ(b)
        assert dvc.restore(repo, b)  # the lock entry's own outputs, from the cache
        assert not dvc.outputs_differ(b)
    assert (door / "out" / "b.json").exists() and len(times(door)) == before


def test_lock_docs_round_trip_with_dvc_s_bytes(tmp_path: Path) -> None:
    """parse_yaml_for_update / dumps_yaml: dvc.lock read and written again is the same bytes
    (the file replaced, not rewritten in place)."""
    proj = toy(tmp_path / "p", diamond())
    run(["dvc", "repro"], proj)
    path = proj / "dvc.lock"
    text, ino = path.read_text(), path.stat().st_ino
    doc = dvc.read_lock_doc(path)
    assert list(doc["stages"]) == list(yaml.safe_load(text)["stages"])
    dvc.write_lock_doc(path, doc)
    assert path.read_text() == text and path.stat().st_ino != ino
    assert dvc.read_lock_doc(tmp_path / "none.lock") == {}


def test_lock_text_is_dvc_s_dump_entry_by_entry() -> None:
    """`LockText` (an entry's YAML dumped once, then kept) gives the bytes of DVC's own dump of
    the whole file: on the committed dvc.lock (folded long commands, .dir hashes, params of every
    type), after entries are replaced by new objects, reordered, changed in place, removed and
    added, and with a comment (dumped whole)."""
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    committed = (ROOT / "dvc.lock").read_text(encoding="utf-8")
    doc = dvc.read_lock_doc(ROOT / "dvc.lock")
    memo = dvc.LockText()
    assert memo.dumps(doc) == dumps_yaml(doc) == committed

    stages = doc["stages"]
    keys = list(stages)
    assert len(keys) > 10
    # a finished stage's entry: a plain dict from DVC, not the parsed one
    stages[keys[3]] = json.loads(json.dumps(stages[keys[3]]))
    stages[keys[3]]["cmd"] = stages[keys[3]]["cmd"] + " --and a long option that folds the line"
    assert memo.dumps(doc) == dumps_yaml(doc) != committed
    # changed in place (the same object): dumped again, not the kept text
    stages[keys[5]]["outs"][0]["md5"] = "0" * 32
    stages[keys[3]]["deps"][0]["size"] = 1
    assert memo.dumps(doc) == dumps_yaml(doc)
    # reordered, one removed, one added
    stages[keys[0]] = stages.pop(keys[0])
    del stages[keys[7]]
    stages["new@x"] = {"cmd": "true", "params": {"params.yaml": {"a.b": 1.5e-05, "c": None}}}
    assert memo.dumps(doc) == dumps_yaml(doc)
    assert memo.dumps(doc) == dumps_yaml(doc)  # all kept now

    # a comment in the file: dumped whole, comment kept
    commented = committed.replace("stages:\n", "stages:\n  # by hand\n", 1)
    doc = parse_yaml_for_update(commented, "dvc.lock")
    assert dvc.LockText().dumps(doc) == dumps_yaml(doc) == commented
    assert dvc.LockText().dumps({"schema": "2.0", "stages": {}}) == dumps_yaml(
        {"schema": "2.0", "stages": {}}
    )


def test_gitignore_lines_once_and_git_s_rules_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output.ignore and scmrepo's cached ignore rules (Git._reset): lines written ahead for
    new outputs are seen by DVC's own save, which does not append them again; `unignore`
    takes a line out."""
    proj = toy(tmp_path / "p", diamond())
    monkeypatch.chdir(proj)
    with dvc.open_repo(proj) as repo, dvc.locked(repo):
        a = _stages(repo)["a"]
        dvc.ignore_outputs(repo, [a])
        assert (proj / "out" / ".gitignore").read_text() == "/a.json\n"
        dvc.remove_outputs(a)
        dvc.save_deps(a)
        subprocess.run(a.cmd, shell=True, cwd=proj, env=run_env(), check=True)
        dvc.save(a)
        assert (proj / "out" / ".gitignore").read_text() == "/a.json\n"
        dvc.unignore(repo, proj / "out" / "a.json")
        dvc.track_file(repo, "dvc.lock")
    assert not (proj / "out" / ".gitignore").exists()


def test_the_cache_holds_what_a_stage_made_not_an_edit(tmp_path: Path) -> None:
    """dvc_data's build, check and transfer: a stage's output is in the cache; edited by hand
    it is not, until saved there."""
    proj = toy(tmp_path / "p", diamond())
    run(["dvc", "repro", "a"], proj)
    out = proj / "out" / "a.json"
    with dvc.open_repo(proj) as repo:
        assert dvc.in_cache(repo, out) and dvc.in_cache(repo, proj / "out" / "none.json")
        out.write_text('{"edited": true}')
        assert not dvc.in_cache(repo, out)
        kept = dvc.save_in_cache(repo, out)
        assert kept.read_text() == '{"edited": true}' and dvc.in_cache(repo, out)


# ---------------------------------------------------------------- the remote


def test_outputs_and_one_stage_s_run_cache_entry_travel_by_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_used_objs + DataCloud.push/pull + checkout; _can_hash, _get_stage_hash,
    StageCache._get_cache_dir, get_remote_odb, dvc.fs.generic.copy: a clone pulls the outputs
    a stage reads and the run-cache entry of that one stage (DVC's `push/pull --run-cache`
    copy every entry of every stage, each time), then restores it without running it."""
    src = toy(tmp_path / "src", diamond())
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-d", "team", str(remote)], src)
    _commit(src, "remote")
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(src), str(clone)], tmp_path)
    run(["dvc", "repro"], src)
    monkeypatch.chdir(src)  # as a worker, in its clone
    with dvc.open_repo(src) as repo, dvc.locked(repo):
        s = _stages(repo)
        assert dvc.push_outputs(repo, s["a"]) == 0
        assert dvc.push_run_cache(repo, s["a"]) == 1
        assert dvc.push_run_cache(repo, s["a"]) == 0  # nothing sent twice
        assert dvc.push_run_cache(repo, s["b"]) == 1
        assert dvc.push_outputs(repo, s["b"]) == 0
    runs = remote / "runs"
    assert len([p for p in runs.rglob("*") if p.is_file()]) == 2  # a's and b's, not c, d, e

    lock = yaml.safe_load((src / "dvc.lock").read_text())
    del lock["stages"]["b"]  # b is the stage the clone must run (or restore)
    (clone / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    monkeypatch.chdir(clone)
    with dvc.open_repo(clone, reuse_remotes=True) as repo, dvc.locked(repo):
        s = _stages(repo)
        assert dvc.producers(repo, s["b"]) == ["a"]
        assert dvc.outputs_differ(s["a"])
        assert dvc.pull_outputs(repo, [s["a"]]) == []  # b's input
        assert not dvc.outputs_differ(s["a"])
        b = s["b"]
        assert not dvc.restore(repo, b, pull=True)  # the clone's run cache: nothing
        assert dvc.pull_run_cache(repo, b) == 1  # keyed by the deps DVC just saved
        assert dvc.pull_run_cache(repo, b) == 0
        local = Path(repo.stage_cache.cache_dir)
        assert len([p for p in local.rglob("*") if p.is_file()]) == 1  # b's only
        assert dvc.restore(repo, dvc.loaded_again(repo, b), pull=True)
        assert "out/a.json" in dvc.output_paths(repo)
    assert json.loads((clone / "out/b.json").read_text())["name"] == "b"
    assert not (clone / "times.log").exists()  # restored, not run

    pushed = tmp_path / "pushed"
    shutil.copytree(src, pushed)
    with dvc.open_repo(pushed) as repo:
        dvc.push_everything(repo)  # `dvc push` and every run-cache entry either side lacks
    assert len([p for p in runs.rglob("*") if p.is_file()]) == 5


def test_producers_of_a_folder_dependency_are_every_stage_writing_in_it() -> None:
    """Index.outs, Output.fs.isin: an aggregate's folder of generations is made by every
    generate stage writing in it (the bug: only a stage whose output held the folder was
    pulled, so an aggregate on a worker that had not run the judges found no judgements)."""
    with dvc.open_repo(ROOT) as repo:
        stages = _stages(repo)
        owners = set(dvc.producers(repo, stages["summhay-aggregate"]))
        params = yaml.safe_load((ROOT / "params.yaml").read_text())["summhay"]
        judges = {f"summhay-judge@{m}-{j}" for m in params["models"] for j in params["judges"]}
        assert judges | {"summhay-construct", "summhay-agreement"} <= owners
        assert {s for s in owners if s.startswith("summhay-generate@")} == {
            f"summhay-generate@{m}" for m in params["models"]
        }
        crux = set(dvc.producers(repo, stages["crux-aggregate"]))
        assert "summhay-aggregate" in crux  # metrics/summhay.released.json
        assert not any(s.startswith("summhay-judge@lead") for s in crux)


def test_the_stage_fields_lfbench_reads_are_dvc_yaml_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the door the runner reads a stage's fields (addressing, name, cmd, frozen, meta,
    its dependencies' and outputs' paths, an output's cache and metric flags, its dvc.yaml)."""
    doc = diamond({"a": {"lfbench": {"cores": "all"}}})
    proj = toy(tmp_path / "p", doc)
    monkeypatch.chdir(proj)
    with dvc.open_repo(proj) as repo:
        s = _stages(repo)
        a, d = s["a"], s["d"]
        assert (a.addressing, a.name, a.frozen) == ("a", "a", False)
        assert a.cmd == doc["stages"]["a"]["cmd"] and a.meta == {"lfbench": {"cores": "all"}}
        assert [Path(x.fs_path) for x in d.deps] == [
            proj / "step.py",
            proj / "out/b.json",
            proj / "out/c.json",
        ]
        (out,) = d.outs
        assert (Path(out.fs_path), out.use_cache, out.is_metric, out.is_plot) == (
            proj / "out/d.json",
            False,
            True,
            False,
        )
        assert Path(a.dvcfile.path) == proj / "dvc.yaml"


# ---------------------------------------------------------------- status and the dry run


def test_status_names_changed_stages_and_an_unknown_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repo.status (with_deps), NoOutputOrStageError: the changed stages by name, a target's
    upstream ones with it; a target that names nothing is `UnknownTarget`."""
    proj = toy(tmp_path / "p", diamond())
    monkeypatch.chdir(proj)
    with dvc.open_repo(proj) as repo:
        assert set(dvc.status(repo, ["c"])) == set("ac")
    run(["dvc", "repro", "a", "e"], proj)
    with dvc.open_repo(proj) as repo:
        assert set(dvc.status(repo)) == set("bcd")
        assert set(dvc.status(repo, ["d"])) == set("bcd")
        assert set(dvc.status(repo, ["e"])) == set()
        with pytest.raises(dvc.UnknownTarget):
            dvc.status(repo, ["nosuchstage"])


def test_the_dry_run_lists_stages_whose_inputs_are_not_made_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dvc repro --dry` fails on a stage whose dependency another stage has yet to make
    (treeverse/dvc#9818: its run-cache lookup hashes the missing file); the door's dry run
    (its own repository's StageCache.restore) lists every stage and its command, runs nothing,
    and leaves DVC's `_can_hash`, the working directory and DVC's logger as they were."""
    import logging

    import dvc.stage.cache as run_cache

    proj = toy(tmp_path / "p", diamond())
    assert run(["dvc", "repro", "--dry"], proj, check=False).returncode != 0
    monkeypatch.chdir(proj)  # `lfbench plan --dry` in the project
    can_hash, cwd = run_cache._can_hash, Path.cwd()
    dvc_log = logging.getLogger("dvc")
    handlers, propagate = list(dvc_log.handlers), dvc_log.propagate
    seen: list[Any] = []

    def other_thread() -> None:  # DVC's own run cache, meanwhile, in another thread
        seen.append(run_cache._can_hash)

    out = StringIO()
    done = dvc.dry_run(proj, [], out)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert sorted(done) == list("abcde")
    text = out.getvalue()
    for name in "abcde":
        assert f"Running stage '{name}':" in text
    assert "> python step.py d out/d.json out/b.json out/c.json" in text
    assert not (proj / "out").exists() and not (proj / "times.log").exists()
    assert run_cache._can_hash is can_hash and seen == [can_hash] and Path.cwd() == cwd
    assert dvc_log.handlers == handlers and dvc_log.propagate == propagate
    run(["dvc", "repro"], proj)
    out = StringIO()
    assert dvc.dry_run(proj, ["d"], out) == [] and "up to date" in out.getvalue()
