"""CRUX's scores on the result model (pipeline/core/results.py): the context metrics of each
(retrieval context, cut-off); each judge's agreement with the labels; and whether the context
metrics rank pipelines as their answers' coverage does (Kendall tau).

A context generation holds one retriever's ranking, deep enough for every cut-off; the result
model scores it once per cut-off (`at_cutoffs`: setting `<retriever>@<cutoff>`), so that every
row counts its own queries. Per query, then the mean over queries, x100. A query without
answerable sub-questions is excluded (counted, reason `no answerable sub-question`); a query
whose context at the cut-off holds a verdict the judge could not give is left out (`n_invalid`),
never rated 0; a context a judge did not rate (outside `crux.judge_sample`) is `n_unjudged`.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.benchmarks.crux import metrics as m
from pipeline.benchmarks.crux.contexts import cut
from pipeline.benchmarks.crux.judging import LABELS_SHA, split_target
from pipeline.benchmarks.crux.params import CruxParams, CruxScoring
from pipeline.benchmarks.crux.schema import Collection, Query, QueryView
from pipeline.core.benchmark import Run, RunRow
from pipeline.core.cards import CostStatus, JudgeCard, card, cost_per_1000
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement
from pipeline.core.results import (
    Excluded,
    Invalid,
    ItemScore,
    Metric,
    Outcome,
    ResultRow,
    RowKey,
    Scored,
    join,
)


def _pct(name: str, title: str, hi: float | None = 100.0) -> Metric:
    return Metric(name, title, scale=100.0, digits=4, unit="x100", lo=0.0, hi=hi)


# Per query, macro-averaged over queries, x100; Coverage first (the main metric). alpha-nDCG
# and Density have no fixed top: the ideal is greedy, and a context can be denser than Z*.
METRICS = (
    _pct("coverage", "Cov(Z)"),
    _pct("alpha_ndcg", "alpha-nDCG", hi=None),
    _pct("density", "Den(Z)", hi=None),
    _pct("recall", "Recall"),
    _pct("ndcg", "nDCG"),
)
CONTEXT_METRICS = ("coverage", "alpha_ndcg", "density")
ANSWERED = {"FULL_COVERAGE"}
NO_SUBQUESTION = "no answerable sub-question"


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
    """The judgement's ratings (its targets checked by `check_targets`)."""
    index = {s.qid: i for i, s in enumerate(view.query.subquestions)}
    out = Rated()
    for v in j.verdicts:
        pid, qid = split_target(v.target_id)
        if v.status == "ok":
            out.ratings[(pid, index[qid])] = int(v.label)
        else:
            out.invalid.add((pid, index[qid]))
    return out


def check_targets(view: QueryView, j: Judgement, where: str) -> None:
    """Every verdict rates a passage of the query's collection on one of its sub-questions."""
    qids = {s.qid for s in view.query.subquestions}
    for v in j.verdicts:
        pid, qid = split_target(v.target_id)
        if pid not in view.passages or qid not in qids:
            what = "passage" if pid not in view.passages else "sub-question"
            raise DataError(
                f"verdict on an unknown {what} of query {j.item_id!r} (judge {j.judge})",
                file=where,
                item=j.generation_id,
                field=f"verdicts.{v.target_id}",
            )


def relevance(
    contexts: Mapping[str, Sequence[str]], relevant: Mapping[str, Sequence[str]]
) -> dict[str, tuple[float, float]]:
    """(recall, nDCG) of each context (its passages in rank order, by context id) against its
    query's relevant passages (binary), with ir-measures, in one call; 0 when none is."""
    import ir_measures
    from ir_measures import Qrel, ScoredDoc, nDCG

    recall, ndcg = ir_measures.R @ 10_000, nDCG @ 10_000
    qrels = [Qrel(c, p, 1) for c in contexts for p in relevant[c]]
    run = [
        ScoredDoc(c, p, float(len(ps) - r)) for c, ps in contexts.items() for r, p in enumerate(ps)
    ]
    out = dict.fromkeys(contexts, (0.0, 0.0))
    for metric in ir_measures.iter_calc([recall, ndcg], qrels, run):
        r, n = out[metric.query_id]
        value = float(metric.value)
        out[metric.query_id] = (value, n) if metric.measure == recall else (r, value)
    return out


def is_labels(run: Run) -> bool:
    """Whether the run's judge is the dataset's labels, replayed."""
    return any(j.judge_prompt_sha == LABELS_SHA for j in run.judgements)


