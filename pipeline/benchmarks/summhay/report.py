"""A markdown report laid out like the paper's Table 2 (summarizers x settings, Coverage /
Citation / Joint) and Table 3 (position sensitivity), one section per (domain, judge, mode) of
the released haystacks and of each derived collection (`news@50k`, `news@synthetic`); then the
length study (Joint by haystack length) and what synthesis did."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pipeline.benchmarks.summhay import paper_tables as paper
from pipeline.benchmarks.summhay.plots import length_of
from pipeline.core.benchmark import ReportSection
from pipeline.core.markdown import need, table
from pipeline.metrics.stats import spearman

POSITION_SETTINGS = ("full-sort", "full-rev-sort", "full-middle")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _system_order(systems: set[str]) -> list[str]:
    known = [s for s in paper.SUMMARIZERS if s in systems]
    return known + sorted(systems - set(known))


def _setting_order(settings: set[str]) -> list[str]:
    known = [s for s in paper.SETTINGS if s in settings]
    rest = sorted(settings - set(known) - set(POSITION_SETTINGS))
    return known + rest


def position_sensitivity(cells: dict[str, float | None]) -> float | None:
    """max(|Top - Random|, |Bottom - Random|) of Joint, the paper's Table 3 definition."""
    rnd, top, bottom = cells.get("full"), cells.get("full-sort"), cells.get("full-rev-sort")
    if rnd is None or top is None or bottom is None:
        return None
    return max(abs(top - rnd), abs(bottom - rnd))


def _where(r: dict[str, Any]) -> str:
    c = r.get("collection", "released")
    return str(r["domain"]) if c == "released" else f"{r['domain']}@{c}"


def render(
    rows: Sequence[dict[str, Any]],
    dataset_note: str,
    derived: Sequence[dict[str, Any]] = (),
) -> str:
    """The report: a section per view, the length study, and (`derived`: the dataset's derived
    haystacks, as `derived_table` lists them) how each derived haystack was made."""
    lines = paper_sections(rows, dataset_note, derived)
    return "\n".join(["# SummHay results", "", *lines]).rstrip() + "\n"


def paper_sections(
    rows: Sequence[dict[str, Any]],
    dataset_note: str,
    derived: Sequence[dict[str, Any]] = (),
) -> list[str]:
    """The report's lines after its title (see `render`)."""
    out = [dataset_note, ""]
    sections: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        sections[(_where(r), r["judge"], r["mode"])].append(r)
    for (domain, judge, mode), srows in sorted(sections.items(), key=_released_first):
        out += _section(domain, judge, mode, srows)
    out += length_section(rows)
    if length_views(rows):
        out += [f"![Joint by haystack length]({LENGTH_PLOT})", ""]
    out += derived_section(derived)
    return out


def _released_first(view: tuple[tuple[str, str, str], Any]) -> tuple[bool, str, str, str]:
    """Views of the released haystacks first (the paper's), then the derived collections."""
    domain, judge, mode = view[0]
    return ("@" in domain, domain, judge, mode)


