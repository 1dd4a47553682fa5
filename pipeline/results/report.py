"""`lfbench report`: one self-contained HTML page (plots inlined) and its markdown twin.

Reads whatever results exist: `metrics/<benchmark>.json` of every registered benchmark and
`metrics/agreement.json` (judge agreement) when present. In this order: a headline (per
benchmark, the best rows by its main metric within each comparable group, with intervals where
the rows carry them, the judge and its kappa against people), each benchmark's own section (its
table layouts, cost, plots), judge agreement, the judge cards (pipeline/core/cards.py, with
each judge's throughput where a stage of this clone timed it), and last the lineage that makes
the numbers traceable: dataset and data digests, image or runtime, git commit.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.core import aggregation
from pipeline.core.errors import DataError, LfbenchError
from pipeline.core.io import atomic_write_text, file_digest
from pipeline.core.lineage import dvc_file_md5, git_info
from pipeline.core.markdown import flag_cell, flagged_rows, fmt, need, table


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


def _audits(root: Path, kappa: dict[tuple[str, str], str]) -> list[str]:
    """People's audits of a judge on single runs (`lfbench audit score`, audits/*.score.json),
    beside the judge's kappa against people measured once (metrics/agreement.json)."""
    from pipeline.results.audit import scores

    try:
        found = scores(root)
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"an audit result cannot be read ({e})", file="audits/") from e
    models = _model_names(root)
    audited = [_audited_model(root, r) for r in found]
    gone = sorted({m for m in audited if m is not None and models is not None and m not in models})
    found = [r for r in found if _audited_model(root, r) not in gone]
    if not found and not gone:
        return []

    def ci(r: dict[str, Any], name: str, nd: int) -> str:
        value = fmt(r.get(name), nd)
        lo, hi = r.get(f"{name}_ci_low"), r.get(f"{name}_ci_high")
        return value if lo is None or hi is None else f"{value} [{fmt(lo, nd)}, {fmt(hi, nd)}]"

    body = []
    for r in found:
        metric = r.get("metric", "")
        body.append(
            [
                r.get("benchmark", ""),
                r.get("run_name", ""),
                r.get("judge", ""),
                int(r.get("audit.n") or 0),
                ci(r, "audit.kappa", 2),
                kappa.get((r.get("benchmark", ""), r.get("judge", "")))
                or kappa.get(("", r.get("judge", "")))
                or "-",
                metric,
                fmt(r.get("audit.judge_mean"), 1),
                ci(r, f"audit.{metric}_ppi", 1),
                ci(r, "audit.human_mean", 1),
                r.get("labels", ""),
            ]
        )
    head = ["benchmark", "run", "judge", "n", "audit kappa [95% CI]", "judge kappa vs people",
            "metric", "judge", "corrected [95% CI]", "people alone [95% CI]", "labels"]  # fmt: skip
    return [
        "## Audits by people, per run",
        "",
        "`lfbench audit`: people's labels on a sample of one run's verdicts (or the labels"
        " released with the benchmark, on other outputs of the same system and setting). Audit"
        " kappa: the judge against them on those verdicts, beside its kappa against people"
        " measured once (metrics/agreement.json). Corrected: the prediction-powered estimate of"
        " the run's metric (lambda times the judge's mean on every verdict, plus the mean of"
        " person minus lambda times judge on the labelled ones; lambda in [0, 1], chosen on the"
        " labels, is never worse than the labels alone); people alone: the same labels without"
        " the judge.",
        "",
        *(table(head, body) if body else []),
        *(
            [
                "",
                f"Not listed: the audits of {', '.join(gone)}, no longer in params.yaml's"
                " models (their files stay in audits/).",
            ]
            if gone
            else []
        ),
        "",
    ]


def _model_names(root: Path) -> set[str] | None:
    """The `models` entries of params.yaml (None: no params.yaml, or none readable)."""
    from pipeline.core.config import load_yaml

    try:
        data = load_yaml(root / "params.yaml")
    except (OSError, LfbenchError, ValueError):
        return None
    models = data.get("models") if isinstance(data, dict) else None
    return set(models) if isinstance(models, dict) else None