def judge_pool(run: Run, qviews: Mapping[str, QueryView]) -> dict[str, Rated]:
    """Per query, every pair the run's judge rated in any context (for its alpha-nDCG ideal)."""
    pool: dict[str, Rated] = defaultdict(Rated)
    for j in run.judgements:
        if j.status != "error":
            r = rated(qviews[j.item_id], j)
            pool[j.item_id].ratings |= r.ratings
            pool[j.item_id].invalid |= r.invalid
    return pool


def at_cutoffs(run: Run, qviews: Mapping[str, QueryView], sc: CruxScoring) -> Run:
    """The run as the result model scores it: each context generation (one retriever's ranking)
    once per cut-off (setting `<retriever>@<cutoff>`, its meta naming the retriever and the
    cut-off), each judgement with it. First the run as read is joined (errors name its
    records: an orphan or duplicate judgement, an unknown query) and every verdict's target
    checked. A judgement without verdicts of a query with sub-questions (the local judge's,
    outside `judge_sample`) is no rating: the context is counted unjudged. What needs more than
    one context goes in the meta too: the judge's pool over the run (`pool`: alpha-nDCG's
    ideal, for a judge other than the labels) and each context's `relevance` (recall and nDCG
    with ir-measures, in one call)."""
    glines, jlines = run.generation_lines, run.judgement_lines
    join(qviews, run.generations, run.judgements, generation_lines=glines,
         judgement_lines=jlines, unjudged="count")  # fmt: skip
    for n, j in enumerate(run.judgements):
        where = jlines[n] if n < len(jlines) else f"judgements #{n + 1}"
        if j.item_id not in qviews:
            raise DataError("judgement of an unknown query", file=where, item=j.generation_id,
                            field="item_id")  # fmt: skip
        check_targets(qviews[j.item_id], j, where)
    pools = None if is_labels(run) else judge_pool(run, qviews)
    gens: dict[str, list[Generation]] = {}  # the run's generation ids -> one per cut-off
    contexts: dict[str, list[str]] = {}
    relevant: dict[str, list[str]] = {}
    for g in run.generations:
        pool = None if pools is None else pools.get(g.item_id, Rated())
        q, passages = qviews[g.item_id].query, qviews[g.item_id].passages
        gens[g.generation_id] = []
        for c in sc.cutoffs:
            meta = g.meta | {"retriever": g.setting, "cutoff": c, "pool": pool}
            each = g.model_copy(update={"setting": f"{g.setting}@{c}", "meta": meta})
            gens[g.generation_id].append(each)
            if g.status == "ok":
                contexts[each.generation_id] = cut(g, q, c, passages).passages
                relevant[each.generation_id] = labelled(q, sc.eta)
    scores = relevance(contexts, relevant)
    for each in (e for es in gens.values() for e in es):
        each.meta["relevance"] = scores.get(each.generation_id)
    rating = [
        n
        for n, j in enumerate(run.judgements)
        if j.verdicts or j.status != "ok" or not qviews[j.item_id].query.subquestions
    ]
    judgements = [
        run.judgements[n].model_copy(
            update={"generation_id": g.generation_id, "setting": g.setting}
        )
        for n in rating
        for g in gens[run.judgements[n].generation_id]
    ]
    return Run(
        run.model,
        run.judge,
        [g for each in gens.values() for g in each],
        judgements,
        [line for line in glines for _ in sc.cutoffs],
        [jlines[n] for n in rating if n < len(jlines) for _ in sc.cutoffs],
    )


def labelled(q: Query, eta: int) -> list[str]:
    """The passages the dataset's labels rate >= eta on some sub-question."""
    return [p for p in q.ratings if m.answered_by(q.ratings[p], eta)]


