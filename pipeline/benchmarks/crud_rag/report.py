"""CRUD-RAG's own part of its report (`reports/crud_rag.md`, after the results table every
benchmark gets): the knob study as the paper's Tables 3-7 (one block per knob, the base row in
each), and its plot (`reports/crud_rag.png`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.benchmarks.crud_rag.params import CrudParams
from pipeline.benchmarks.crud_rag.schema import Item
from pipeline.core.drawing import Plot
from pipeline.core.markdown import fmt, table

PLOT = "crud_rag.png"
KNOB_ORDER = ("chunk_size", "chunk_overlap", "retriever", "top_k")
KNOB_TITLE = {
    "chunk_size": "chunk size (top-k co-varied)",
    "chunk_overlap": "chunk overlap (%)",
    "retriever": "retriever",
    "top_k": "top-k",
}


def _value(row: Mapping[str, Any], knob: str) -> str:
    if knob == "chunk_size":
        return f"{row['chunk_size']} / {row['top_k']}"
    return str(row[knob])


def _counts(row: Mapping[str, Any]) -> list[Any]:
    """Scored, invalid and failed (the generation or its judgement) items of a row."""
    return [row["n_scored"], row["n_invalid"],
            row["n_failed_generations"] + row["n_failed_judgements"]]  # fmt: skip


def knob_blocks(rows: Sequence[Mapping[str, Any]], metric_cols: Sequence[str]) -> list[str]:
    """One table per (task, system, judge) and knob: the knob's values, the base among them."""
    lines: list[str] = []
    groups = list(dict.fromkeys((r["task"], r["system"], r["judge"]) for r in rows))
    for task, system, judge in groups:
        mine = [r for r in rows if (r["task"], r["system"], r["judge"]) == (task, system, judge)]
        base = next((r for r in mine if r["knob"] == "base"), None)
        oracle = next((r for r in mine if r["setting"] == "oracle"), None)
        lines += [f"### {task}: {system}, judge {judge}", ""]
        head = ["knob", "value", *metric_cols, "scored", "invalid", "failed"]
        body = []
        for knob in KNOB_ORDER:
            varied = [r for r in mine if r["knob"] == knob]
            if base is not None:
                varied.append(base)
            varied.sort(key=lambda r: r[knob] if knob != "retriever" else str(r[knob]))
            for r in varied:
                label = _value(r, knob) + (" (base)" if r is base else "")
                body.append([KNOB_TITLE[knob], label, *(fmt(r.get(c), 2) for c in metric_cols),
                             *_counts(r)])  # fmt: skip
        if oracle is not None:
            values = [fmt(oracle.get(c), 2) for c in metric_cols]
            body.append(["oracle context", "the record's news text", *values, *_counts(oracle)])
        lines += table(head, body)
    return lines


def knob_cols(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cols = []
    if any(r.get("judge_kind") == "text" for r in rows):
        cols += ["bleu", "bleu_bp", "rouge_l"]
        if any(r.get("embedding_sim") is not None for r in rows):
            cols.append("embedding_sim")
        cols.append("length")
    if any(r.get("judge_kind") == "ragquesteval" for r in rows):
        cols += ["precision", "recall"]
    return cols


def figure_plot(rows: Sequence[Mapping[str, Any]]) -> Plot | None:
    """The knob-study figure, drawn when it is needed (None: no text-judge row to draw)."""
    if not any(r.get("judge_kind") == "text" and r.get("bleu") is not None for r in rows):
        return None
    return Plot(figure_png, ([dict(r) for r in rows],))


def figure_png(rows: Sequence[Mapping[str, Any]]) -> bytes:
    drawn = figure(rows)
    if drawn is None:
        raise ValueError("the knob-study figure: no text-judge row")
    return drawn


def figure(rows: Sequence[Mapping[str, Any]]) -> bytes | None:
    """BLEU and ROUGE-L along each knob, one line per (system, judge) of the text judge."""
    from pipeline.plots import plt, png, style

    text = [r for r in rows if r.get("judge_kind") == "text" and r.get("bleu") is not None]
    if not text:
        return None
    style()
    fig, axes = plt.subplots(2, 4, figsize=(15.0, 6.0), sharey="row")
    systems = list(dict.fromkeys((r["task"], r["system"]) for r in text))
    for col, knob in enumerate(KNOB_ORDER):
        labels: list[str] = []
        for n, (task, system) in enumerate(systems):
            mine = [r for r in text if (r["task"], r["system"]) == (task, system)]
            base = [r for r in mine if r["knob"] == "base"]
            pts = sorted(
                [r for r in mine if r["knob"] == knob] + base,
                key=lambda r: r["chunk_size"] if knob == "chunk_size" else str(r[knob]).zfill(4),
            )
            xs = [str(_value(r, knob)) for r in pts]
            labels += [x for x in xs if x not in labels]
            at = [labels.index(x) for x in xs]
            for row_i, metric in enumerate(("bleu", "rouge_l")):
                axes[row_i][col].plot(at, [r[metric] for r in pts], marker="o", color=f"C{n % 10}",
                                      label=f"{system} ({task})")  # fmt: skip
        for row_i in (0, 1):
            axes[row_i][col].set_xticks(range(len(labels)), labels)
        axes[0][col].set_title(KNOB_TITLE[knob])
        axes[1][col].set_xlabel(KNOB_TITLE[knob])
    axes[0][0].set_ylabel("BLEU (no BP) x100")
    axes[1][0].set_ylabel("ROUGE-L x100")
    axes[0][3].legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return png(fig)


def render(
    cx: CrudParams, dataset: Sequence[Item], rows: Sequence[Mapping[str, Any]], source: str
) -> tuple[list[str], dict[str, bytes]]:
    """The report's lines after the results table, and its figure."""
    tasks = ", ".join(f"{t} ({sum(1 for i in dataset if i.task == t)})" for t in cx.tasks)
    subset = (
        " The available subset: the first"
        f" {len(dataset)} of the 1,328 complete event-summarisation records released with the"
        " paper's code (the benchmark file itself is not public here); the retrieval corpus is"
        " every released record's news text, so a record's own article can be retrieved (the"
        " paper's corpus had it removed): not the paper's setting, and the numbers are not"
        " comparable with its tables."
        if source.startswith("released")
        else ""
    )
    b = cx.grid.base
    lines = [
        f"Items: {tasks}; source {source}.{subset} Base setting: chunk {b.chunk_size} cl100k"
        f" tokens, overlap {b.chunk_overlap}%, {b.retriever}, top-{b.top_k}; one knob varied at"
        " a time (the paper's base retriever is dense bge-base-zh; the only local encoder is"
        " the English MiniLM, so the offline base is bm25). Metrics x100: BLEU on jieba tokens"
        " as the authors report it (without the brevity penalty) and with it, ROUGE-L"
        " F-measure, embedding similarity (cosine of output and reference; its model below),"
        " RAGQuestEval precision and recall; length in characters. Items a metric"
        " cannot score are left out and counted (invalid), never 0. Generated by lfbench; see"
        " metrics/crud_rag.json.",
        "",
        "## The knob study",
        "",
        *knob_blocks(rows, knob_cols(rows)),
    ]
    embedders = sorted({str(r["embedding_model"]) for r in rows if r.get("embedding_model")})
    if embedders:
        lines += [f"Embedding similarity: {', '.join(embedders)}.", ""]
    figures = {}
    plot = figure_plot(rows)
    if plot is not None:
        figures[PLOT] = plot.png()
        lines += [f"![the knob study]({PLOT})", ""]
    return lines, figures
