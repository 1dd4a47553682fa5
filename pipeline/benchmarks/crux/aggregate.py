"""CRUX's rows: the context metrics per (domain, retriever, cut-off, judge); each judge's agreement
with the labels; and whether the context metrics rank pipelines as their answers' coverage does.

Per query, then macro-averaged over queries, x100. A query without answerable sub-questions is
excluded from every mean and counted (`n_excluded`); a query whose context holds a verdict the
judge could not give is left out of that row and counted (`n_invalid`), never rated 0.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

import numpy as np

from pipeline.benchmarks.crux import metrics as m
from pipeline.benchmarks.crux.contexts import cut
from pipeline.benchmarks.crux.judging import LABELS_SHA, split_target
from pipeline.benchmarks.crux.params import CruxParams
from pipeline.benchmarks.crux.schema import Collection, QueryView
from pipeline.core.benchmark import Run, RunRow
from pipeline.core.records import Generation, Judgement

METRICS = ("coverage", "alpha_ndcg", "density", "recall", "ndcg")
CONTEXT_METRICS = ("coverage", "alpha_ndcg", "density")
ANSWERED = {"FULL_COVERAGE"}


def views(dataset: Sequence[Collection]) -> dict[str, QueryView]:
    out = {}
    for c in dataset:
        passages = {p.pid: p for p in c.passages}
        for n, q in enumerate(c.queries):
            out[q.item_id] = QueryView(q, passages, n)
    return out


@dataclass
class Rated:
    """A judge's ratings of one context's pairs: (passage, sub-question index) -> rating."""

    ratings: dict[tuple[str, int], int] = field(default_factory=dict)
    invalid: set[tuple[str, int]] = field(default_factory=set)

    def rate(self, pid: str, i: int) -> int:
        return self.ratings.get((pid, i), 0)


def rated(view: QueryView, j: Judgement) -> Rated:
    index = {s.qid: i for i, s in enumerate(view.query.subquestions)}
    out = Rated()
    for v in j.verdicts:
        pid, qid = split_target(v.target_id)
        if qid not in index:
            continue
        if v.status == "ok":
            out.ratings[(pid, index[qid])] = int(v.label)
        else:
            out.invalid.add((pid, index[qid]))
    return out


def relevance(
    runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, float]]:
    """Recall and nDCG of each query's context (its passages, in rank order) against its
    relevant passages, with ir-measures: {query: {"recall": ..., "ndcg": ...}}."""
    import ir_measures
    from ir_measures import Qrel, ScoredDoc, nDCG

    recall = ir_measures.R @ 10_000
    ndcg = nDCG @ 10_000
    qrel_rows = [Qrel(q, p, 1) for q, ps in qrels.items() if q in runs for p in ps]
    run_rows = [
        ScoredDoc(q, p, float(len(ps) - r)) for q, ps in runs.items() for r, p in enumerate(ps)
    ]
    out: dict[str, dict[str, float]] = {q: {"recall": 0.0, "ndcg": 0.0} for q in runs}
    for metric in ir_measures.iter_calc([recall, ndcg], qrel_rows, run_rows):
        if metric.query_id in out:
            out[metric.query_id]["recall" if metric.measure == recall else "ndcg"] = float(
                metric.value
            )
    return out


def is_labels(run: Run) -> bool:
    """Whether the run's judge is the dataset's labels, replayed."""
    return any(j.judge_prompt_sha == LABELS_SHA for j in run.judgements)


def judge_pool(run: Run, qviews: Mapping[str, QueryView]) -> dict[str, Rated]:
    """Per query, every pair the run's judge rated in any context (for its alpha-nDCG ideal)."""
    pool: dict[str, Rated] = defaultdict(Rated)
    for j in run.judgements:
        if j.item_id in qviews and j.status != "error":
            r = rated(qviews[j.item_id], j)
            pool[j.item_id].ratings |= r.ratings
            pool[j.item_id].invalid |= r.invalid
    return pool


COUNTS = ("n_excluded", "n_unjudged", "n_failed", "n_invalid")