def context_score(sc: CruxScoring, view: QueryView, g: Generation, j: Judgement) -> Outcome:
    """One query's context at one cut-off (a generation of `at_cutoffs`), by one judge.
    alpha-nDCG's ideal ranking: over the dataset's ratings for the labels, over every pair the
    judge rated for the query (in any context) for another judge, so that a judge is compared
    with its own best. Recall and nDCG: against the passages the labels rate >= eta."""
    q = view.query
    n = len(q.subquestions)
    keys = {"domain": q.domain}
    if n == 0:
        return Excluded(NO_SUBQUESTION, keys)
    ctx = cut(g, q, g.meta["cutoff"], view.passages)
    r = rated(view, j)
    bad = sum(1 for p in ctx.passages for i in range(n) if (p, i) in r.invalid)
    if bad:
        return Invalid("a verdict in the context invalid", bad, keys)
    pool: Rated | None = g.meta["pool"]
    ideal: Callable[[str, int], int]
    if pool is None:
        ideal, relevant = q.rating, labelled(q, sc.eta)
    else:
        ideal = pool.rate
        relevant = list(dict.fromkeys(p for (p, _), v in pool.ratings.items() if v >= sc.eta))
    k = len(ctx.passages)
    cov = m.coverage(ctx.passages, r.rate, n, sc.eta)
    recall, ndcg = g.meta["relevance"]
    values = {
        "coverage": cov,
        "alpha_ndcg": m.alpha_ndcg(ctx.passages, r.rate, relevant, ideal, n, sc.eta, sc.alpha, k),
        "density": m.density(
            cov, ctx.tokens, 1.0, sum(view.passages[p].tokens for p in q.zstar), sc.w
        ),
        "recall": recall,
        "ndcg": ndcg,
    }
    detail = {"passages": k, "tokens": ctx.tokens}
    return Scored([ItemScore(q.item_id, values=values, keys=keys, detail=detail)])


# ---------------------------------------------------------------- judges vs the labels


def label_agreement(
    section: CruxParams, dataset: Sequence[Collection], runs: Sequence[Run], seed: int
) -> list[dict[str, Any]]:
    """Each judge that is not the labels against the labels, on every pair it rated (a pair in
    several contexts counts once), per domain and over all: Cohen's kappa of the answerable
    decision (rating >= eta), with a 95% bootstrap interval over pairs. Pairs, not contexts:
    it reads the judgements (their targets checked when the runs were scored)."""
    from pipeline.metrics.agreement import bootstrap_ci, cohen_kappa

    eta = section.scoring.eta
    qviews = views(dataset)
    out = []
    for run in runs:
        if is_labels(run):
            continue
        pairs: dict[tuple[str, str, int], tuple[int, int]] = {}
        scores: dict[tuple[str, str, int], tuple[int, int]] = {}  # the 0-5 ratings
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
                scores[(j.item_id, pid, i)] = (rating, view.query.rating(pid, i))
        domain_of = {item: qviews[item].query.domain for item, _, _ in pairs}
        domains = sorted(set(domain_of.values()))
        overall = [*domains, "all"] if len(domains) > 1 else domains
        for domain in overall:
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
            if domain == overall[-1]:  # the judge's card: over all its pairs
                out[-1]["card"] = label_card(section, run, keys, pairs, scores, seed).model_dump()
    return out


def judge_cost(run: Run) -> tuple[CostStatus, float | None, str]:
    """Dollars per 1,000 ratings from the recorded usage of the run's judgements: 0 when they
    made no model call, unknown when a call came back without token usage."""
    js = run.judgements
    n = sum(len(j.verdicts) for j in js)
    if all(j.usage.requests == 0 and j.usage.cost_usd == 0 for j in js):
        return cost_per_1000(0.0, n, free=True, note="made no model call")
    blind = sum(
        1 for j in js if j.usage.requests > 0 and j.usage.input_tokens + j.usage.output_tokens == 0
    )
    if blind:
        return cost_per_1000(None, n, note=f"{blind} judgements came without token usage")
    return cost_per_1000(sum(j.usage.cost_usd for j in js), n)


def label_card(
    section: CruxParams,
    run: Run,
    keys: Sequence[tuple[str, str, int]],
    pairs: Mapping[tuple[str, str, int], tuple[int, int]],
    scores: Mapping[tuple[str, str, int], tuple[int, int]],
    seed: int,
) -> JudgeCard:
    """The judge's card against the labels (pipeline/core/cards.py): kappa of the answerable
    decision with its interval over pairs, Pearson of the 0-5 ratings, cost; no linking (a
    rating names no evidence). Its throughput is the judge stage's (run state)."""
    from pipeline.metrics.agreement import pearson

    r = pearson([scores[k][0] for k in keys], [scores[k][1] for k in keys]) if keys else math.nan
    return card(
        judge=run.judge,
        reference="labels",
        unit="passage rating on one sub-question",
        judge_labels=[pairs[k][0] for k in keys],
        reference_labels=[pairs[k][1] for k in keys],
        categories=[0, 1],
        kappa_kind=f"Cohen, answerable or not (rating >= {section.scoring.eta})",
        pearson=None if math.isnan(r) else r,
        n_resamples=section.scoring.bootstrap_resamples,
        seed=seed,
        cost=judge_cost(run),
        throughput_stage=None,
    )


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
PLOTTED = ("coverage", "cov_y", "pipelines")  # the tau whose pipelines the report plots


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


