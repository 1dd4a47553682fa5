"""`lfbench plan`'s clock: how long each stage of a plan takes, and the wall time of the whole
plan at `--jobs N`, by simulating what `lfbench repro` does (pipeline/runner/driver.py).

- A stage that calls a model or judge endpoint takes the time `pipeline.stages.plan` gives it
  (its requests at the entry's rate: a measured one, the one given per entry, or
  `--seconds-per-request`), plus what its process costs around the requests (the stage's
  recorded time less its requests' share is not known: `STAGE_OVERHEAD_S`).
- Any other stage (construct, a local judge, aggregate...) takes the time its last finished
  run took here (the `repro-<run>.json` timelines the driver writes in `.lfbench/logs/`), else
  the mean of the stages of its group that ran (the same stage of another model: `judge@x-local`
  for `judge@y-local`), else it is unknown (0 in the sum, named in a note).
- The schedule: a stage starts when its upstream stages are done; one that waits on an endpoint
  takes one of the `jobs` slots, one that uses the CPU takes its cores (`stage_cores`) out of
  the machine's instead (`stage_resources`); ready stages start in the driver's order
  (more stages downstream first, then dvc.yaml's order). A stage with nothing to do takes no
  time.
"""

from __future__ import annotations

import heapq
import json
import os
import shlex
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import ConfigError

# what starting a stage's process and saving its outputs costs beyond its requests (a few
# seconds: Python's imports, DVC's hashing); measured on the sliced projects of perf/
STAGE_OVERHEAD_S = 3.0


@dataclass(frozen=True)
class Job:
    """One stage of the plan: its upstream stages (of the plan), seconds and cores."""

    name: str
    upstream: tuple[str, ...] = ()
    seconds: float = 0.0
    cores: int = 1


@dataclass
class Schedule:
    wall_s: float
    start: dict[str, float] = field(default_factory=dict)
    end: dict[str, float] = field(default_factory=dict)


