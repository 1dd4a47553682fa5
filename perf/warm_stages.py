"""CPU of a sliced four-benchmark DAG with each stage in its own process and with the stages
forked from the warm stage server (pipeline/stages/warm_stage.py); the same outputs either way.

    python perf/warm_stages.py [--mirror DIR] [--jobs 2] [--json]

Three copies of the working tree with the same sliced params (SummHay, Long²RAG, CRUX and
CRUD-RAG on a few items of news1, no model server): the first fills the embedding cache the
other two share, so both measured runs start from the same cache; then `lfbench repro` runs in
one with LFBENCH_WARM_STAGES=0 and in the other with the server (none running before: its start
and imports are counted). CPU is the whole process tree's, read from a cgroup (v1 cpuacct or
v2; needs root): the server's children join their caller's cgroup. Prints both, the stages in
dvc.lock, and whether dvc.lock's outputs and the metrics files are byte-identical.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import (  # noqa: E402
    list_entries,
    make_project,
    slice_crud_rag,
    slice_crux,
    slice_summhay,
)


def _cgroup(name: str) -> tuple[Path, str]:
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if v1.is_dir():
        group = v1 / name
        group.mkdir(exist_ok=True)
        return group, "cpuacct.usage"
    group = Path("/sys/fs/cgroup") / name
    group.mkdir(exist_ok=True)
    return group, "cpu.stat"


def _usage_s(group: Path, counter: str) -> float:
    text = (group / counter).read_text()
    if counter == "cpuacct.usage":
        return int(text) / 1e9
    fields = dict(line.split() for line in text.splitlines())
    return int(fields["usage_usec"]) / 1e6


def _slice(proj: Path) -> None:
    path = proj / "params.yaml"
    params: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["runtime"] = "local"
    slice_summhay(params)
    slice_crux(params)
    slice_crud_rag(params)
    lr = params["long2rag"]
    lr["derived"].update(haystacks=["news1"], subtopics=1)
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    list_entries(proj)


def _kill_servers(base: Path) -> None:
    """This run's servers only (their sockets are under its TMPDIR)."""
    subprocess.run(["pkill", "-f", f"pipeline.stages.warm_(stage|sync) {base}/"], check=False)
    time.sleep(0.5)


def _repro(proj: Path, jobs: int, env: dict[str, str], name: str) -> dict[str, Any]:
    group, counter = _cgroup(name)
    before = _usage_s(group, counter)
    t0 = time.monotonic()
    out = subprocess.run(
        ["lfbench", "repro", "--jobs", str(jobs)],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
    )
    wall = time.monotonic() - t0
    if out.returncode != 0:
        raise SystemExit(f"{name}: lfbench repro failed\n{out.stderr[-4000:]}")
    lock = yaml.safe_load((proj / "dvc.lock").read_text(encoding="utf-8"))
    return {
        "cpu_s": round(_usage_s(group, counter) - before, 1),
        "wall_s": round(wall, 1),
        "stages": len(lock["stages"]),
    }


def _outputs(proj: Path) -> dict[str, Any]:
    lock = yaml.safe_load((proj / "dvc.lock").read_text(encoding="utf-8"))
    outs = {
        name: [(o["path"], o.get("md5")) for o in stage.get("outs", [])]
        for name, stage in lock["stages"].items()
    }
    metrics = {p.name: p.read_bytes() for p in sorted((proj / "metrics").glob("*.json"))}
    return {"outs": outs, "metrics": metrics}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mirror",
        default=os.environ.get("LFBENCH_DATA_MIRROR", str(ROOT.parent / "shared" / "data")),
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mirror = Path(args.mirror).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "LFBENCH_EMBEDDING_CACHE": str(base / "embeddings.sqlite"),
            "TMPDIR": str(base),  # a socket folder of its own: no server from elsewhere
        }
        env.pop("MLFLOW_TRACKING_URI", None)
        projects = {}
        for name in ("fill", "own", "warm"):
            projects[name] = make_project(base / name, mirror)
            _slice(projects[name])
        _kill_servers(base)
        _repro(projects["fill"], args.jobs, {**env, "LFBENCH_WARM_STAGES": "0"}, "lfb-fill")
        own = _repro(projects["own"], args.jobs, {**env, "LFBENCH_WARM_STAGES": "0"}, "lfb-own")
        _kill_servers(base)
        warm = _repro(projects["warm"], args.jobs, {**env, "LFBENCH_WARM_STAGES": "1"}, "lfb-warm")
        same = _outputs(projects["own"]) == _outputs(projects["warm"])
        _kill_servers(base)
    result = {
        "each stage its own process": own,
        "stages forked from the warm server": warm,
        "cpu_saved_s": round(own["cpu_s"] - warm["cpu_s"], 1),
        "outputs_identical": same,
        "cores": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
