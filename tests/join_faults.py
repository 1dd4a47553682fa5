"""The four faults of the join that every benchmark meets the same way (pipeline/core/results.py):
an orphan, a duplicate or a missing judgement, and a generation of an unknown item."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.core.benchmark import Run
from pipeline.core.records import Generation, Judgement

FAULTS = ("orphan", "duplicate", "missing", "unknown item")


def faulty_run(
    fault: str, gens: Sequence[Generation], js: Sequence[Judgement], unknown_item: str
) -> tuple[Run, str]:
    """A run of three judged generations with `fault` injected, read from `generations/m.jsonl`
    and `judgements/m/j.jsonl`, and the file:line its error must name."""
    gens, js = list(gens), list(js)
    if fault == "orphan":
        js = [*js, js[0].model_copy(update={"generation_id": "nope|x|y|0"})]
    elif fault == "duplicate":
        js = [*js, js[1]]
    elif fault == "missing":
        js = js[1:]
    else:
        gens = [*gens, gens[0].model_copy(update={"item_id": unknown_item})]
    gl = [f"generations/m.jsonl:{n}" for n in range(1, len(gens) + 1)]
    jl = [f"judgements/m/j.jsonl:{n}" for n in range(1, len(js) + 1)]
    where = {
        "orphan": "judgements/m/j.jsonl:4",
        "duplicate": "judgements/m/j.jsonl:4",
        "missing": "generations/m.jsonl:1",
        "unknown item": "generations/m.jsonl:4",
    }[fault]
    return Run("m", "j", gens, js, gl, jl), where
