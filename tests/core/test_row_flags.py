"""A row says when its numbers should not be read as they stand (issue 36, point 23): a base
model that copies its documents (median copy rate 0.93, Long²RAG KPR above the lead baseline's),
answers to prompts past the model's context window (word salad, SummHay Coverage 0), answers cut
short. The copy rate and the counts are in the row (metrics file), its MLflow run (metric
`copy_rate`, counter `n_over_context`, tag `lfbench.flags`), the report and `lfbench compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.benchmark import Run
from pipeline.core.markdown import results_table
from pipeline.core.records import Generation, Judgement, Usage
from pipeline.core.results import ItemScore, Metric, Scored, combine, score_rows
from pipeline.results.compare import render_text

MEAN = Metric("m", digits=None)


def _gen(item: str, system: str, **meta: Any) -> Generation:
    return Generation(
        benchmark="b", item_id=item, model=system, system=system, setting="x", status="ok",
        text="t", usage=Usage(input_tokens=10, output_tokens=2), meta=meta,
    )  # fmt: skip


def _run(system: str, gens: list[Generation]) -> Run:
    js = [Judgement.of("b", g, "j", "sha", "ok", []) for g in gens]
    return Run(system, "j", gens, js, [], [])


def _score(item: Any, g: Generation, j: Judgement) -> Any:
    return Scored([ItemScore(g.item_id, values={"m": 0.5})])


ITEMS = {f"i{k}": k for k in range(5)}


def _rows() -> Any:
    base = [_gen(f"i{k}", "base", copy_rate=r) for k, r in enumerate((0.9, 0.95, 0.93, 0.2, 0.99))]
    small = [
        _gen("i0", "small", copy_rate=0.1, over_context=True, context_tokens_used=16500),
        _gen("i1", "small", copy_rate=0.3, truncated=True, over_context=True),
        _gen("i2", "small", copy_rate=0.2),
    ]
    lead = [_gen(f"i{k}", "lead") for k in range(5)]  # a baseline: no copy rate recorded
    return score_rows("b", [MEAN], [_run("base", base), _run("small", small),
                                    _run("lead", lead)], ITEMS, _score)  # fmt: skip


def test_rows_carry_the_copy_rate_and_the_context_overflow() -> None:
    rows = {r.system: r for r in _rows().rows}
    base, small, lead = rows["base"].flat(), rows["small"].flat(), rows["lead"].flat()
    assert base["copy_rate"] == 0.93  # the median of 0.2, 0.9, 0.93, 0.95, 0.99
    assert base["flags"] == [
        "copied: the answers copy their context (median copy rate 0.93): a base model echoing"
        " its documents, not a summary"
    ]
    assert small["copy_rate"] == 0.2 and small["n_over_context"] == 2
    assert small["flags"] == [
        "over context: 2 of 3 prompts went past the model's context window (context_window):"
        " its answers to them can be nonsense",
        "truncated: 1 of 3 answers were cut (length or content filter)",
    ]
    assert lead["copy_rate"] is None and lead["flags"] == [] and lead["n_over_context"] == 0


def test_a_combined_row_pools_the_copy_rates() -> None:
    scoring = _rows()
    rows = [r for r in scoring.rows if r.system in ("base", "small")]
    row, _ = combine([MEAN], rows, [scoring.items[r.key] for r in rows], setting="all")
    # the median of all eight answers' rates, the counts summed
    assert row.copy_rate == 0.6 and row.counts.n_over_context == 2


def test_the_mlflow_run_the_report_and_compare_show_the_flags() -> None:
    from types import SimpleNamespace

    from pipeline.benchmarks._template.benchmark import Template
    from pipeline.core.aggregation import run_row
    from pipeline.core.markdown import flagged_rows

    rows = {r.system: r for r in _rows().rows}
    ctx: Any = SimpleNamespace(section=None)
    run = run_row(Template(), ctx, rows["base"], [])
    assert run.metrics["copy_rate"] == 0.93 and run.metrics["n_over_context"] == 0
    assert run.tags["lfbench.flags"].startswith("copied: the answers copy their context")
    quiet = run_row(Template(), ctx, rows["lead"], [])
    assert "copy_rate" not in quiet.metrics and "lfbench.flags" not in quiet.tags

    flat = [r.flat() for r in rows.values()]
    table = "\n".join(results_table([MEAN], flat))
    assert "| flags |" in table.splitlines()[0] + " |"
    assert "copied 0.93" in table and "over context, truncated" in table
    section = flagged_rows(flat)
    assert section[0] == "### Flagged rows" and len([s for s in section if s.startswith("- ")]) == 2

    res: dict[str, Any] = {
        "run_a": {"id": "a", "name": "lead / x / j", "flags": []},
        "run_b": {"id": "b", "name": "base / x / j", "flags": rows["base"].flags},
        "params": {}, "tags": {}, "metrics": {}, "note": "no item scores", "n_shared_items": 0,
        "n_items": [0, 0],
    }  # fmt: skip
    text = render_text(res)
    assert "  B flagged: copied: the answers copy their context (median copy rate 0.93)" in text
    assert "A flagged" not in text


def test_lfbench_report_marks_a_flagged_best_row(tmp_path: Path) -> None:
    from pipeline.results.report import headline

    rows = [
        {"system": "base", "judge": "j", "kpr": 0.205, "flags": ["copied: ..."], "copy_rate": 0.93},
        {"system": "lead", "judge": "j", "kpr": 0.184, "flags": []},
    ]
    text = "\n".join(headline("long2rag", "Long2RAG", rows, "kpr", {}, "metrics/long2rag.json"))
    assert "base: **0.205** (flagged: copied 0.93)" in text
    assert "lead: **0.184**" in text and "lead: **0.184** (flagged" not in text


def test_an_answer_past_the_context_window_is_marked(
    tmp_path: Path, haystack: dict[str, Any], write_haystack: Any
) -> None:
    """The generate stage marks an answer whose prompt and answer (the server's token counts)
    exceed the entry's context_window, and warns once."""
    import json

    from pipeline.testing.server import TestServer
    from tests.stages.helpers import ROOT, generate_tiny

    for d in haystack["documents"]:  # prompts of about 500 tokens by the server's count
        d["document_text"] = " ".join([d["document_text"]] * 100)
    path = write_haystack(haystack, "topic_news1.json")
    with TestServer(log_path=tmp_path / "s.log", cwd=ROOT) as srv:
        out = generate_tiny(srv.base_url, path.parent, tmp_path, context_window=256)
        gens = [json.loads(x) for x in out.read_text().splitlines()]
        (tmp_path / "w").mkdir()
        wide = generate_tiny(srv.base_url, path.parent, tmp_path / "w", context_window=100_000)
    used = [g["usage"]["input_tokens"] + g["usage"]["output_tokens"] for g in gens]
    assert all(u > 256 for u in used)
    assert all(g["meta"]["over_context"] is True for g in gens)
    assert [g["meta"]["context_tokens_used"] for g in gens] == used
    assert not any("over_context" in json.loads(x)["meta"] for x in wide.read_text().splitlines())