def context_rows(
    section: CruxParams, dataset: Sequence[Collection], runs: Sequence[Run]
) -> tuple[list[dict[str, Any]], dict[tuple[str, ...], list[dict[str, Any]]]]:
    """One row per (domain, model, retriever, cut-off, judge), and the per-query scores.

    A query is left out of a row, and counted, when it has no answerable sub-question
    (`n_excluded`), when the judge did not rate its context (`n_unjudged`: outside the judge's
    sample, or no judgement), when its context or its judgement failed (`n_failed`), or when a
    verdict inside the context is invalid (`n_invalid`). alpha-nDCG's ideal ranking: over the
    dataset's ratings for the labels, over every pair the judge rated for the query (in any
    context) for another judge, so that a judge is compared with its own best."""
    sc = section.scoring
    qviews = views(dataset)
    cells: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    counts: dict[tuple[str, ...], dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    contexts: dict[tuple[str, ...], dict[str, list[str]]] = defaultdict(dict)
    qrels: dict[str, list[str]] = {}
    for run in runs:
        by_gen = {j.generation_id: j for j in run.judgements}
        pool = None if is_labels(run) else judge_pool(run, qviews)
        for g in run.generations:
            view = qviews[g.item_id]
            q = view.query
            n = len(q.subquestions)
            j = by_gen.get(g.generation_id)
            for cutoff in sc.cutoffs:
                key: tuple[str, ...] = (q.domain, run.model, g.system, g.setting, cutoff, run.judge)
                c = counts[key]
                if n == 0:
                    c["n_excluded"] += 1
                    continue
                if g.status != "ok" or (j is not None and j.status == "error"):
                    c["n_failed"] += 1
                    continue
                if j is None or not j.verdicts:
                    c["n_unjudged"] += 1
                    continue
                ctx = cut(g, q, cutoff, view.passages)
                r = rated(view, j)
                if any((p, i) in r.invalid for p in ctx.passages for i in range(n)):
                    c["n_invalid"] += 1
                    continue
                labelled = [p for p in q.ratings if m.answered_by(q.ratings[p], sc.eta)]
                ideal: Callable[[str, int], int]
                if pool is None:
                    ideal, relevant = q.rating, labelled
                else:
                    mine = pool[q.item_id]
                    ideal = mine.rate
                    relevant = list(
                        dict.fromkeys(p for (p, _), v in mine.ratings.items() if v >= sc.eta)
                    )
                qrels[q.item_id] = labelled
                contexts[key][q.item_id] = ctx.passages
                tokens_star = sum(view.passages[p].tokens for p in q.zstar)
                cov = m.coverage(ctx.passages, r.rate, n, sc.eta)
                k = len(ctx.passages)
                cells[key].append(
                    {
                        "item_id": q.item_id,
                        "coverage": cov,
                        "alpha_ndcg": m.alpha_ndcg(
                            ctx.passages, r.rate, relevant, ideal, n, sc.eta, sc.alpha, k
                        ),
                        "density": m.density(cov, ctx.tokens, 1.0, tokens_star, sc.w),
                        "passages": k,
                        "tokens": ctx.tokens,
                    }
                )
    # rows in the order of params.yaml: judges, retrievers, cut-offs
    judges = list(dict.fromkeys(r.judge for r in runs))
    retrievers = list(dict.fromkeys(g.setting for r in runs for g in r.generations))

    def order(key: tuple[str, ...]) -> tuple[Any, ...]:
        domain, model, system, retriever, cutoff, judge = key
        return (domain, model, system, judges.index(judge), retrievers.index(retriever),
                sc.cutoffs.index(cutoff))  # fmt: skip

    rows, details = [], {}
    for key in sorted(set(cells) | set(counts), key=order):
        domain, model, system, retriever, cutoff, judge = key
        scored = cells.get(key, [])
        rel = relevance(contexts.get(key, {}), qrels)
        for s in scored:
            s |= rel.get(s["item_id"], {"recall": 0.0, "ndcg": 0.0})
        row: dict[str, Any] = {
            "benchmark": "crux",
            "domain": domain,
            "system": system,
            "retriever": retriever,
            "cutoff": cutoff,
            "setting": f"{retriever}@{cutoff}",
            "judge": judge,
            "model": model,
        }
        for metric in METRICS:
            row[metric] = round(100 * fmean(s[metric] for s in scored), 4) if scored else None
        row |= {
            "passages": round(fmean(s["passages"] for s in scored), 3) if scored else None,
            "tokens": round(fmean(s["tokens"] for s in scored), 1) if scored else None,
            "n_queries": len(scored),
            **counts[key],
        }
        rows.append(row)
        details[key] = scored
    return rows, details


# ---------------------------------------------------------------- judges vs the labels


def label_agreement(
    section: CruxParams, dataset: Sequence[Collection], runs: Sequence[Run], seed: int
) -> list[dict[str, Any]]:
    """Each judge that is not the labels against the labels, on every pair it rated (a pair in
    several contexts counts once), per domain and over all: Cohen's kappa of the answerable
    decision (rating >= eta), with a 95% bootstrap interval over pairs."""
    from pipeline.metrics.agreement import bootstrap_ci, cohen_kappa

    eta = section.scoring.eta
    qviews = views(dataset)
    out = []
    for run in runs:
        if is_labels(run):
            continue
        pairs: dict[tuple[str, str, int], tuple[int, int]] = {}
        invalid: set[tuple[str, str, int]] = set()
        for j in run.judgements:
            view = qviews[j.item_id]
            r = rated(view, j)
            invalid |= {(j.item_id, pid, i) for pid, i in r.invalid}
            for (pid, i), rating in r.ratings.items():
                pairs[(j.item_id, pid, i)] = (
                    int(rating >= eta),
                    int(view.query.rating(pid, i) >= eta),
                )
        domain_of = {item: qviews[item].query.domain for item, _, _ in pairs}
        domains = sorted(set(domain_of.values()))
        for domain in [*domains, "all"] if len(domains) > 1 else domains:
            keys = [k for k in pairs if domain in ("all", domain_of[k[0]])]
            a = np.asarray([pairs[k][0] for k in keys])
            b = np.asarray([pairs[k][1] for k in keys])
            est = cohen_kappa(list(a), list(b), categories=[0, 1])
            ci = bootstrap_ci(
                m.binary_kappa, a, b, n_resamples=section.scoring.bootstrap_resamples, seed=seed
            )
            bad = sum(1 for k in invalid if domain in ("all", qviews[k[0]].query.domain))
            out.append(
                {
                    "model": run.model,
                    "judge": run.judge,
                    "reference": "labels",
                    "domain": domain,
                    "n": len(keys),
                    "n_invalid": bad,
                    "kappa": None if math.isnan(est) else est,
                    "kappa_ci_low": None if math.isnan(ci.low) else ci.low,
                    "kappa_ci_high": None if math.isnan(ci.high) else ci.high,
                    "answerable_judge": float(a.mean()),
                    "answerable_labels": float(b.mean()),
                }
            )
    return out


# ---------------------------------------------------------------- contexts vs answers

# Which context metric is compared with which answer metric (the paper pairs density with the
# answer's density and the others with its coverage).
PAIRS = (
    ("coverage", "cov_y"),
    ("alpha_ndcg", "cov_y"),
    ("density", "cov_y"),
    ("density", "den_y"),
    ("recall", "cov_y"),
    ("ndcg", "cov_y"),
)
# retrievers: each retriever's answers averaged over its summarizers; per_summarizer: the mean
# over summarizers of the tau across that summarizer's retrievers (the paper's design: one
# generator, the retrieval varied); pipelines: every retriever x summarizer pair.
LEVELS = ("retrievers", "per_summarizer", "pipelines")


@dataclass(frozen=True)
class Answers:
    """The final answers: (answer judge, setting, system) -> {query: (Cov(y), Den(y))}, SummHay's
    Joint by (answer judge, domain, setting, system), the answers left out (a verdict missing or
    invalid) and the files they came from."""

    scores: dict[tuple[str, str, str], dict[str, tuple[float, float]]]
    joint: dict[tuple[str, str, str, str], float]
    n_skipped: int
    files: list[str]


def answer_scores(
    qviews: Mapping[str, QueryView],
    generations: Sequence[Generation],
    judgements: Sequence[Judgement],
    partial: bool,
    w: float,
    tokens: Mapping[str, int],
) -> tuple[dict[tuple[str, str, str], dict[str, tuple[float, float]]], int]:
    """Cov(y): the share of a query's answerable sub-questions an answer covers (FULL, and
    PARTIAL when `partial`), by the answer judge's verdicts; Den(y): its density against Z*
    (`tokens`: cl100k tokens of each answer, by generation id)."""
    answered = ANSWERED | ({"PARTIAL_COVERAGE"} if partial else set())
    known = {g.generation_id for g in generations}
    out: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = defaultdict(dict)
    skipped = 0
    for j in judgements:
        view = qviews.get(j.item_id)
        if view is None or j.generation_id not in known or not view.query.subquestions:
            continue
        labels = {v.target_id: v for v in j.verdicts}
        kept = [s.qid for s in view.query.subquestions]
        if j.status == "error" or any(q not in labels or labels[q].status != "ok" for q in kept):
            skipped += 1
            continue
        cov = sum(1 for q in kept if labels[q].label in answered) / len(kept)
        star = sum(view.passages[p].tokens for p in view.query.zstar)
        den = m.density(cov, tokens.get(j.generation_id, 0), 1.0, star, w)
        out[(j.judge, j.setting, j.system)][j.item_id] = (cov, den)
    return dict(out), skipped


def _quantiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return None, None
    return float(np.quantile(kept, 0.025)), float(np.quantile(kept, 0.975))


def tau_rows(
    section: CruxParams,
    details: Mapping[tuple[str, ...], Sequence[Mapping[str, Any]]],
    answers: Answers,
    seed: int,
) -> list[dict[str, Any]]:
    """Kendall tau-b between each context metric (one context judge's, at `answers.cutoff`) and
    the answers' Cov(y) and Den(y), per domain, at the three `LEVELS` (a pipeline's context
    score is its retriever's); every score a mean over the queries every pipeline answered, with
    a 95% bootstrap interval over those queries; and against SummHay's Joint (pooled per
    pipeline, no interval)."""
    cutoff = section.answers.cutoff
    n_boot = section.scoring.bootstrap_resamples
    # (domain, context model, context judge) -> retriever -> query -> scores
    ctx: dict[tuple[str, str, str], dict[str, dict[str, Mapping[str, Any]]]] = defaultdict(dict)
    for key, scored in details.items():
        domain, model, _system, retriever, c, judge = key
        if c == cutoff and scored:
            ctx[(domain, model, judge)][retriever] = {s["item_id"]: s for s in scored}
    out: list[dict[str, Any]] = []
    for (domain, model, cjudge), by_ret in sorted(ctx.items()):
        for ajudge in dict.fromkeys(k[0] for k in answers.scores):  # the files' order
            pipes = {
                (setting, system): v
                for (j, setting, system), v in answers.scores.items()
                if j == ajudge and setting in by_ret
            }
            if not pipes:
                continue
            keys = sorted(pipes)
            retrievers = sorted({s for s, _ in keys})
            answered = [set(v) for v in pipes.values()] + [set(by_ret[s]) for s in retrievers]
            queries = sorted(set.intersection(*answered))
            if len(queries) < 2 or len(retrievers) < 2:
                continue
            x = {
                metric: np.asarray([[by_ret[s][q][metric] for q in queries] for s in retrievers])
                for metric in {p for p, _ in PAIRS}
            }
            y = {
                t: np.asarray([[pipes[k][q][n] for q in queries] for k in keys])
                for n, t in enumerate(("cov_y", "den_y"))
            }
            owner = np.asarray([retrievers.index(s) for s, _ in keys])
            # mean over a pipeline's summarizers, per retriever: (retrievers, pipelines)
            per_ret = np.asarray(
                [(owner == i) / (owner == i).sum() for i in range(len(retrievers))]
            )
            nq = len(queries)
            # query weights: the point estimate (every query once), then each resample's counts
            rng = np.random.default_rng(seed)
            draws = rng.integers(0, nq, (n_boot, nq))
            weights = (
                np.vstack(
                    [np.ones((1, nq)), np.stack([np.bincount(d, minlength=nq) for d in draws])]
                    if n_boot
                    else [np.ones((1, nq))]
                )
                / nq
            )

            def means(a: np.ndarray, w: np.ndarray = weights) -> np.ndarray:
                return np.asarray(np.round((a @ w.T).T, 12))  # (1 + resamples, rows)

            point: dict[tuple[str, str, str], float] = {}
            boots: dict[tuple[str, str, str], np.ndarray] = {}
            # each summarizer's pipelines, by retriever (those with two retrievers or more)
            systems = {
                system: [keys.index((s, system)) for s in retrievers if (s, system) in pipes]
                for system in dict.fromkeys(system for _, system in keys)
            }
            systems = {k: v for k, v in systems.items() if len(v) >= 2}
            for metric, target in PAIRS:
                xr, yp = means(x[metric]), means(y[target])
                yr = np.round(yp @ per_ret.T, 12)
                for level, (a, b) in (
                    ("retrievers", (xr, yr)),
                    ("pipelines", (xr[:, owner], yp)),
                ):
                    point[(metric, target, level)] = m.kendall_tau_b(list(a[0]), list(b[0]))
                    boots[(metric, target, level)] = m.kendall_tau_b_rows(a[1:], b[1:])
                if systems:  # the paper's design: one generator, retrievers varied
                    each = np.stack(
                        [
                            m.kendall_tau_b_rows(xr[:, owner[ix]], yp[:, ix])
                            for ix in systems.values()
                        ]
                    )
                    with np.errstate(all="ignore"), warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        mean = np.nanmean(each, axis=0)
                    point[(metric, target, "per_summarizer")] = float(mean[0])
                    boots[(metric, target, "per_summarizer")] = mean[1:]
            base = {
                "domain": domain,
                "model": model,
                "context_judge": cjudge,
                "answer_judge": ajudge,
                "cutoff": cutoff,
                "n_queries": len(queries),
            }
            for (metric, target, level), tau in point.items():
                low, high = _quantiles(list(boots[(metric, target, level)]))
                extra: dict[str, Any] = {}
                if (metric, target, level) == ("coverage", "cov_y", "pipelines"):
                    xs, ys = x[metric].mean(axis=1), y[target].mean(axis=1)
                    extra["points"] = [
                        {
                            "retriever": s,
                            "system": system,
                            "context": round(100 * float(xs[retrievers.index(s)]), 4),
                            "answer": round(100 * float(ys[n]), 4),
                        }
                        for n, (s, system) in enumerate(keys)
                    ]
                out.append(
                    base
                    | extra
                    | {
                        "metric": metric,
                        "target": target,
                        "level": level,
                        "tau": None if math.isnan(tau) else round(tau, 6),
                        "ci_low": None if low is None else round(low, 6),
                        "ci_high": None if high is None else round(high, 6),
                        "n_points": len(keys) if level == "pipelines" else len(retrievers),
                        "n_summarizers": len(systems)
                        if level == "per_summarizer"
                        else len({system for _, system in keys}),
                    }
                )
            joint = {
                k: answers.joint[(ajudge, domain, *k)]
                for k in keys
                if (ajudge, domain, *k) in answers.joint
            }
            if len(joint) < 2:
                continue
            for metric in dict.fromkeys(p for p, _ in PAIRS):
                xr = x[metric].mean(axis=1)
                tau = m.kendall_tau_b(
                    [float(xr[retrievers.index(s)]) for s, _ in joint], list(joint.values())
                )
                out.append(
                    base
                    | {
                        "metric": metric,
                        "target": "joint",
                        "level": "pipelines",
                        "tau": None if math.isnan(tau) else round(tau, 6),
                        "ci_low": None,
                        "ci_high": None,
                        "n_points": len(joint),
                    }
                )
    return out


def summary(rows: Sequence[Mapping[str, Any]], taus: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """For `dvc metrics`: {domain/judge: {retriever@cutoff: {coverage, alpha_ndcg, density}}}
    and {"tau": {domain/context judge/answer judge: {metric->target@level: tau}}}."""
    out: dict[str, Any] = {}
    for r in rows:
        out.setdefault(f"{r['domain']}/{r['judge']}", {})[r["setting"]] = {
            k: None if r[k] is None else round(r[k], 2) for k in CONTEXT_METRICS
        }
    for t in taus:
        where = f"{t['domain']}/{t['context_judge']}/{t['answer_judge']}"
        name = f"{t['metric']}->{t['target']}@{t['level']}"
        out.setdefault("tau", {}).setdefault(where, {})[name] = (
            None if t["tau"] is None else round(t["tau"], 3)
        )
    return out


def run_rows(
    rows: Sequence[dict[str, Any]],
    details: Mapping[tuple[str, ...], list[dict[str, Any]]],
    kappas: Mapping[tuple[str, str, str], float],
) -> list[RunRow]:
    out = []
    for row in rows:
        key = tuple(
            str(row[k]) for k in ("domain", "model", "system", "retriever", "cutoff", "judge")
        )
        numbers = {k: float(row[k]) for k in (*METRICS, "passages", "tokens") if row[k] is not None}
        numbers |= {k: float(row[k]) for k in ("n_queries", *COUNTS)}
        kappa = kappas.get((row["model"], row["judge"], row["domain"]))
        if kappa is not None:
            numbers["kappa"] = kappa
        out.append(
            RunRow(
                key="|".join(key),
                name=" / ".join(str(row[k]) for k in ("retriever", "cutoff", "judge", "domain")),
                metrics=numbers,
                params={
                    k: str(row[k]) for k in ("domain", "retriever", "cutoff", "judge", "model")
                },
                tags={
                    "domain": row["domain"],
                    "setting": row["setting"],
                    "model.name": row["system"],
                    "retriever": row["retriever"],
                    "cutoff": row["cutoff"],
                },
                artifacts={"queries.jsonl": details.get(key, []), "row.json": row},
                model=row["model"],
                judge=row["judge"],
            )
        )
    return out


def tau_run_rows(taus: Sequence[Mapping[str, Any]], plots: Mapping[str, bytes]) -> list[RunRow]:
    """One MLflow run per (domain, context judge, answer judge): each tau and its interval as
    metrics `tau.<context metric>.<answer metric>.<level>` (`.ci_low`, `.ci_high`), with the
    plot of the contexts against the answers."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for t in taus:
        groups[
            tuple(str(t[k]) for k in ("domain", "model", "context_judge", "answer_judge"))
        ].append(t)
    out = []
    for (domain, model, cjudge, ajudge), ts in groups.items():
        numbers: dict[str, float] = {}
        for t in ts:
            name = f"tau.{t['metric']}.{t['target']}.{t['level']}"
            for suffix, key in (("", "tau"), (".ci_low", "ci_low"), (".ci_high", "ci_high")):
                if t[key] is not None:
                    numbers[name + suffix] = float(t[key])
        numbers["n_queries"] = float(ts[0]["n_queries"])
        out.append(
            RunRow(
                key=f"tau|{domain}|{model}|{cjudge}|{ajudge}",
                name=f"tau / {cjudge} contexts vs {ajudge} answers / {domain}",
                metrics=numbers,
                params={
                    "domain": domain,
                    "context_judge": cjudge,
                    "answer_judge": ajudge,
                    "cutoff": str(ts[0]["cutoff"]),
                },
                tags={"domain": domain, "analysis": "tau", "setting": "tau"},
                artifacts={"tau.json": [dict(t) for t in ts]},
                plots=plots,
                model=model,
                judge=cjudge,
            )
        )
    return out
