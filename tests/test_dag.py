"""Only what changed runs (issue 33): which stages of dvc.yaml a model added to a benchmark can
re-run, read from DVC's own graph and parameter dependencies (no stage runs).

A stage re-runs when a dependency changes: an output of an upstream stage (DVC's graph) or a
parameter key it lists. Adding a model adds its generate and judge stages and changes
`models.<name>` and `<benchmark>.models`; the stages that can see that are exactly its own, and
the aggregates of the benchmarks that list it. The agreement stage reads only the released
systems' judgements, CRUX's aggregate only the released systems' rows.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


# Outputs whose content does not depend on the models a benchmark adds: SummHay's released
# systems' rows (written from the `published` models' rows alone, stages/aggregate.py).
INVARIANT = {"metrics/summhay.released.json"}


def affected(proj: Path, new_model: str, benchmarks: list[str]) -> set[str]:
    """The stages `dvc repro` re-runs after adding `new_model` to `benchmarks`: its own (new),
    those listing a changed parameter key, then those reading a file or folder that changes."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    changed_keys = {f"models.{new_model}", *(f"{b}.models" for b in benchmarks)}

    def touches(key: str) -> bool:
        # a key covers the changed ones when it is one of them or a section holding them
        return any(c == key or c.startswith(key + ".") for c in changed_keys)

    repo = Repo(str(proj))
    stages = list(repo.index.stages)
    hit = {s for s in stages if s.name.endswith(f"@{new_model}") or f"@{new_model}-" in s.name}
    for stage in stages:
        if any(
            isinstance(d, ParamsDependency) and any(touches(k) for k in d.params)
            for d in stage.deps
        ):
            hit.add(stage)

    def rel(path: str) -> str:
        return str(Path(path).resolve().relative_to(proj.resolve()))

    changing: set[str] = set()
    grew = True
    while grew:
        changing = {rel(o.fs_path) for s in hit for o in s.outs} - INVARIANT
        grew = False
        for stage in stages:
            if stage in hit:
                continue
            deps = {rel(d.fs_path) for d in stage.deps if not isinstance(d, ParamsDependency)}
            if any(
                d == c or c.startswith(d + "/") or d.startswith(c + "/")
                for d in deps
                for c in changing
            ):
                hit.add(stage)
                grew = True
    return {s.name for s in hit}


def test_adding_a_model_reaches_its_own_stages_and_its_benchmarks_aggregates(
    tmp_path: Path,
) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, proj / name)
    (proj / ".dvc").mkdir()
    (proj / ".dvc" / "config").write_text("[core]\n    no_scm = true\n")
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["models"]["mine"] = {"provider": "baseline", "kind": "lead", "settings": ["oracle"]}
    for b in ("summhay", "long2rag"):
        params[b]["models"].append("mine")
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    hit = affected(proj, "mine", ["summhay", "long2rag"])
    judges = {b: params[b]["judges"] for b in ("summhay", "long2rag")}
    assert hit == {
        "summhay-generate@mine",
        *(f"summhay-judge@mine-{j}" for j in judges["summhay"]),
        "summhay-results@mine",
        "summhay-aggregate",
        "long2rag-generate@mine",
        *(f"long2rag-judge@mine-{j}" for j in judges["long2rag"]),
        "long2rag-results@mine",
        "long2rag-aggregate",
    }
    # before the fix: the agreement stage listed summhay.models and read every model's
    # judgements; CRUX's aggregate read metrics/summhay.json and all of SummHay's outputs
    assert "summhay-agreement" not in hit and "crux-aggregate" not in hit


def test_no_stage_that_logs_mlflow_runs_can_be_restored_from_the_run_cache() -> None:
    """Issue 36, point 1: DVC's run cache put an aggregate's metrics back ("is cached - skipping
    run, checking out outputs") without running it, so MLflow kept the other results. DVC does
    not cache a run whose stage has a persist output (dvc/stage/cache.py, `_can_hash`): every
    stage that logs MLflow runs (aggregate, agreement) has one, the scaffold's too."""
    # the scaffold's stages, appended under `stages:` of a user's dvc.yaml
    # (it names the shapes' anchors: it loads only at the end of the file that defines them)
    text = (ROOT / "dvc.yaml").read_text()
    snippet = (ROOT / "pipeline/benchmarks/_template/dvc.snippet.yaml").read_text()
    doc = yaml.safe_load(text + snippet)["stages"]
    assert "_template-aggregate" in doc and "_template-results" in doc
    logging = {
        name: s
        for name, s in doc.items()
        if any(f"run {v} " in str(s.get("cmd")) for v in ("aggregate", "agreement", "results"))
    }
    assert {
        "summhay-aggregate",
        "summhay-agreement",
        "crux-aggregate",
        "summhay-results",
        "_template-results",
    } <= set(logging)
    for name, s in logging.items():
        persisted = [
            path
            for out in s.get("metrics", []) + s.get("outs", [])
            if isinstance(out, dict)
            for path, flags in out.items()
            if flags.get("persist")
        ]
        assert persisted, f"{name}: no persist output, so DVC's run cache can restore it"


def test_a_persist_output_makes_dvc_run_the_stage_instead_of_restoring_it(tmp_path: Path) -> None:
    """The DVC rule the test above relies on, shown on a toy stage whose command leaves a trace
    outside its outputs (as a sync to MLflow does): dep A, dep B, dep A again. With a persist
    output the third `dvc repro` runs the command; without, DVC's run cache restores it."""
    from tests.conftest import dvc_init, run

    def traces(persist: bool) -> int:
        proj = tmp_path / f"persist-{persist}"
        proj.mkdir()
        (proj / "dep.txt").write_text("A")
        stage = {
            "cmd": "cat dep.txt > m.json && echo ran >> ../trace-" + str(persist),
            "deps": ["dep.txt"],
            "metrics": [{"m.json": {"cache": False, "persist": persist}}],
        }
        (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"agg": stage}}))
        run(["git", "init", "-q"], proj)
        dvc_init(proj)
        for value in ("A", "B", "A"):
            (proj / "dep.txt").write_text(value)
            run(["dvc", "repro"], proj)
        return len((tmp_path / f"trace-{persist}").read_text().splitlines())

    assert traces(persist=False) == 2  # the third was restored from the run cache
    assert traces(persist=True) == 3