def length_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Joint (Coverage / Citation) of each system and setting at each length of the study."""
    study = [r for r in rows if length_of(str(r.get("collection", ""))) is not None]
    if not study:
        return []
    lengths = sorted({str(r["collection"]) for r in study}, key=lambda c: length_of(c) or 0)
    cell = {
        (r["domain"], r["judge"], r["mode"], r["system"], r["setting"], r["collection"]): r
        for r in study
    }
    keys = sorted({k[:5] for k in cell})
    out = [
        "## Length study: Joint (Coverage / Citation) by haystack length",
        "",
        "The same subtopics in haystacks of each length (cl100k_base tokens of documents),"
        " recombined from the released documents: shorter ones keep a subset of the topic's"
        " documents, longer ones add documents of the other topics of the domain.",
        "",
    ]
    body = []
    for k in keys:
        vals = []
        for c in lengths:
            r = cell.get((*k, c))
            vals.append(
                "-"
                if r is None
                else f"{_fmt(r['joint'])} ({_fmt(r['coverage'])} / {_fmt(r['citation'])})"
            )
        body.append([*k, *vals])
    return out + table(["Domain", "Judge", "Mode", "Summarizer", "Setting", *lengths], body)


def derived_section(derived: Sequence[dict[str, Any]]) -> list[str]:
    if not derived:
        return []
    out = ["## Derived haystacks", ""]
    out += table(
        ["Haystack", "Kind", "Documents", "Tokens", "Subtopics", "Insights", "Made of", "Recipe"],
        [
            [d["haystack"], d["kind"], d["documents"], d["tokens"], d["subtopics"],
             d["insights"], ", ".join(d["sources"]) or "-", f"`{d['recipe_sha'][:12]}`"]
            for d in derived
        ],
    )  # fmt: skip
    synth = [d for d in derived if d["kind"] == "synthesized"]
    if synth:
        keys = [
            k for k in synth[0]["figures"] if not isinstance(synth[0]["figures"][k], list | dict)
        ]
        out += ["### Synthesis: checks, rewrites and residual failures", ""]
        out += table(
            ["Figure", *(d["haystack"] for d in synth)],
            [[k, *(d["figures"].get(k, "-") for d in synth)] for k in keys],
        )
    return out


def _section(domain: str, judge: str, mode: str, rows: list[dict[str, Any]]) -> list[str]:
    cell: dict[tuple[str, str], dict[str, Any]] = {(r["system"], r["setting"]): r for r in rows}
    systems = _system_order({r["system"] for r in rows})
    settings = _setting_order({r["setting"] for r in rows})
    out = [f"## Domain `{domain}`, judge `{judge}`, mode `{mode}`", ""]
    if settings:
        labels = [paper.SETTING_LABELS.get(s, s) for s in settings]
        out.append("### Table 2 layout: Coverage / Citation / Joint")
        out.append("")
        for metric in ("coverage", "citation", "joint"):
            out.append(f"**{metric.capitalize()}**")
            out.append("")
            joint = metric == "joint"
            body = []
            for system in systems:
                vals = [
                    _fmt(cell[(system, s)][metric]) if (system, s) in cell else "-"
                    for s in settings
                ]
                if joint:
                    wpb = [
                        (r["words_per_bullet"], r["n_scored"])
                        for r in rows
                        if r["system"] == system and r["words_per_bullet"] is not None
                    ]
                    total = sum(n for _, n in wpb)
                    vals.append(_fmt(sum(w * n for w, n in wpb) / total) if total else "-")
                body.append([system, *vals])
            out += table(["Summarizer", *labels, *(["#W_b"] if joint else [])], body)
    pos = [s for s in systems if (s, "full-sort") in cell or (s, "full-rev-sort") in cell]
    if pos:
        out += ["### Table 3 layout: Joint by document order, full context", ""]
        body = []
        for system in pos:
            cells = {
                s: cell[(system, s)]["joint"] if (system, s) in cell else None
                for s in ("full-sort", "full-rev-sort", "full-middle", "full")
            }
            body.append(
                [system, _fmt(cells["full-sort"]), _fmt(cells["full-rev-sort"]),
                 _fmt(cells["full-middle"]), _fmt(cells["full"]),
                 _fmt(position_sensitivity(cells))]
            )  # fmt: skip
        out += table(["Summarizer", "Top", "Bottom", "Middle", "Random", "Sensitivity"], body)
    out += _problems_and_cost(rows)
    if "@" not in domain:  # the paper scored the released haystacks only
        out += _paper_comparison(cell)
    return out


def _problems_and_cost(rows: list[dict[str, Any]]) -> list[str]:
    """Failures and invalid judgements (left out of the scores, never counted as 0), and what the
    calls cost. Shown only when there is something to show (replayed outputs cost nothing)."""
    keys = ("n_invalid_verdicts", "n_failed_generations", "n_failed_judgements", "n_truncated")
    shown = [r for r in rows if any(r.get(k) for k in keys) or r.get("cost_usd")]
    if not shown:
        return []
    out = ["### Invalid judgements, failures and cost", ""]
    return out + table(
        ["Summarizer", "Setting", "Summaries", "Invalid judgements", "Failed generations",
         "Failed judgements", "Cut (length, filter)", "Tokens in", "Tokens out", "Cost (USD)"],
        [
            [r["system"], r["setting"], r["n_scored"], r["n_invalid_verdicts"],
             r["n_failed_generations"], r["n_failed_judgements"], r.get("n_truncated", 0),
             r["input_tokens"], r["output_tokens"], f"{r['cost_usd']:.4f}"]
            for r in sorted(shown, key=lambda r: (r["system"], r["setting"]))
        ],
    )  # fmt: skip


def _paper_comparison(cell: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    pairs = [
        (key, paper.TABLE2["joint"][key], cell[key]["joint"])
        for key in paper.TABLE2["joint"]
        if key in cell and cell[key]["joint"] is not None
    ]
    if len(pairs) < 3:
        return []
    ours = [p[2] for p in pairs]
    theirs = [p[1] for p in pairs]
    rho = spearman(theirs, ours)
    mean_delta = sum(o - t for o, t in zip(ours, theirs, strict=True)) / len(pairs)
    return [
        "### Against the paper's Table 2 (Joint)",
        "",
        f"{len(pairs)} cells in common. Spearman rank correlation with the paper's Joint: "
        f"{rho:.3f}; mean difference (here - paper): {mean_delta:+.1f} points. The paper pools "
        "both domains; a news-only number is expected to differ in level, not in ranking.",
        "",
    ]


def report_section(rows: Sequence[dict[str, Any]], where: str) -> ReportSection:
    """SummHay's part of `lfbench report`: the tables of `render`, the cost per model entry and
    judge, and the position-sensitivity and best system's plots of each view."""
    from pipeline.benchmarks.summhay import plots
    from pipeline.benchmarks.summhay.aggregate import ROW_KEYS
    from pipeline.core.results import LATER_COUNTERS

    for n, r in enumerate(rows, 1):
        need(r, [k for k in ROW_KEYS if k not in LATER_COUNTERS], where, n)
    body = render(rows, f"{len(rows)} result rows from {where}.")
    # demote the benchmark report's headings one level under the report's section; its image
    # links name files beside reports/summhay.md: the figures come with the section instead
    out = [
        ("#" + x if x.startswith("#") else x)
        for x in body.splitlines()[1:]
        if not x.startswith("![")
    ]
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
    out += table(
        ["model entry", "judge", "input tokens", "output tokens", "USD"],
        [[m, j, int(c[0]), int(c[1]), f"{c[2]:.4f}"] for (m, j), c in sorted(cost.items())],
    )
    out.append(f"Judges: {', '.join(sorted({j for j, _ in judges}))}.")
    out.append("")
    figs: list[tuple[str, bytes]] = []
    views: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        views[(_where(r), r["judge"], r["mode"])].append(r)
    for (domain, judge, mode), vrows in sorted(views.items(), key=_released_first):
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
                    f"Joint by setting, best system {best['system']} ({domain} / {judge} / {mode})",
                    plots.joint_by_setting(sys_rows, title),
                )
            )
    figs += length_figures(rows)
    return ReportSection(out, figs)


LENGTH_PLOT = "summhay_length.png"


def length_views(
    rows: Sequence[dict[str, Any]],
) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    views: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if length_of(str(r.get("collection", ""))) is not None:
            views[(r["domain"], r["judge"], r["mode"])].append(r)
    return dict(views)


def length_figures(rows: Sequence[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """(caption, PNG) of Joint by length, when the rows hold a length study."""
    from pipeline.benchmarks.summhay import plots

    views = length_views(rows)
    return [("Joint by haystack length", plots.length_scaling(views))] if views else []
