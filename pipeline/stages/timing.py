"""How fast a judge judged: run state a stage records beside the cache, never in a metrics file.

A stage that runs a judge (the agreement stage, a judge stage) measures the wall time of its
judging and writes `.lfbench/timing/<stage>.json`: per judge the judgements made, the seconds,
judgements per second and what the clock covered. `lfbench report` joins it to the judge cards
(pipeline/core/cards.py); the agreement stage logs it on the judge's MLflow run. A metrics file
is the same bytes wherever it is re-made; wall time is not, so it stays out of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.core.errors import DataError
from pipeline.core.io import read_json, write_json


class Throughput(BaseModel):
    """How fast one judge judged, in one run of one stage (run state)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judge: str
    stage: str
    n_judgements: int
    wall_s: float
    judgements_per_second: float | None
    measures: str


def per_second(n_judgements: int, wall_s: float | None) -> float | None:
    """Judgements per second of measured wall time (None when nothing was timed)."""
    if wall_s is None or wall_s <= 0 or n_judgements == 0:
        return None
    return n_judgements / wall_s


def throughput(
    judge: str, stage: str, n_judgements: int, wall_s: float, measures: str
) -> Throughput:
    return Throughput(
        judge=judge,
        stage=stage,
        n_judgements=n_judgements,
        wall_s=wall_s,
        judgements_per_second=per_second(n_judgements, wall_s),
        measures=measures,
    )


def timing_path(root: Path, stage: str) -> Path:
    safe = stage.replace("@", "_").replace("/", "_")
    return root / ".lfbench" / "timing" / f"{safe}.json"


def write_throughput(root: Path, stage: str, entries: Sequence[Throughput]) -> Path:
    """The judges' throughput of one stage run (replaces that stage's earlier record)."""
    path = timing_path(root, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"stage": stage, "judges": [e.model_dump() for e in entries]})
    return path


def read_throughput(root: Path, stage: str) -> dict[str, Throughput]:
    """judge -> its throughput in the last run of `stage` here; {} when it did not run here.
    A malformed record is a DataError naming the file and the field."""
    path = timing_path(root, stage)
    if not path.exists():
        return {}
    raw = read_json(path)
    out = {}
    for n, entry in enumerate(raw.get("judges", []) if isinstance(raw, dict) else [None]):
        try:
            t = Throughput.model_validate(entry)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(x) for x in err["loc"])
            raise DataError(err["msg"], file=str(path), item=f"judges[{n}]", field=field) from e
        out[t.judge] = t
    return out
