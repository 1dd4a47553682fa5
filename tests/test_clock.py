"""The clock (issue 42, point 4): `lfbench plan`'s schedule of a run at `--jobs N`, its rates
per model, the CPU stages' recorded times, and the live view's ETA and oldest request."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.types import ChatRequest, EndpointConfig
from pipeline.runner.clock import (
    STAGE_OVERHEAD_S,
    Job,
    estimate_cpu,
    judge_of,
    model_of,
    recorded_seconds,
    simulate,
)
from pipeline.runner.driver import StageState
from pipeline.runner.view import progress_text
from pipeline.stages.plan import Planner, duration, interrupted

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- the schedule


def test_a_diamond_s_wall_time_is_its_critical_path_with_enough_slots() -> None:
    dag = [
        Job("a", (), 10, 1),
        Job("b", ("a",), 20, 1),
        Job("c", ("a",), 30, 1),
        Job("d", ("b", "c"), 5, 1),
    ]
    two = simulate(dag, slots=2, ncpu=2)
    assert two.wall_s == 45  # a, then c beside b, then d
    assert (two.start["d"], two.end["c"]) == (40, 40)
    assert simulate(dag, slots=1, ncpu=2).wall_s == 45  # CPU stages take cores, not slots
    assert simulate(dag, slots=4, ncpu=1).wall_s == 65  # one core: the CPU stages in turn
    endpoints = [Job(j.name, j.upstream, j.seconds, 0) for j in dag]
    assert simulate(endpoints, slots=1, ncpu=2).wall_s == 65  # one slot: endpoint stages in turn
    assert simulate(endpoints, slots=2, ncpu=1).wall_s == 45


def test_a_cpu_stage_does_not_wait_for_a_slot_held_by_endpoint_stages() -> None:
    """Two slow generate stages hold both slots; a CPU judge of a fast model runs on a free
    core meanwhile (it waited for a slot until the slow ones ended before)."""
    dag = [Job("fast", (), 5, 0), Job("slow1", ("fast",), 100, 0)]
    dag += [Job("slow2", ("fast",), 100, 0), Job("judge", ("fast",), 10, 1)]
    s = simulate(dag, slots=2, ncpu=2)  # fast first; then judge beside the two slow ones
    assert (s.start["judge"], s.end["judge"], s.wall_s) == (5, 15, 105)


def test_endpoint_stages_take_a_slot_but_no_core() -> None:
    """Four models' generate stages (0 cores) side by side on one core, each then its CPU judge
    (1 core, one at a time)."""
    dag = [Job(f"gen{i}", (), 10 * (i + 1), 0) for i in range(4)]
    dag += [Job(f"judge{i}", (f"gen{i}",), 6, 1) for i in range(4)]
    s = simulate(dag, slots=4, ncpu=1)
    # gen0..3 end at 10, 20, 30, 40; the judges run as slots free: 10-16, 20-26, 30-36, 40-46
    assert [s.end[f"judge{i}"] for i in range(4)] == [16, 26, 36, 46]
    assert s.wall_s == 46
    # two slots: gen2 waits for gen0's slot (10 -> 40), gen3 for gen1's... and the judges
    # (more stages downstream first: a generate stage before a judge) take what is left
    two = simulate(dag, slots=2, ncpu=1)
    assert two.start["gen2"] == 10 and two.start["gen3"] == 20
    assert two.wall_s == 66  # gen3 20 -> 60, then judge3 60 -> 66


def test_more_stages_downstream_start_first_and_free_stages_take_no_time() -> None:
    dag = [
        Job("lone", (), 10, 1),
        Job("head", (), 10, 1),
        Job("unchanged", ("head",), 0, 1),  # found unchanged: no slot, no time
        Job("tail", ("unchanged",), 10, 1),
    ]
    s = simulate(dag, slots=1, ncpu=1)
    # head first (3 stages wait on it), though lone comes first in dvc.yaml; then, of the two
    # ready with none downstream, dvc.yaml's order
    assert (s.start["head"], s.start["lone"], s.start["tail"]) == (0, 10, 20)
    assert s.start["unchanged"] == s.end["unchanged"] == 10
    assert s.wall_s == 30
    assert simulate([], slots=4, ncpu=2).wall_s == 0


def test_a_stage_wanting_every_core_waits_for_them() -> None:
    dag = [Job("small", (), 10, 1), Job("all", (), 10, 2), Job("small2", (), 10, 1)]
    s = simulate(dag, slots=3, ncpu=2)
    assert s.start["small"] == 0 and s.start["small2"] == 0 and s.start["all"] == 10
    assert s.wall_s == 20


# ---------------------------------------------------------------- rates


def test_a_rate_given_per_model_wins_over_the_default() -> None:
    planner = Planner(Path(), Any, [], 1.0, {"slow": 30.0})  # type: ignore[arg-type]
    assert planner.spr("slow") == 30.0 and planner.spr("fast") == 1.0
    ep = EndpointConfig(base_url="http://x/v1", model="m", max_concurrency=4)
    assert duration(ep, 10, 0, seconds_per_request=planner.spr("slow"))[0] == 3 * 30.0
    assert duration(ep, 10, 0, seconds_per_request=planner.spr("fast"))[0] == 3 * 1.0
    # a measured rate (an earlier run's) wins over a given one
    secs, basis = duration(ep, 10, 0, measured_rate=2.0, seconds_per_request=30.0)
    assert (secs, basis) == (5.0, "measured rate of an earlier run")


def test_a_stopped_run_s_progress_file_gives_its_rate(tmp_path: Path) -> None:
    stage = "long2rag-generate@slow"
    assert interrupted(tmp_path, stage) is None
    old = tmp_path / ".lfbench" / "progress" / "run1" / f"{stage}.json"
    new = tmp_path / ".lfbench" / "progress" / "run2" / f"{stage}.json"
    for path, done, t0, mtime in ((old, 5, 1000.0, 1100.0), (new, 8, 2000.0, 2040.0)):
        path.parent.mkdir(parents=True)
        body = {"done": done, "total": 20, "errors": 0, "t0": t0, "oldest": None}
        path.write_text(json.dumps(body))
        os.utime(path, (mtime, mtime))
    m = interrupted(tmp_path, stage)
    assert m is not None and m.requests == 8 and m.wall_s == 40.0 and m.rate == 0.2


def test_lfbench_plan_refuses_a_rate_for_no_entry() -> None:
    from click.testing import CliRunner

    from pipeline.runner.commands import plan

    res = CliRunner().invoke(plan, ["--rate", "nobody=3"], catch_exceptions=False)
    assert res.exit_code != 0 and "'nobody' is no models, judges or retrievers entry" in res.output
    res = CliRunner().invoke(plan, ["--rate", "lead=fast"], catch_exceptions=False)
    assert res.exit_code != 0 and "use NAME=SECONDS" in res.output


# ---------------------------------------------------------------- CPU stages


def test_cpu_stages_take_their_recorded_time_or_that_of_stages_like_them(tmp_path: Path) -> None:
    logs = tmp_path / ".lfbench" / "logs"
    logs.mkdir(parents=True)

    def timeline(name: str, rows: list[tuple[str, str, float, float]], mtime: float) -> None:
        stages = [{"stage": s, "state": st, "started": a, "ended": b} for s, st, a, b in rows]
        (logs / name).write_text(json.dumps({"run": name, "stages": stages}))
        os.utime(logs / name, (mtime, mtime))

    timeline(
        "repro-a.json",
        [
            ("long2rag-judge@lead-local", "done", 10.0, 50.0),
            ("long2rag-judge@lead-l2r-overlap", "done", 10.0, 14.0),
            ("long2rag-aggregate", "done", 60.0, 75.0),
        ],
        1000,
    )
    timeline(
        "repro-b.json",
        [
            ("long2rag-judge@extractive-local", "done", 0.0, 20.0),
            ("long2rag-aggregate", "unchanged", 30.0, 30.5),  # ran nothing: not a time
        ],
        2000,
    )
    rec = recorded_seconds(tmp_path)
    assert rec == {
        "long2rag-judge@lead-local": 40.0,
        "long2rag-judge@lead-l2r-overlap": 4.0,
        "long2rag-aggregate": 15.0,
        "long2rag-judge@extractive-local": 20.0,
    }
    judges = ["local", "l2r-overlap"]
    assert judge_of("long2rag-judge@m1-l2r-overlap", judges) == "l2r-overlap"
    models = {"m1", "m-2"}
    assert model_of("long2rag-judge@m-2-l2r-overlap", judges, models) == "m-2"
    assert model_of("summhay-generate@m1", judges, models) == "m1"
    assert model_of("summhay-retrieve@m1", judges, models) is None
    assert judge_of("long2rag-generate@m1-local", judges) is None
    assert estimate_cpu("long2rag-aggregate", None, rec, {})[0] == 15.0
    by = {n: j for n in rec if (j := judge_of(n, judges))}
    secs, basis = estimate_cpu("long2rag-judge@new-local", "local", rec, by)
    assert secs == 30.0 and basis.startswith("the mean of 2")  # (40 + 20) / 2, not the overlap
    assert estimate_cpu("crux-aggregate", None, rec, by)[0] is None
    # per answer judged, beyond the stage's overhead: lead's 40 s for 100 answers and
    # extractive's 20 s for 50 answers are (40 - 3) / 100 and (20 - 3) / 50 s an answer
    counts = {"long2rag-judge@lead-local": 100, "long2rag-judge@extractive-local": 50}
    counts["long2rag-judge@new-local"] = 25
    secs, basis = estimate_cpu("long2rag-judge@new-local", "local", rec, by, counts.get)
    assert STAGE_OVERHEAD_S == 3.0
    assert secs == pytest.approx(3 + (0.37 + 0.34) / 2 * 25)
    assert basis.endswith("per answer, for 25 answers")


# ---------------------------------------------------------------- the live view


def _running(progress: dict[str, Any]) -> StageState:
    st = StageState("long2rag-generate@slow", 0, [], 0)
    st.progress = {"stage": st.name, **progress}
    return st


def test_the_view_shows_a_running_stage_s_eta_and_oldest_request() -> None:
    now = 10_000.0
    st = _running({"done": 2, "total": 10, "errors": 0, "t0": now - 60, "oldest": now - 42})
    # 2 done in 60 s: 8 left take 240 s
    assert progress_text(st, now) == "2/10 requests, ETA 4 min 00 s, oldest 42 s"
    nothing_yet = _running(
        {"done": 0, "total": 3, "errors": 0, "t0": now - 600, "oldest": now - 600}
    )
    assert progress_text(nothing_yet, now) == "0/3 requests, oldest 10 min 00 s"
    done = _running({"done": 3, "total": 3, "errors": 1, "t0": now - 5, "oldest": None})
    assert progress_text(done, now) == "3/3 requests, 1 errors"
    old_client = _running({"done": 1, "total": 3, "errors": 0})  # a progress file without a clock
    assert progress_text(old_client, now) == "1/3 requests"


def test_the_client_reports_when_its_oldest_request_in_flight_was_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.llm.client import run_chat_sync
    from pipeline.testing.server import TestServer

    progress = tmp_path / "progress.json"
    monkeypatch.setenv("LFBENCH_PROGRESS_FILE", str(progress))
    seen: list[dict[str, Any]] = []
    with TestServer(latency_ms=1500, cwd=ROOT) as srv:
        ep = EndpointConfig(base_url=srv.base_url, model="m", max_concurrency=2, api_key_env=None)
        reqs = [
            ChatRequest(
                key=f"k{i}", messages=[{"role": "user", "content": f"q{i}"}], prompt_sha="p"
            )
            for i in range(2)
        ]
        t0 = time.time()
        th = threading.Thread(
            target=run_chat_sync,
            args=(ep, reqs),
            kwargs={"cache_path": None, "journal_path": None, "label": "t", "progress": False},
        )
        th.start()
        deadline = time.monotonic() + 10
        while th.is_alive() and time.monotonic() < deadline:
            if progress.exists():
                seen.append(json.loads(progress.read_text()))
            time.sleep(0.1)
        th.join()
    in_flight = [p for p in seen if p.get("oldest") is not None]
    assert in_flight, seen
    assert (
        t0 - 1 <= in_flight[0]["oldest"] <= t0 + 5 and in_flight[0]["t0"] <= in_flight[0]["oldest"]
    )
    final = json.loads(progress.read_text())
    assert final["oldest"] is None and final["done"] == final["total"]


def test_the_probe_measures_a_rate_and_leaves_its_answers_in_the_cache(tmp_path: Path) -> None:
    """`lfbench plan --probe`: a few real requests, whose answers the run then finds in the
    response cache (counted as cached: never paid twice)."""
    from pipeline.llm.client import cache_key
    from pipeline.stages.plan import Plan, StagePlan, cached_answers, probe
    from pipeline.testing.server import TestServer

    stage = "long2rag-generate@slow"
    with TestServer(latency_ms=400, cwd=ROOT) as srv:
        ep = EndpointConfig(base_url=srv.base_url, model="m", max_concurrency=2, api_key_env=None)
        reqs = [
            ChatRequest(
                key=f"k{i}", messages=[{"role": "user", "content": f"q{i}"}], prompt_sha="p"
            )
            for i in range(3)
        ]
        row = StagePlan(stage, "generate", "long2rag", "slow", requests=10, probe=(ep, reqs))
        measured = StagePlan("x-generate@fast", "generate", "long2rag", "fast", requests=10)
        measured.time_basis, measured.probe = "measured rate of an earlier run", (ep, reqs)
        got = probe(tmp_path, Plan([stage], [row, measured], []))
        assert len(srv.log()) == 3  # the measured one is not probed
    assert set(got) == {"slow"}
    spr, sent = got["slow"]
    assert sent == 3 and 0.4 <= spr < 2.0  # two waves of 0.4 s, per wave
    keys = [cache_key(ep, r) for r in reqs]
    assert set(cached_answers(tmp_path, stage, keys)) == set(keys)
    assert "probe" not in row.row()  # the JSON rows stay plain


def test_a_new_progress_file_starts_its_counts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stages in one process (the tests; a Dask worker) each get their own sums: a batch
    left unfinished under one file does not show under the next."""
    from pipeline.llm.client import _PROGRESS_FILE

    monkeypatch.setenv("LFBENCH_PROGRESS_FILE", str(tmp_path / "a.json"))
    _PROGRESS_FILE.add(5)
    _PROGRESS_FILE.advance(True)
    monkeypatch.setenv("LFBENCH_PROGRESS_FILE", str(tmp_path / "b.json"))
    _PROGRESS_FILE.add(2)
    assert json.loads((tmp_path / "b.json").read_text())["done"] == 0
    assert json.loads((tmp_path / "b.json").read_text())["total"] == 2
    assert json.loads((tmp_path / "a.json").read_text())["total"] == 5