# (domain, context model, context judge) -> retriever -> query -> the context's metric values
ContextScores = dict[tuple[str, str, str], dict[str, dict[str, Mapping[str, float | None]]]]


def context_scores(
    rows: Sequence[ResultRow], scores: Mapping[RowKey, Sequence[ItemScore]], cutoff: str
) -> ContextScores:
    """The item scores of the rows at `cutoff` (those with a scored query), for `tau_rows`."""
    out: ContextScores = defaultdict(dict)
    for r in rows:
        items = scores.get(r.key, ())
        if r.extra["cutoff"] == cutoff and items:
            by_query = {s.item_id: s.values for s in items}
            out[(r.keys["domain"], r.model, r.judge)][r.extra["retriever"]] = by_query
    return out


def _quantiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return None, None
    return float(np.quantile(kept, 0.025)), float(np.quantile(kept, 0.975))


def _weights(nq: int, n_boot: int, seed: int) -> np.ndarray:
    """Query weights (rows): the point estimate (every query once), then each resample's."""
    draws = np.random.default_rng(seed).integers(0, nq, (n_boot, nq))
    return np.vstack([np.ones(nq), *(np.bincount(d, minlength=nq) for d in draws)]) / nq


def _taus(
    x: Mapping[str, np.ndarray],
    y: Mapping[str, np.ndarray],
    owner: np.ndarray,
    systems: Mapping[str, list[int]],
    weights: np.ndarray,
) -> dict[tuple[str, str, str], tuple[float, np.ndarray]]:
    """(metric, target, level) -> (tau, its bootstrap resamples). `x`: retrievers x queries,
    `y`: pipelines x queries; `owner`: each pipeline's retriever; `systems`: each summarizer's
    pipelines (two retrievers or more)."""
    n_ret = x[PAIRS[0][0]].shape[0]
    per_ret = np.asarray([(owner == i) / (owner == i).sum() for i in range(n_ret)])
    out = {}
    for metric, target in PAIRS:
        # weighted means over queries, (1 + resamples) x (retrievers | pipelines)
        xr = np.round((x[metric] @ weights.T).T, 12)
        yp = np.round((y[target] @ weights.T).T, 12)
        yr = np.round(yp @ per_ret.T, 12)  # each retriever's answers, over its summarizers
        for level, a, b in (("retrievers", xr, yr), ("pipelines", xr[:, owner], yp)):
            out[(metric, target, level)] = (
                m.kendall_tau_b(list(a[0]), list(b[0])),
                m.kendall_tau_b_rows(a[1:], b[1:]),
            )
        if systems:  # the paper's design: one generator, retrievers varied
            each = [m.kendall_tau_b_rows(xr[:, owner[ix]], yp[:, ix]) for ix in systems.values()]
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(np.stack(each), axis=0)
            out[(metric, target, "per_summarizer")] = (float(mean[0]), mean[1:])
    return out


def _r6(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 6)