def _audited_model(root: Path, r: dict[str, Any]) -> str | None:
    """The model entry an audit result is of: its own `model`, or (a result written before it
    said so) its sample's, audits/<sample>.json; None when neither says."""
    if r.get("model"):
        return str(r["model"])
    sample = root / "audits" / f"{r.get('sample', '')}.json"
    try:
        doc = json.loads(sample.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    return str(model) if model else None


def human_kappa(rows: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Each judge's Cohen's kappa against people (agreement rows with reference "human"), by
    (benchmark, judge) ("" for a row that names no benchmark), formatted with its interval."""
    found: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.get("reference") != "human" or r.get("cohen_kappa") is None:
            continue
        k = fmt(float(r["cohen_kappa"]), 2)
        lo, hi = r.get("cohen_kappa_ci_low"), r.get("cohen_kappa_ci_high")
        if lo is not None and hi is not None:
            k += f" [{fmt(float(lo), 2)}, {fmt(float(hi), 2)}]"
        cells = found.setdefault((str(r.get("benchmark", "")), str(r["judge"])), [])
        if k not in cells:
            cells.append(k)
    return {key: "; ".join(v) for key, v in found.items()}


# Keys a row is compared within (a ranking never mixes two judges, domains, cut-offs...), and
# keys that name what is ranked. Until the benchmarks declare their group keys.
GROUP_KEYS = ("task", "domain", "collection", "mode", "cutoff", "judge")
LABEL_KEYS = ("system", "retriever", "setting", "knob")
TOP = 3  # rows shown per group
MAX_GROUPS = 8  # groups shown per benchmark (the largest first); the rest in the details


def _natural(value: str) -> tuple[tuple[int, float | str], ...]:
    """Sort key with numbers compared as numbers (`25k` before `100k`)."""
    parts = re.split(r"(\d+(?:\.\d+)?)", value)
    return tuple((0, float(p)) if n % 2 else (1, p) for n, p in enumerate(parts) if p)


def _label_keys(groups: list[list[dict[str, Any]]], candidates: Sequence[str]) -> list[str]:
    """The label keys that tell a group's rows apart: one is kept when, in some group, it varies
    and is not already determined by the keys kept before it (CRUX's setting `bm25@10` is its
    retriever's within a cut-off)."""

    def needed(key: str, given: list[str]) -> bool:
        for rows in groups:
            seen: dict[tuple[str, ...], set[str]] = {}
            for r in rows:
                seen.setdefault(tuple(str(r.get(k)) for k in given), set()).add(str(r.get(key)))
            if any(len(v) > 1 for v in seen.values()):
                return True
        return False

    kept: list[str] = []
    for key in candidates:
        if needed(key, kept):
            kept.append(key)
    # then drop a key the others determine (CRUD-RAG's retriever is in its setting's name)
    for key in list(kept):
        if not needed(key, [k for k in kept if k != key]):
            kept.remove(key)
    return kept or ["system"]


def headline(
    name: str,
    title: str,
    rows: list[dict[str, Any]],
    metric: str,
    kappa: dict[tuple[str, str], str],
    where: str,
    higher_is_better: bool = True,
    group_keys: Sequence[str] = GROUP_KEYS,
    label_keys: Sequence[str] = LABEL_KEYS,
) -> list[str]:
    """One benchmark's lines of the headline: per comparable group (the `group_keys` its rows
    hold and that vary, the judge always), the best `TOP` rows by its main metric, named by the
    `label_keys` that tell them apart, with their interval where the rows carry one
    (`<metric>_ci_low`, `<metric>_ci_high`), the judge and its kappa against people where
    measured. A row without a value of the metric is counted, not ranked."""
    for n, r in enumerate(rows, 1):
        need(r, ("system", "judge", metric), where, n)
    scored = [r for r in rows if isinstance(r[metric], int | float) and r[metric] == r[metric]]
    present = [k for k in group_keys if k != "judge" and any(k in r for r in rows)]
    varying = [k for k in present if len({str(r.get(k)) for r in rows}) > 1] + ["judge"]
    fixed = [f"{k} `{rows[0].get(k)}`" for k in present if k not in varying]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in scored:
        groups.setdefault(tuple(str(r.get(k, "-")) for k in varying), []).append(r)
    order = sorted(groups, key=lambda g: (-len(groups[g]), [_natural(v) for v in g]))
    hidden, order = order[MAX_GROUPS:], order[:MAX_GROUPS]
    labels = _label_keys(list(groups.values()), label_keys)
    nd = 3 if all(abs(float(r[metric])) <= 1 for r in scored) else 1
    sign = -1.0 if higher_is_better else 1.0

    def entry(r: dict[str, Any]) -> str:
        label = " / ".join(fmt(r.get(k)) for k in labels)
        text = f"{label}: **{fmt(float(r[metric]), nd)}**"
        lo, hi = r.get(f"{metric}_ci_low"), r.get(f"{metric}_ci_high")
        if lo is not None and hi is not None:
            text += f" [{fmt(float(lo), nd)}, {fmt(float(hi), nd)}]"
        if r.get("flags"):  # e.g. a base model's copied answers ranked above the baselines
            text += f" (flagged: {flag_cell(r)})"
        return text

    body = []
    for g in order:
        ranked = sorted(
            groups[g],
            key=lambda r: (sign * float(r[metric]), [_natural(str(r.get(k))) for k in labels]),
        )
        cells = [entry(r) for r in ranked[:TOP]]
        judge = g[varying.index("judge")]
        body.append(
            [
                *(v for k, v in zip(varying, g, strict=True) if k != "judge"),
                judge,
                kappa.get((name, judge)) or kappa.get(("", judge)) or "-",
                *cells,
                *([""] * (TOP - len(cells))),
                len(groups[g]),
            ]
        )
    ranks = ["1st", "2nd", "3rd"] + [f"{n}th" for n in range(4, TOP + 1)]
    head = [*(k for k in varying if k != "judge"), "judge", "judge kappa vs people",
            *ranks[:TOP], "rows"]  # fmt: skip
    best = "higher" if higher_is_better else "lower"
    out = [
        f"### {title}: `{metric}`",
        "",
        f"Ranked by `{metric}` ({best} is better), {' / '.join(labels)} in each cell;"
        f" {len(scored)} rows of {where}"
        + (f", all with {', '.join(fixed)}" if fixed else "")
        + ".",
        "",
    ]
    if len(scored) < len(rows):
        k = len(rows) - len(scored)
        out += [f"Not ranked, without a `{metric}` value: {k} row{'s' if k > 1 else ''}.", ""]
    out += table(head, body)
    if hidden:
        keys = ", ".join(k for k in varying)
        out += [
            f"{len(hidden)} more groups ({keys}) of {sum(len(groups[g]) for g in hidden)} rows:"
            f" see {title} below.",
            "",
        ]
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
    named = any("benchmark" in r for r in rows)
    body = []
    for n, r in enumerate(rows, 1):
        need(r, ("judge", "reference"), where, n)
        cells = [*([fmt(r.get("benchmark"))] if named else []), r["judge"], r["reference"]]
        for c in cols:
            v = r.get(c)
            lo, hi = r.get(f"{c}_ci_low"), r.get(f"{c}_ci_high")
            cell = fmt(v, 3) if c != "n" else fmt(v)
            if lo is not None and hi is not None:
                cell += f" [{fmt(lo, 3)}, {fmt(hi, 3)}]"
            cells.append(cell)
        body.append(cells)
    out = ["## Judge agreement", "", f"From {where} (95% intervals in brackets).", ""]
    return out + table([*(["benchmark"] if named else []), "judge", "reference", *cols], body)


def _cards(root: Path, sources: Sequence[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
    """One table of every judge card (pipeline/core/cards.py) in the agreement rows of
    metrics/agreement.json and of each benchmark's metrics file, with each judge's throughput
    where a stage of this clone timed it (run state in .lfbench/timing)."""
    from pydantic import ValidationError

    from pipeline.core.cards import JudgeCard
    from pipeline.stages.common import judge_stage
    from pipeline.stages.timing import read_throughput

    body = []
    timed: list[str] = []
    for where, bench, rows in sources:
        for n, r in enumerate(rows, 1):
            if r.get("card") is None:
                continue
            try:
                c = JudgeCard.model_validate(r["card"])
            except ValidationError as e:
                err = e.errors()[0]
                field = "card." + ".".join(str(x) for x in err["loc"])
                raise DataError(err["msg"], file=where, item=f"row {n}", field=field) from e
            name = str(r.get("benchmark", bench))
            stage = c.throughput_stage
            if stage is None and r.get("model") is not None:
                stage = judge_stage(name, str(r["model"]), c.judge)
            speed = read_throughput(root, stage).get(c.judge) if stage else None
            kappa = fmt(c.kappa, 3)
            if c.kappa_ci_low is not None and c.kappa_ci_high is not None:
                kappa += f" [{fmt(c.kappa_ci_low, 3)}, {fmt(c.kappa_ci_high, 3)}]"
            if c.cost_status == "unknown":
                cost = f"unknown ({c.cost_note})"
            else:
                cost = f"${c.cost_per_1000:.4f}" if c.cost_per_1000 is not None else "-"
            rate = "-"
            if speed is not None and speed.judgements_per_second is not None:
                rate = f"{speed.judgements_per_second:.1f}"
                timed.append(
                    f"- {name} / {c.judge}: {speed.n_judgements} judgements in"
                    f" {speed.wall_s:.1f} s ({speed.stage}): {speed.measures}."
                )
            ref = c.reference + (f" on {r['model']}" if r.get("model") is not None else "")
            body.append(
                [
                    name,
                    c.judge,
                    ref,
                    c.unit,
                    fmt(c.n),
                    kappa,
                    fmt(c.pearson, 3),
                    "-" if c.linking_accuracy is None else f"{fmt(c.linking_accuracy, 1)}",
                    cost,
                    rate,
                ]
            )
    if not body:
        return []
    head = [
        "benchmark",
        "judge",
        "against",
        "one judgement",
        "n",
        "kappa [95% CI]",
        "Pearson",
        "linking accuracy (%)",
        "$ per 1,000 judgements",
        "judgements/s",
    ]
    out = [
        "## Judge cards",
        "",
        "Each judge against people: Cohen's kappa with its 95% bootstrap interval over the"
        " judged units, Pearson of the scores, linking accuracy where the judge names the"
        " evidence, the recorded cost per 1,000 judgements (0 for a judge that calls no paid"
        " model; unknown when usage was not recorded) and judgements per second of wall time"
        " where a stage of this clone timed the judge (run state, not in the metrics files;"
        " - when it did not run here).",
        "",
        *table(head, body),
    ]
    if timed:
        out += ["What the clock covered:", "", *timed, ""]
    return out


def build_markdown(root: Path) -> tuple[str, list[tuple[str, bytes]]]:
    """The report's markdown and its figures, in this order: the headline (each benchmark's
    systems ranked by its main metric), each benchmark's details with its figures (linked as
    `report-fig<n>.png`, n counting the figures returned), judge agreement, lineage."""
    from pipeline.core import registry

    metrics = root / "metrics"
    present = [b for b in registry.names() if (metrics / f"{b}.json").exists()]
    if not present:
        raise DataError(
            "no results of any benchmark: run `dvc repro` (or `dvc pull`) first",
            file=str(metrics / "<benchmark>.json"),
        )
    agreement = None
    if (metrics / "agreement.json").exists():
        agreement = _document(metrics / "agreement.json")["rows"]
        for n, r in enumerate(agreement, 1):
            need(r, ("judge", "reference"), "metrics/agreement.json", n)
    kappa = human_kappa(agreement or [])
    figs: list[tuple[str, bytes]] = []
    top: list[str] = []
    details: list[str] = []
    carded: list[tuple[str, str, list[dict[str, Any]]]] = []
    if agreement is not None:
        carded.append(("metrics/agreement.json", "", agreement))
    for name in present:
        bench = registry.get(name)
        title = bench.title or bench.name
        where = f"metrics/{name}.json"
        doc = _document(root / where)
        if isinstance(doc.get("agreement"), list):
            carded.append((where + " (agreement)", name, doc["agreement"]))
        section = aggregation.report_section(bench, doc, where)  # checks the rows its way
        if bench.metrics:  # the declared main metric (pipeline/core/results.py), with its way
            main = bench.metrics[0]
            top += headline(
                name,
                title,
                doc["rows"],
                main.name,
                kappa,
                where,
                main.higher_is_better is not False,
            )
        else:
            top += [f"### {title}", "", "No main metric declared: see its section below.", ""]
        details += [f"## {title}", "", *_models(root, bench, doc["rows"]), *section.lines]
        details += flagged_rows(doc["rows"], GROUP_KEYS)
        if isinstance(doc.get("not_judged"), list):
            from pipeline.stages.aggregate import not_judged_lines

            details += not_judged_lines(doc["not_judged"])
        for caption, png in section.figures:
            figs.append((caption, png))
            details += [f"![{caption}]({figure_name(len(figs))})", ""]
    lines = ["# lfbench report", "", "## Headline", ""]
    lines += [
        "Per benchmark, the best rows by its main metric within each group that can be"
        f" compared (one judge, one domain, ...; the {MAX_GROUPS} largest groups), with a 95%"
        " interval where the metrics file has one. Judge kappa vs people: Cohen's kappa of the"
        " judge against human labels, from metrics/agreement.json (- where not measured).",
        "",
    ]
    lines += top
    lines += details
    lines += _retrievers(root, present)
    if agreement is not None:
        lines += _agreement(agreement)
    lines += _cards(root, carded)
    lines += _audits(root, kappa)
    lines += ["## Lineage", ""]
    lines += table(["what", "value"], [[k, f"`{v}`"] for k, v in lineage(root, present).items()])
    return "\n".join(lines).rstrip() + "\n", figs


def _retrievers(root: Path, present: Sequence[str]) -> list[str]:
    """Retrievers side by side: what each benchmark measured of the rows that used one (a
    context's coverage, the coverage of the answers made from it), for every retriever that more
    than one benchmark measured, or that is an entry of yours (`retrievers:`, a RAG system)."""
    from pipeline.core import registry
    from pipeline.core.params import load_params

    params_path = root / "params.yaml"
    if not params_path.exists():
        return []
    try:
        params = load_params(params_path, [])
    except LfbenchError:
        return []
    found: dict[str, list[tuple[str, str, float]]] = {}
    for name in present:
        bench = registry.get(name)
        if bench.retrieval is None:
            continue
        rows = _document(root / "metrics" / f"{name}.json")["rows"]
        for retriever, what, value in bench.retrieval.side_by_side(params, rows):
            found.setdefault(retriever, []).append((bench.title or name, what, value))
    yours = set(params.retrievers) | {
        m for m, spec in params.models.items() if spec.provider in ("python", "outputs")
    }
    shown = [r for r in sorted(found) if r in yours or len({b for b, _, _ in found[r]}) > 1]
    if not shown:
        return []
    body = [[r, b, what, f"{v:.2f}"] for r in shown for b, what, v in found[r]]
    return [
        "## Retrievers side by side",
        "",
        "Each retriever (yours, a RAG system of yours, or one several benchmarks rank with), and"
        " what each benchmark measured of it: the coverage of its contexts (CRUX) beside the"
        " coverage of the answers made from them.",
        "",
        *table(["retriever", "benchmark", "measured", "value"], body),
        "",
    ]


def _models(root: Path, bench: Any, rows: list[dict[str, Any]]) -> list[str]:
    """The benchmark's per-model summary (best row with its interval, items, what its stages
    spent), when the stages' usage files are in the workspace."""
    from pipeline.core.params import load_params
    from pipeline.stages.aggregate import model_summary, summary_lines
    from pipeline.stages.common import collect_usage

    params_path = root / "params.yaml"
    if not bench.metrics or not params_path.exists():
        return []
    try:
        section = load_params(params_path, [bench.name]).section(bench.name, bench.params_model)
    except LfbenchError:
        return []  # params that no longer validate: the rows stand without the summary
    usage = collect_usage(
        section.models,
        section.judges,
        root / "generations" / bench.name,
        root / "judgements" / bench.name,
    )
    found = model_summary(bench, rows, usage, section.judges)
    if not found:
        return []
    return ["### Models", "", *summary_lines(found)]


def figure_name(n: int) -> str:
    return f"report-fig{n}.png"


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_PIPE = re.compile(r"(?<!\\)\|")  # a cell boundary: a pipe not escaped as `\|`
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+)\)$")


def _inline(text: str) -> str:
    t = html.escape(text, quote=False)
    t = _CODE.sub(r"<code>\1</code>", t)
    return _BOLD.sub(r"<b>\1</b>", t)


def _cells(line: str) -> list[str]:
    r"""A pipe-table row's cells: split on unescaped `|` only, `\|` back to `|`."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    if inner.endswith("|") and not inner.endswith("\\|"):
        inner = inner[:-1]
    return [c.strip().replace("\\|", "|") for c in _PIPE.split(inner)]


def md_to_html(md: str, images: dict[str, bytes] | None = None) -> str:
    """The markdown this module writes (headings, pipe tables, paragraphs, images on a line of
    their own) as HTML; an image whose name is in `images` is inlined."""
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
                block.append(_cells(lines[i]))
                i += 1
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in block[0]) + "</tr>")
            for row in block[2:]:
                out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>")
            out.append("</table>")
            continue
        elif m := _IMAGE.match(line):
            caption, name = html.escape(m.group(1)), m.group(2)
            png = (images or {}).get(name)
            src = html.escape(name) if png is None else image_data(png)
            out.append(
                f'<figure><img alt="{caption}" src="{src}"><figcaption>{caption}</figcaption>'
                "</figure>"
            )
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def image_data(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


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
    images = {figure_name(n): png for n, (_, png) in enumerate(figs, 1)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, png in images.items():
        (out_dir / name).write_bytes(png)
    atomic_write_text(md_path, md)
    page = (
        '<!doctype html><html><head><meta charset="utf-8"><title>lfbench report</title>'
        f"<style>{_CSS}</style></head><body>\n{md_to_html(md, images)}\n</body></html>\n"
    )
    atomic_write_text(html_path, page)
    for p in (md_path, html_path):
        p.chmod(0o644)  # a report is for sharing
    return html_path, md_path
