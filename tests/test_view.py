"""What the live view of `lfbench repro --jobs N` shows (issue 42, points 6a and 6d): as running
only the stages holding one of the slots (a stage submitted beyond them is queued: the view said
"running 5" under `--jobs 3`), and no DVC warning of a JSONL output of no records."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pipeline.runner.driver import Repro, StageState
from pipeline.runner.view import LiveView
from tests.conftest import run
from tests.test_parallel import toy


class Recorder:
    """A view that keeps every title the live view would show."""

    def __init__(self) -> None:
        self.view = LiveView(stream=io.StringIO(), live=True)
        self.titles: list[str] = []

    def update(self, states: Mapping[str, StageState], final: bool = False) -> None:
        out = io.StringIO()
        Console(file=out, width=200).print(self.view._table(states))
        self.titles.append(out.getvalue().splitlines()[0])


def _count(title: str, what: str) -> int:
    m = re.search(rf"\b{what} (\d+)", title)
    return int(m.group(1)) if m else 0


def test_the_live_view_counts_as_running_only_stages_holding_a_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stage(name: str) -> dict[str, Any]:
        out = f"out/{name}.json"
        return {"cmd": f"python step.py {name} {out}", "deps": ["step.py"], "outs": [out]}

    names = ["a", "b", "c", "d", "e"]
    ws = toy(tmp_path / "ws", {"stages": {n: stage(n) for n in names}})
    monkeypatch.chdir(ws)
    rec = Recorder()
    result = Repro(ws, jobs=3, view=rec).run()
    assert result.ok
    running = [_count(t, "running") for t in rec.titles]
    assert max(running) >= 1
    assert max(running) <= 3, rec.titles  # never more than --jobs
    assert any(_count(t, "queued") for t in rec.titles), rec.titles  # 5 stages, 3 slots


def test_dvc_does_not_warn_of_a_jsonl_output_of_no_records(tmp_path: Path) -> None:
    """A judge stage of a pair not judged by choice writes an empty judgements file; DVC warned
    "'judgements/...jsonl' is empty." into the live view (issue 42, point 6d). Any other empty
    output is still warned of."""
    write = "python -c \"import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('')\""
    pipeline = {
        "stages": {
            "none": {"cmd": f"{write} none.jsonl", "outs": ["none.jsonl"]},
            "blank": {"cmd": f"{write} blank.txt", "outs": ["blank.txt"]},
        }
    }
    ws = toy(tmp_path / "ws", pipeline)
    proc = run(["lfbench", "repro", "--jobs", "2"], ws)
    assert "2 done" in proc.stderr, proc.stderr
    assert "'none.jsonl' is empty" not in proc.stderr, proc.stderr
    assert "'blank.txt' is empty" in proc.stderr, proc.stderr
