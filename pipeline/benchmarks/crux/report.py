"""CRUX's Markdown report (`reports/crux.md`), its plot, and its part of `lfbench report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.benchmarks.crux.aggregate import METRICS
from pipeline.benchmarks.crux.params import CruxParams
from pipeline.benchmarks.crux.schema import Collection
from pipeline.core.benchmark import ReportSection
from pipeline.core.markdown import fmt, need, results_table, table

PLOT = "crux.png"
NAMES = {
    "coverage": "Cov(Z)",
    "alpha_ndcg": "alpha-nDCG",
    "density": "Den(Z)",
    "recall": "Recall",
    "ndcg": "nDCG",
    "cov_y": "Cov(y)",
    "den_y": "Den(y)",
    "joint": "Joint",
}


def _cell(row: Mapping[str, Any] | None, key: str, nd: int = 1) -> str:
    return "-" if row is None else fmt(row.get(key), nd)


def _tau(t: Mapping[str, Any] | None) -> str:
    if t is None or t.get("tau") is None:
        return "-"
    if t.get("ci_low") is None:
        return f"{t['tau']:.3f}"
    return f"{t['tau']:.3f} [{t['ci_low']:.2f}, {t['ci_high']:.2f}]"


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Coverage at |Z*| and alpha-nDCG@10 per retriever, by domain and judge."""
    by = {(r["domain"], r["judge"], r["retriever"], str(r["cutoff"])): r for r in rows}
    groups = sorted({(r["domain"], r["judge"]) for r in rows})
    retrievers = list(dict.fromkeys(r["retriever"] for r in rows))
    body = []
    for domain, judge in groups:
        for ret in retrievers:
            z, ten = by.get((domain, judge, ret, "zstar")), by.get((domain, judge, ret, "10"))
            if z is None and ten is None:
                continue
            body.append(
                [
                    domain,
                    judge,
                    ret,
                    _cell(z, "coverage"),
                    _cell(ten, "alpha_ndcg"),
                    _cell(z, "density"),
                    _cell(z, "passages"),
                    _cell(z, "n_scored", 0),
                ]
            )
    head = ["domain", "judge", "retriever", "Cov@|Z*|", "alpha-nDCG@10", "Den@|Z*|",
            "mean |Z*|", "queries"]  # fmt: skip
    return table(head, body)


def tau_table(taus: Sequence[Mapping[str, Any]]) -> list[str]:
    by = {
        (
            t["domain"],
            t["context_judge"],
            t["answer_judge"],
            t["metric"],
            t["target"],
            t["level"],
        ): t
        for t in taus
    }
    keys = list(dict.fromkeys(k[:3] for k in by))  # the metrics file's order
    pairs = list(dict.fromkeys((t["metric"], t["target"]) for t in taus if t["target"] != "joint"))
    body = []
    for domain, cj, aj in keys:
        for metric, target in pairs:
            r = by.get((domain, cj, aj, metric, target, "retrievers"))
            e = by.get((domain, cj, aj, metric, target, "per_summarizer"))
            p = by.get((domain, cj, aj, metric, target, "pipelines"))
            j = (
                by.get((domain, cj, aj, metric, "joint", "pipelines"))
                if target == "cov_y"
                else None
            )
            if r is None and p is None:
                continue
            n = r or p
            assert n is not None
            body.append(
                [
                    domain,
                    cj,
                    aj,
                    f"{NAMES[metric]} ~ {NAMES[target]}",
                    f"{_tau(r)} (n={r['n_points'] if r else '-'})",
                    f"{_tau(e)} ({e['n_summarizers'] if e else '-'} summarizers)",
                    f"{_tau(p)} (n={p['n_points'] if p else '-'})",
                    _tau(j),
                    n["n_queries"],
                ]
            )
    head = ["domain", "context judge", "answer judge", "context ~ answer",
            "tau across retrievers [95% CI]", "mean tau per summarizer [95% CI]",
            "tau across pipelines [95% CI]",
            "tau vs Joint (pipelines)", "queries"]  # fmt: skip
    return table(head, body)