def downstream_counts(upstream: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """How many stages are downstream of each, given each stage's upstream stages (the
    driver's priority: the stage that unblocks most starts first). Upstream names outside the
    mapping are ignored."""
    below: dict[str, set[str]] = {name: set() for name in upstream}
    for name, ups in upstream.items():
        for u in ups:
            if u in below:
                below[u].add(name)
    out = {}
    for name in below:
        seen: set[str] = set()
        todo = list(below[name])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(below[n])
        out[name] = len(seen)
    return out


def simulate(jobs: Sequence[Job], slots: int, ncpu: int) -> Schedule:
    """When each stage starts and ends with `slots` endpoint stages at once and `ncpu` cores
    (a stage that uses the CPU takes min(its cores, ncpu) of them, and no slot), as the driver
    starts them; the wall time is the last end. Upstream names outside `jobs` are taken as
    done."""
    names = {j.name for j in jobs}
    prio = downstream_counts({j.name: list(j.upstream) for j in jobs})
    index = {j.name: i for i, j in enumerate(jobs)}
    order = sorted(jobs, key=lambda j: (-prio[j.name], index[j.name]))
    waiting = {j.name for j in jobs}
    sched = Schedule(0.0)
    running: list[tuple[float, int, str]] = []
    free_slots, free_cores, now = max(1, slots), max(1, ncpu), 0.0
    by_name = {j.name: j for j in jobs}
    while waiting or running:
        started = True
        while started:  # a stage that takes no time may make the next one ready
            started = False
            for j in order:
                if j.name not in waiting:
                    continue
                if any(u in names and sched.end.get(u, now + 1) > now for u in j.upstream):
                    continue
                cores = min(j.cores, ncpu)
                if j.seconds <= 0:
                    sched.start[j.name] = sched.end[j.name] = now
                elif (free_cores >= cores) if cores else (free_slots >= 1):
                    free_slots -= 0 if cores else 1
                    free_cores -= cores
                    sched.start[j.name] = now
                    heapq.heappush(running, (now + j.seconds, index[j.name], j.name))
                else:
                    continue
                waiting.discard(j.name)
                started = True
        if not running:
            break  # what is left waits on a stage that never ends (none in a DAG)
        now, _, name = heapq.heappop(running)
        finished = [name]
        while running and running[0][0] <= now:
            finished.append(heapq.heappop(running)[2])
        for n in finished:
            sched.end[n] = now
            free_slots += 0 if by_name[n].cores else 1
            free_cores += min(by_name[n].cores, ncpu)
    sched.wall_s = max(sched.end.values(), default=0.0)
    return sched


# ---------------------------------------------------------------- recorded stage times


def recorded_seconds(root: Path) -> dict[str, float]:
    """Each stage's time in the newest run that ran it to its end here (the driver's timelines,
    `.lfbench/logs/repro-*.json`; stages found unchanged or restored ran nothing)."""
    out: dict[str, tuple[float, float]] = {}
    for path in (root / ".lfbench" / "logs").glob("repro-*.json"):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        for row in doc.get("stages", []) if isinstance(doc, dict) else []:
            if not isinstance(row, dict) or row.get("state") != "done":
                continue
            a, b = row.get("started"), row.get("ended")
            if isinstance(a, int | float) and isinstance(b, int | float) and b >= a:
                name = str(row.get("stage"))
                if name not in out or out[name][0] < mtime:
                    out[name] = (mtime, float(b) - float(a))
    return {k: v for k, (_, v) in out.items()}


def group_of(stage: str, judge: str | None = None) -> str:
    """The stages one stands for another of: its name before `@`, with its judge if it has one."""
    return stage.split("@", 1)[0] + (f"/{judge}" if judge else "")


def estimate_cpu(
    stage: str,
    judge: str | None,
    recorded: Mapping[str, float],
    judges: Mapping[str, str],
    answers: Callable[[str], int | None] = lambda _: None,
) -> tuple[float | None, str]:
    """A CPU stage's seconds and how they were found: its own last run, else the mean of its
    group's (`judges`: a recorded stage -> its judge, for the group); a judge stage's the mean
    per answer judged times its answers, when `answers` knows them all (beyond
    `STAGE_OVERHEAD_S`: the same judge on a model with a quarter of the answers)."""
    if stage in recorded:
        return recorded[stage], "its last run"
    key = group_of(stage, judge)
    peers = [(n, s) for n, s in recorded.items() if group_of(n, judges.get(n)) == key]
    if not peers:
        return None, "unknown: no run of it or of one like it"
    mine = answers(stage)
    per = [max(0.0, s - STAGE_OVERHEAD_S) / a for n, s in peers if (a := answers(n))]
    if mine is not None and len(per) == len(peers):
        secs = STAGE_OVERHEAD_S + statistics.fmean(per) * mine
        return secs, f"{len(peers)} like it ({key}), per answer, for {mine} answers"
    return statistics.fmean(s for _, s in peers), f"the mean of {len(peers)} like it ({key})"


def model_of(stage: str, judges: Sequence[str], models: set[str]) -> str | None:
    """The models entry a `<bench>-generate@<model>` or `<bench>-judge@<model>-<judge>`
    stage runs (None: another stage)."""
    group, at, item = stage.partition("@")
    if not at or not group.endswith(("-generate", "-judge")):
        return None
    judge = judge_of(stage, judges)
    if judge is not None:
        item = item[: -len(judge) - 1]
    return item if item in models else None


def judge_of(stage: str, judges: Sequence[str]) -> str | None:
    """The judge a `<bench>-judge@<model>-<judge>` stage names (the longest that fits)."""
    _, at, item = stage.partition("@")
    if not at or "-judge" not in stage.split("@", 1)[0]:
        return None
    fits = [j for j in judges if item.endswith(f"-{j}")]
    return max(fits, key=len) if fits else None


# ---------------------------------------------------------------- a plan's clock


@dataclass
class Clock:
    jobs: int
    ncpu: int
    wall_s: float
    serial_s: float
    stages: dict[str, tuple[float, str]]  # stage -> (seconds, how found), those that run
    unknown: list[str]
    models: dict[str, tuple[float, float]]

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "cores": self.ncpu,
            "wall_s": round(self.wall_s, 1),
            "serial_s": round(self.serial_s, 1),
            "stages": {k: {"s": round(v, 1), "from": b} for k, (v, b) in self.stages.items()},
            "unknown": self.unknown,
            "models": {
                m: {"stages_s": round(s, 1), "done_at_s": round(e, 1)}
                for m, (s, e) in self.models.items()
            },
        }


ENDPOINT_PROVIDERS = ("openai",)


def stage_cores(stage: Any, params: Mapping[str, Any], ncpu: int) -> int:
    """The cores a stage takes: 0 for one that waits on an endpoint (its model or judge has
    provider `openai`), else its dvc.yaml `meta.lfbench.cores` (`all` or N; default 1)."""
    argv = shlex.split(" ".join(_cmds(stage)))
    for flag, section in (("--model", "models"), ("--judge", "judges")):
        if flag in argv[:-1]:
            name = argv[argv.index(flag) + 1]
            entry = (params.get(section) or {}).get(name) or {}
            endpoint = isinstance(entry, Mapping) and entry.get("provider") in ENDPOINT_PROVIDERS
            if endpoint and ("generate" in argv or flag == "--judge"):
                return 0
    meta = getattr(stage, "meta", None) or {}
    want = (meta.get("lfbench") or {}).get("cores", 1) if isinstance(meta, Mapping) else 1
    if want == "all":
        return ncpu
    try:
        return max(1, min(ncpu, int(want)))
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"dvc.yaml: stage {stage.addressing}: meta.lfbench.cores {want!r}: use all or a number"
        ) from e


def stage_resources(cores: int) -> dict[str, float]:
    """What a stage's task holds on a worker: one of the `--jobs` slots when it waits on an
    endpoint (no core), else its cores (`worker_resources`). So a stage that needs the CPU does
    not queue behind stages that only wait on endpoints: with `--jobs 8` and 8 long generate
    stages waiting on their servers, a judge or results stage still starts on a free core."""
    return {"cores": cores} if cores else {"slots": 1}