def tau_rows(
    section: CruxParams, contexts: ContextScores, answers: Answers, seed: int
) -> list[dict[str, Any]]:
    """Kendall tau-b between each context metric (one context judge's, at `answers.cutoff`:
    `context_scores`) and the answers' Cov(y) and Den(y), per domain, at the three `LEVELS` (a
    pipeline's context score is its retriever's); every score a mean over the queries every
    pipeline answered, with a 95% bootstrap interval over those queries; and against SummHay's
    Joint (pooled per pipeline, no interval)."""
    out: list[dict[str, Any]] = []
    for (domain, model, cjudge), by_ret in sorted(contexts.items()):
        for ajudge in dict.fromkeys(k[0] for k in answers.scores):  # the files' order
            pipes = {
                (setting, system): v
                for (j, setting, system), v in answers.scores.items()
                if j == ajudge and setting in by_ret
            }
            keys = sorted(pipes)
            retrievers = sorted({s for s, _ in keys})
            answered = [set(v) for v in pipes.values()] + [set(by_ret[s]) for s in retrievers]
            queries = sorted(set.intersection(*answered)) if answered else []
            if len(queries) < 2 or len(retrievers) < 2:
                continue
            metrics = dict.fromkeys(p for p, _ in PAIRS)
            x = {k: np.asarray([[by_ret[s][q][k] for q in queries] for s in retrievers])
                 for k in metrics}  # fmt: skip
            y = {t: np.asarray([[pipes[k][q][n] for q in queries] for k in keys])
                 for n, t in enumerate(("cov_y", "den_y"))}  # fmt: skip
            owner = np.asarray([retrievers.index(s) for s, _ in keys])
            systems = {
                system: [keys.index((s, system)) for s in retrievers if (s, system) in pipes]
                for system in dict.fromkeys(system for _, system in keys)
            }
            systems = {k: v for k, v in systems.items() if len(v) >= 2}
            weights = _weights(len(queries), section.scoring.bootstrap_resamples, seed)
            base = {"domain": domain, "model": model, "context_judge": cjudge,
                    "answer_judge": ajudge, "cutoff": section.answers.cutoff,
                    "n_queries": len(queries)}  # fmt: skip
            for (metric, target, level), (tau, boots) in _taus(
                x, y, owner, systems, weights
            ).items():
                low, high = _quantiles(list(boots))
                points = []
                if (metric, target, level) == PLOTTED:
                    xs, ys = x[metric].mean(axis=1), y[target].mean(axis=1)
                    points = [
                        {"retriever": s, "system": system,
                         "context": round(100 * float(xs[retrievers.index(s)]), 4),
                         "answer": round(100 * float(ys[n]), 4)}
                        for n, (s, system) in enumerate(keys)
                    ]  # fmt: skip
                each = len(systems) if level == "per_summarizer" else len({s for _, s in keys})
                out.append(
                    base
                    | ({"points": points} if points else {})
                    | {"metric": metric, "target": target, "level": level, "tau": _r6(tau),
                       "ci_low": _r6(low), "ci_high": _r6(high),
                       "n_points": len(keys) if level == "pipelines" else len(retrievers),
                       "n_summarizers": each}
                )  # fmt: skip
            joint = {k: answers.joint[(ajudge, domain, *k)] for k in keys
                     if (ajudge, domain, *k) in answers.joint}  # fmt: skip
            if len(joint) < 2:
                continue
            for metric in metrics:
                xr = x[metric].mean(axis=1)
                tau = m.kendall_tau_b(
                    [float(xr[retrievers.index(s)]) for s, _ in joint], list(joint.values())
                )
                out.append(
                    base
                    | {"metric": metric, "target": "joint", "level": "pipelines",
                       "tau": _r6(tau), "ci_low": None, "ci_high": None, "n_points": len(joint)}
                )  # fmt: skip
    return out


def tau_summary(taus: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """For `dvc metrics`: {"tau": {domain/context judge/answer judge: {metric->target@level:
    tau}}} (nothing without taus)."""
    out: dict[str, dict[str, float | None]] = {}
    for t in taus:
        where = f"{t['domain']}/{t['context_judge']}/{t['answer_judge']}"
        name = f"{t['metric']}->{t['target']}@{t['level']}"
        out.setdefault(where, {})[name] = None if t["tau"] is None else round(t["tau"], 3)
    return {"tau": out} if out else {}


def tau_run_rows(taus: Sequence[Mapping[str, Any]], plots: Mapping[str, bytes]) -> list[RunRow]:
    """CRUX's analysis runs, one per (domain, context judge, answer judge): each tau and its
    interval as metrics `tau.<context metric>.<answer metric>.<level>` (`.ci_low`, `.ci_high`),
    with the plot of the contexts against the answers."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for t in taus:
        groups[(t["domain"], t["model"], t["context_judge"], t["answer_judge"])].append(t)
    out = []
    for (domain, model, cjudge, ajudge), ts in groups.items():
        numbers = {"n_queries": float(ts[0]["n_queries"])} | {
            f"tau.{t['metric']}.{t['target']}.{t['level']}{suffix}": float(t[key])
            for t in ts
            for suffix, key in (("", "tau"), (".ci_low", "ci_low"), (".ci_high", "ci_high"))
            if t[key] is not None
        }
        params = {"domain": domain, "context_judge": cjudge, "answer_judge": ajudge,
                  "cutoff": str(ts[0]["cutoff"])}  # fmt: skip
        out.append(
            RunRow(
                key=f"tau|{domain}|{model}|{cjudge}|{ajudge}",
                name=f"tau / {cjudge} contexts vs {ajudge} answers / {domain}",
                metrics=numbers,
                params=params,
                tags={"domain": domain, "analysis": "tau", "setting": "tau"},
                artifacts={"tau.json": [dict(t) for t in ts]},
                plots=plots,
                model=model,
                judge=cjudge,
            )
        )
    return out