def render(
    cx: CruxParams,
    dataset: Sequence[Collection],
    rows: Sequence[Mapping[str, Any]],
    agreement: Sequence[Mapping[str, Any]],
    taus: Sequence[Mapping[str, Any]],
    answers: Any,
    source: str,
) -> str:
    """The report: the data and metrics, the headline, every context (the result model's
    table of the rows), the judges against the labels, the contexts against the answers."""
    sc = cx.scoring
    qs = [q for c in dataset for q in c.queries]
    derived = (
        " DERIVED from SummHay, not the paper's data: one query per subtopic, sub-questions ="
        " its insights, passages = the haystack's whole documents, rating 5 when a document"
        " holds the insight (else 0), Z* the greedy cover."
        if source == "derived:summhay"
        else ""
    )
    lines = [
        "# CRUX: retrieval-context coverage",
        "",
        f"Dataset: {source}, {len(qs)} queries ({sum(1 for q in qs if not q.subquestions)} with"
        f" no answerable sub-question, excluded), {sum(len(q.subquestions) for q in qs)}"
        f" answerable sub-questions ({sum(len(q.dropped) for q in qs)} dropped).{derived}"
        f" A rating >= {sc.eta} answers a sub-question. Every context (one retriever's ranking"
        " at a cut-off, setting `retriever@cutoff`), per query, then the mean over queries,"
        f" x100: Coverage, alpha-nDCG (alpha {sc.alpha}, discount log2(1 + rank), greedy ideal"
        f" over the relevant passages, k = the context's size), Density (w = {sc.w}, cl100k"
        " tokens, relative to Z*). `budget` packs the ranking into"
        f" {sc.budget_tokens} tokens as SummHay generation does. Generated by lfbench; see"
        " metrics/crux.json.",
        "",
        "## Coverage at |Z*| and alpha-nDCG@10 per retriever",
        "",
        *headline(rows),
        "## Every context",
        "",
        "Queries left out of a row, and counted: `excluded` (no answerable sub-question),"
        " `unjudged` (outside the judge's sample, crux.judge_sample, or not judged), `failed"
        " generations` / `failed judgements` (the context or its judgement failed), `invalid`"
        " (a verdict in the context that the judge could not give after a repair; never rated"
        " 0).",
        "",
        *results_table(METRICS, rows),
    ]
    if agreement:
        lines += ["## Judges against the labels", ""]
        lines += [
            "Cohen's kappa of the answerable decision (rating >= eta) on every pair the judge"
            " rated, with a 95% bootstrap interval; invalid verdicts are counted, not rated.",
            "",
        ]
        lines += table(
            ["judge", "domain", "pairs", "kappa [95% CI]", "answerable (judge)",
             "answerable (labels)", "invalid"],
            [
                [
                    a["judge"],
                    a["domain"],
                    a["n"],
                    "-" if a["kappa"] is None
                    else f"{a['kappa']:.3f} [{a['kappa_ci_low']:.2f}, {a['kappa_ci_high']:.2f}]",
                    f"{a['answerable_judge']:.3f}",
                    f"{a['answerable_labels']:.3f}",
                    a["n_invalid"],
                ]
                for a in agreement
            ],
        )  # fmt: skip
    lines += ["## Does the context predict the answer?", ""]
    if answers is None:
        lines += ["No answers configured (crux.answers.generations is null).", ""]
    elif not taus:
        lines += [
            "No answers to compare with: no answered query has a context of every retriever.",
            "",
        ]
    else:
        pipes = {(p["retriever"], p["system"]) for t in taus for p in t.get("points", [])}
        lines += [
            f"Final answers: {', '.join(answers.files)} ({len(pipes)} retriever x summarizer"
            f" pipelines; {answers.n_skipped} answers left out for a missing or invalid"
            " verdict). Cov(y) = the share of a query's answerable sub-questions the answer"
            f" covers ({'FULL or PARTIAL' if cx.scoring.partial_answers else 'FULL only'});"
            " Den(y) its density against Z*. Contexts at cut-off"
            f" `{cx.answers.cutoff}` (what the summarizers were given). Kendall tau-b; the"
            " interval resamples queries (1000 times by default). Across retrievers: each"
            " retriever's answers averaged over its summarizers; per summarizer: the tau across"
            " retrievers of one summarizer's answers, averaged over summarizers (the paper's"
            " design: one generator, the retrieval varied); across pipelines: every retriever x"
            " summarizer pair. The paper's Table 1 bottom"
            " row: 0.676 / 0.724 / 0.733 (DUC) and 0.838 / 0.800 / 0.810 (Multi-News) for"
            " Cov(Z)~Cov(y), alpha-nDCG~Cov(y), Den(Z)~Den(y) across 21 pipelines.",
            "",
            *tau_table(taus),
            f"![contexts against answers]({PLOT})",
            "",
        ]
    return "\n".join(lines)


