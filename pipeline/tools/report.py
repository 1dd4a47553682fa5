"""`lfbench report`: one self-contained HTML page (plots inlined) and its markdown twin.

Reads whatever results exist: `metrics/<benchmark>.json` of every registered benchmark (each
benchmark renders its own section: its table layouts, cost, plots), `metrics/agreement.json`
(judge agreement) when present, plus the lineage that makes the numbers traceable: dataset and
data digests, image or runtime, git commit.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

from pipeline.core.errors import DataError
from pipeline.core.io import atomic_write_text, file_digest
from pipeline.core.lineage import dvc_file_md5, git_info
from pipeline.core.markdown import fmt, need, table


def _document(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON ({e})", file=str(path)) from e
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError('expected {"rows": [ {...}, ... ]}', file=str(path), field="rows")
    return dict(doc)


def lineage(root: Path, benchmarks: list[str]) -> dict[str, str]:
    git = git_info(root)
    image = root / "build" / "image.json"
    img: dict[str, Any] = json.loads(image.read_text()) if image.exists() else {}
    out = {
        "git commit": git.commit + (" (dirty)" if git.dirty else ""),
        "data digest (data.dvc md5)": dvc_file_md5(root / "data.dvc") or "unknown",
    }
    for name in benchmarks:
        ds = root / "datasets" / f"{name}.jsonl"
        out[f"dataset digest (datasets/{name}.jsonl md5)"] = file_digest(ds) if ds.exists() else "-"
    return out | {
        "image recipe (build/image.json)": str(img.get("tag", "-")),
        "image base": str(img.get("base_image", "-")),
        "requirements.lock sha256": str((img.get("files") or {}).get("requirements.lock", "-")),
    }


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
        need(r, ("judge", "reference"), where, n)
        cells = [r["judge"], r["reference"]]
        for c in cols:
            v = r.get(c)
            lo, hi = r.get(f"{c}_ci_low"), r.get(f"{c}_ci_high")
            cell = fmt(v, 3) if c != "n" else fmt(v)
            if lo is not None and hi is not None:
                cell += f" [{fmt(lo, 3)}, {fmt(hi, 3)}]"
            cells.append(cell)
        body.append(cells)
    out = ["## Judge agreement", "", f"From {where} (95% intervals in brackets).", ""]
    return out + table(["judge", "reference", *cols], body)


def build_markdown(root: Path) -> tuple[str, list[tuple[str, bytes]]]:
    from pipeline.core import registry

    metrics = root / "metrics"
    present = [b for b in registry.names() if (metrics / f"{b}.json").exists()]
    if not present:
        raise DataError(
            "no results of any benchmark: run `dvc repro` (or `dvc pull`) first",
            file=str(metrics / "<benchmark>.json"),
        )
    figs: list[tuple[str, bytes]] = []
    lines = ["# lfbench report", ""]
    lines += ["## Lineage", ""]
    lines += table(["what", "value"], [[k, f"`{v}`"] for k, v in lineage(root, present).items()])
    for name in present:
        bench = registry.get(name)
        where = f"metrics/{name}.json"
        section = bench.report_section(_document(root / where), where)
        lines += [f"## {bench.title or bench.name}", "", *section.lines]
        figs += section.figures
    if (metrics / "agreement.json").exists():
        lines += _agreement(_document(metrics / "agreement.json")["rows"])
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