def worker_resources(jobs: int, ncpu: int) -> tuple[int, dict[str, float]]:
    """A worker's threads and resources: `jobs` slots for stages that wait on endpoints and its
    cores for the others, a thread for each."""
    return jobs + ncpu, {"slots": jobs, "cores": ncpu}


def _cmds(stage: Any) -> list[str]:
    cmd = stage.cmd
    return list(cmd) if isinstance(cmd, list) else str(cmd).splitlines()


def _ncpu() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def plan_clock(
    root: Path,
    plan: Any,
    targets: Sequence[str],
    jobs: int,
    params: Mapping[str, Any],
    ncpu: int | None = None,
) -> Clock:
    """The clock of a `pipeline.stages.plan.Plan`: each stage that will run (DVC's changed
    ones and those downstream of them, whose inputs change) timed, the run simulated."""
    from pipeline import dvc_internals as dvc

    ncpu = ncpu or _ncpu()
    with dvc.open_repo(root) as repo:
        steps, upstream = dvc.plan(repo, targets)
        cores = {s.addressing: stage_cores(s, params, ncpu) for s in steps}
    names = [s.addressing for s in steps]
    runs = set(plan.stages)
    for n in names:  # dvc.plan's order is upstream first
        if any(u in runs for u in upstream[n]):
            runs.add(n)
    rows: dict[str, list[Any]] = {}
    for r in plan.rows:
        rows.setdefault(r.stage, []).append(r)
    recorded = recorded_seconds(root)
    judge_names = list((params.get("judges") or {}).keys())
    judges = {n: j for n in recorded if (j := judge_of(n, judge_names))}
    timed: dict[str, tuple[float, str]] = {}
    unknown = []
    entries = set(params.get("models") or {})
    planned: dict[str, int] = {
        r.stage: int(r.built) for r in plan.rows if r.kind == "generate" and r.built
    }

    def answers(stage: str) -> int | None:
        """The answers a judge stage judges: its model's planned generations, else the
        generations file there is (None: not a judge stage, or not known)."""
        model = model_of(stage, judge_names, entries)
        if model is None or "-judge@" not in stage:
            return None
        bench = stage.split("-judge@", 1)[0]
        if f"{bench}-generate@{model}" in planned:
            return planned[f"{bench}-generate@{model}"]
        try:
            with (root / "generations" / bench / f"{model}.jsonl").open("rb") as f:
                return sum(1 for line in f if line.strip()) or None
        except OSError:
            return None

    for n in names:
        if n not in runs:
            continue
        mine = rows.get(n, [])
        sent = [r for r in mine if r.requests]
        if sent:
            if any(r.time_s is None for r in sent):
                unknown.append(n)
                continue
            secs = sum(r.time_s for r in sent) + STAGE_OVERHEAD_S
            timed[n] = (secs, "; ".join(dict.fromkeys(r.time_basis for r in sent)))
            continue
        if cores[n] == 0:  # an endpoint stage with nothing to send: its process only
            timed[n] = (STAGE_OVERHEAD_S, "nothing to send")
            continue
        secs, basis = estimate_cpu(n, judge_of(n, judge_names), recorded, judges, answers)
        if secs is None:
            unknown.append(n)
        else:
            timed[n] = (secs, basis)
    sched = simulate(
        [Job(n, tuple(upstream[n]), timed.get(n, (0.0, ""))[0], cores[n]) for n in names],
        jobs,
        ncpu,
    )
    models: dict[str, tuple[float, float]] = {}
    for n, (secs, _) in timed.items():
        model = model_of(n, judge_names, entries)
        if model is not None:
            s, e = models.get(model, (0.0, 0.0))
            models[model] = (s + secs, max(e, sched.end.get(n, 0.0)))
    return Clock(
        jobs,
        ncpu,
        sched.wall_s,
        sum(v for v, _ in timed.values()),
        timed,
        unknown,
        models,
    )


def _t(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def render_clock(clock: Clock) -> str:
    lines = [
        f"wall time at --jobs {clock.jobs} ({clock.ncpu} cores): about {_t(clock.wall_s)}"
        f" (the stages one after another: {_t(clock.serial_s)})"
    ]
    for m, (s, e) in sorted(clock.models.items(), key=lambda kv: kv[1][1]):
        lines.append(f"  {m}: its stages {_t(s)}, done at about {_t(e)}")
    for n, (s, basis) in clock.stages.items():
        if not basis.startswith(("its last run", "the mean")) and "like it" not in basis:
            continue
        lines.append(f"  {n}: {_t(s)} from {basis}")
    if clock.unknown:
        lines.append(
            "  not in the wall time (no rate, no run of them or of stages like them): "
            + ", ".join(clock.unknown)
        )
    return "\n".join(lines) + "\n"