def figures(
    rows: Sequence[Mapping[str, Any]], taus: Sequence[Mapping[str, Any]]
) -> dict[str, bytes]:
    """The report's plot: coverage by cut-off per retriever; each pipeline's context coverage
    against its answers' Cov(y); the taus with their intervals."""
    from pipeline.plots import plt, png, style

    if not rows:
        return {}
    style()
    judge = sorted({r["judge"] for r in rows})[0]
    domains = sorted({r["domain"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15.0, 4.2))
    ax = axes[0]
    cutoffs = list(dict.fromkeys(str(r["cutoff"]) for r in rows))
    retrievers = list(dict.fromkeys(r["retriever"] for r in rows))
    for domain, style_ in zip(domains, ("-", "--", ":", "-."), strict=False):
        for n, ret in enumerate(retrievers):
            pts = {
                str(r["cutoff"]): r["coverage"]
                for r in rows
                if r["domain"] == domain and r["judge"] == judge and r["retriever"] == ret
            }
            ys = [pts.get(c) for c in cutoffs]
            ax.plot(
                range(len(cutoffs)),
                [float("nan") if v is None else v for v in ys],
                style_,
                color=f"C{n % 10}",
                marker="o",
                ms=3,
                label=ret if domain == domains[0] else None,
            )
    ax.set_xticks(range(len(cutoffs)), cutoffs)
    ax.set_xlabel("cut-off")
    ax.set_ylabel("Cov(Z)")
    styles = ", ".join(
        f"{st}: {d}"
        for d, st in zip(domains, ("solid", "dashed", "dotted", "dash-dot"), strict=False)
    )
    ax.set_title(f"context coverage ({judge} judge)\n{styles}")
    ax.legend(fontsize=6, frameon=False, ncol=2)
    with_points = [t for t in taus if t.get("points")]
    ax = axes[1]
    if with_points:
        t = sorted(with_points, key=lambda t: t["context_judge"] != judge)[0]
        for n, ret in enumerate(retrievers):
            ps = [p for p in t["points"] if p["retriever"] == ret]
            if ps:
                xs, ys = [p["context"] for p in ps], [p["answer"] for p in ps]
                ax.scatter(xs, ys, s=14, color=f"C{n % 10}", label=ret)
        ax.set_xlabel(f"Cov(Z) at {t['cutoff']} ({t['context_judge']})")
        ax.set_ylabel(f"Cov(y) ({t['answer_judge']})")
        ax.set_title(f"pipelines, {t['domain']}: tau {_tau(t)}")
        ax.legend(fontsize=7, frameon=False)
    else:
        ax.set_axis_off()
    ax = axes[2]
    main = {("coverage", "cov_y"), ("alpha_ndcg", "cov_y"), ("density", "den_y")}
    shown = [t for t in taus if (t["metric"], t["target"]) in main and t["tau"] is not None]
    if shown:
        shown = sorted(
            shown,
            key=lambda t: (t["domain"], t["context_judge"], t["answer_judge"], t["level"],
                           t["metric"], t["target"]),
        )  # fmt: skip
        ys = list(range(len(shown)))
        taus_ = [t["tau"] for t in shown]
        lows = [t["ci_low"] if t["ci_low"] is not None else t["tau"] for t in shown]
        highs = [t["ci_high"] if t["ci_high"] is not None else t["tau"] for t in shown]
        inside = [lo <= tau <= hi for tau, lo, hi in zip(taus_, lows, highs, strict=True)]
        # A percentile interval need not hold its point estimate (the per-summarizer tau is a
        # mean of taus; its resamples can all fall on one side): such a tau is drawn as an x
        # beside its interval, not as an error bar (which cannot be negative).
        ins = [i for i, ok in enumerate(inside) if ok]
        outs = [i for i, ok in enumerate(inside) if not ok]
        if ins:
            ax.errorbar(
                [taus_[i] for i in ins],
                [ys[i] for i in ins],
                xerr=[[taus_[i] - lows[i] for i in ins], [highs[i] - taus_[i] for i in ins]],
                fmt="o",
                ms=3,
                capsize=2,
            )
        if outs:
            ax.hlines([ys[i] for i in outs], [lows[i] for i in outs], [highs[i] for i in outs])
            ax.plot([taus_[i] for i in outs], [ys[i] for i in outs], "x", ms=4, color="C3")
        ax.set_yticks(
            ys,
            [
                f"{NAMES[t['metric']]}~{NAMES[t['target']]} {t['level'][:4]}"
                f" {t['context_judge']}/{t['answer_judge']} {t['domain'][:4]}"
                for t in shown
            ],
            fontsize=5,
        )
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlim(-1.05, 1.05)
        ax.set_xlabel("Kendall tau-b [95% CI]")
        ax.set_title("context metric vs answer metric")
    else:
        ax.set_axis_off()
    fig.tight_layout()
    return {PLOT: png(fig)}


def report_section(metrics: Mapping[str, Any], where: str) -> ReportSection:
    """CRUX's part of `lfbench report`: the headline table, the taus and the plot."""
    rows = metrics.get("rows")
    if not isinstance(rows, list):
        need({}, ("rows",), where, 0)
        rows = []
    for n, r in enumerate(rows, 1):
        need(r, ("domain", "judge", "retriever", "cutoff", "coverage", "alpha_ndcg"), where, n)
    taus = metrics.get("tau") or []
    out = [f"Retrieval-context coverage from {where} ({metrics.get('source', '?')}).", ""]
    out += headline(rows)
    if taus:
        out += ["Does the context predict the answer? Kendall tau-b, context metric against"
                " answer metric (details in reports/crux.md).", ""]  # fmt: skip
        out += tau_table(taus)
    return ReportSection(
        out, [(f"CRUX ({where})", png)] if (png := figures(rows, taus).get(PLOT)) else []
    )
