"""`lfbench report`: one self-contained HTML page (plots inlined) and its markdown twin.

Reads whatever results exist: metrics/summhay.json always (the paper's table layouts with this
project's numbers, cost, plots), metrics/agreement.json (judge agreement) and
metrics/long2rag.json (Key Point Recall) when present, plus the lineage that makes the numbers
traceable: dataset and data digests, judges, image or runtime, git commit.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline import plots
from pipeline.errors import DataError
from pipeline.io import atomic_write_text, file_digest
from pipeline.lineage import dvc_file_md5, git_info


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON ({e})", file=str(path)) from e
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError('expected {"rows": [ {...}, ... ]}', file=str(path), field="rows")
    return rows


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _table(head: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return [*out, ""]


def _need(row: Mapping[str, Any], keys: Sequence[str], where: str, n: int) -> None:
    for k in keys:
        if k not in row:
            raise DataError("row without this field", file=where, item=f"row {n}", field=k)


def lineage(root: Path) -> dict[str, str]:
    git = git_info(root)
    image = root / "build" / "image.json"
    img: dict[str, Any] = json.loads(image.read_text()) if image.exists() else {}
    ds = root / "datasets" / "summhay.jsonl"
    return {
        "git commit": git.commit + (" (dirty)" if git.dirty else ""),
        "data digest (data.dvc md5)": dvc_file_md5(root / "data.dvc") or "unknown",
        "dataset digest (datasets/summhay.jsonl md5)": file_digest(ds) if ds.exists() else "-",
        "runtime": str(img.get("runtime", "unknown")),
        "image": str(img.get("image_id") or "none (local runtime)"),
        "requirements.lock sha256": str(img.get("lock_sha256", "-")),
    }


def _summhay(root: Path, rows: list[dict[str, Any]], figs: list[tuple[str, bytes]]) -> list[str]:
    from pipeline.benchmarks.summhay.aggregate import ROW_KEYS
    from pipeline.benchmarks.summhay.report import render

    where = "metrics/summhay.json"
    for n, r in enumerate(rows, 1):
        _need(r, ROW_KEYS, where, n)
    body = render(rows, f"{len(rows)} result rows from {where}.")
    # demote the benchmark report's headings one level under this report's section
    out = ["## SummHay", ""]
    out += [("#" + x if x.startswith("#") else x) for x in body.splitlines()[1:]]
    out.append("")
    judges = sorted({(r["judge"], r["model"]) for r in rows})
    cost: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in rows:
        if r["mode"] != rows[0]["mode"]:
            continue  # one scoring mode: the same calls would be counted twice
        c = cost[(r["model"], r["judge"])]
        c[0] += float(r.get("input_tokens") or 0)
        c[1] += float(r.get("output_tokens") or 0)
        c[2] += float(r.get("cost_usd") or 0.0)
    out += ["### Cost (generation + judging, per model entry and judge)", ""]
    out += _table(
        ["model entry", "judge", "input tokens", "output tokens", "USD"],
        [[m, j, int(c[0]), int(c[1]), f"{c[2]:.4f}"] for (m, j), c in sorted(cost.items())],
    )
    out.append(f"Judges: {', '.join(sorted({j for j, _ in judges}))}.")
    out.append("")
    views: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        views[(r["domain"], r["judge"], r["mode"])].append(r)
    for (domain, judge, mode), vrows in sorted(views.items()):
        png = plots.position_sensitivity(
            vrows, f"SummHay position sensitivity ({domain}, {judge}, {mode})"
        )
        if png is not None:
            figs.append((f"Position sensitivity, {domain} / {judge} / {mode}", png))
        best = max(
            (r for r in vrows if r["joint"] is not None),
            key=lambda r: float(r["joint"]),
            default=None,
        )
        if best is not None:
            sys_rows = [r for r in vrows if r["system"] == best["system"]]
            title = f"SummHay {best['system']} ({domain}, judge {judge}, {mode})"
            figs.append(
                (
                    f"Joint by setting, best system {best['system']}",
                    plots.joint_by_setting(sys_rows, title),
                )
            )
    return out


def _agreement(rows: list[dict[str, Any]]) -> list[str]:
    where = "metrics/agreement.json"
    cols = (
        "n",
        "pearson",
        "linking_accuracy",
        "cohen_kappa",
        "cohen_kappa_linear",
        "exact_agreement",
    )
    body = []
    for n, r in enumerate(rows, 1):
        _need(r, ("judge", "reference"), where, n)
        cells = [r["judge"], r["reference"]]
        for c in cols:
            v = r.get(c)
            lo, hi = r.get(f"{c}_ci_low"), r.get(f"{c}_ci_high")
            cell = _fmt(v, 3) if c != "n" else _fmt(v)
            if lo is not None and hi is not None:
                cell += f" [{_fmt(lo, 3)}, {_fmt(hi, 3)}]"
            cells.append(cell)
        body.append(cells)
    out = ["## Judge agreement", "", f"From {where} (95% intervals in brackets).", ""]
    return out + _table(["judge", "reference", *cols], body)


def _long2rag(rows: list[dict[str, Any]], figs: list[tuple[str, bytes]]) -> list[str]:
    where = "metrics/long2rag.json"
    body = []
    for n, r in enumerate(rows, 1):
        _need(r, ("system", "setting", "judge", "kpr"), where, n)
        body.append(
            [
                r["system"],
                r["setting"],
                r["judge"],
                _fmt(r["kpr"], 3),
                _fmt(r.get("n_questions")),
                _fmt(r.get("n_key_points")),
            ]
        )
    out = ["## Long²RAG", "", f"Key Point Recall from {where}.", ""]
    out += _table(["system", "setting", "judge", "KPR", "questions", "key points"], body)
    try:
        figs.append(("Long²RAG KPR by domain and category", plots.kpr_breakdown(rows)))
    except ValueError as e:  # rows without breakdowns: the table stands alone
        out += [f"(no breakdown plot: {e})", ""]
    return out


def build_markdown(root: Path) -> tuple[str, list[tuple[str, bytes]]]:
    metrics = root / "metrics"
    summhay = metrics / "summhay.json"
    if not summhay.exists():
        raise DataError(
            "no SummHay results: run `dvc repro` (or `dvc pull`) first", file=str(summhay)
        )
    figs: list[tuple[str, bytes]] = []
    lines = ["# lfbench report", ""]
    lines += ["## Lineage", ""]
    lines += _table(["what", "value"], [[k, f"`{v}`"] for k, v in lineage(root).items()])
    lines += _summhay(root, _rows(summhay), figs)
    if (metrics / "agreement.json").exists():
        lines += _agreement(_rows(metrics / "agreement.json"))
    if (metrics / "long2rag.json").exists():
        lines += _long2rag(_rows(metrics / "long2rag.json"), figs)
    return "\n".join(lines).rstrip() + "\n", figs


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    t = html.escape(text, quote=False)
    t = _CODE.sub(r"<code>\1</code>", t)
    return _BOLD.sub(r"<b>\1</b>", t)


def md_to_html(md: str) -> str:
    """The markdown this module writes (headings, pipe tables, paragraphs) as HTML."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in block[0]) + "</tr>")
            for row in block[2:]:
                out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>")
            out.append("</table>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    "th{background:#f2f2f2}code{font-size:12px}img{max-width:100%}"
)


def build_report(root: Path, out_dir: Path, params_path: Path | None = None) -> tuple[Path, Path]:
    md, figs = build_markdown(root)
    out_dir = out_dir if out_dir.is_absolute() else root / out_dir
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    fig_md = ["## Plots", ""]
    fig_html = ["<h2>Plots</h2>"]
    for n, (caption, png) in enumerate(figs, 1):
        name = f"report-fig{n}.png"
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_bytes(png)
        fig_md += [f"![{caption}]({name})", ""]
        b64 = base64.b64encode(png).decode()
        fig_html.append(
            f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    atomic_write_text(md_path, md + "\n" + "\n".join(fig_md).rstrip() + "\n")
    page = (
        '<!doctype html><html><head><meta charset="utf-8"><title>lfbench report</title>'
        f"<style>{_CSS}</style></head><body>\n{md_to_html(md)}\n"
        + "\n".join(fig_html)
        + "\n</body></html>\n"
    )
    atomic_write_text(html_path, page)
    for p in (md_path, html_path):
        p.chmod(0o644)  # a report is for sharing
    return html_path, md_path
