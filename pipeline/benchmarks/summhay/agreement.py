"""How far a SummHay judge can be trusted: its agreement with people, and with other judges.

The SummHay release holds 200 summaries (100 news, 100 conversation) whose 1,419 insight-level
coverage labels were made by professional annotators, with six LLM judges' predictions on the
same insights (`eval_benchmark_data.json`). For each judge this module computes, against the
human labels:

- `pearson` (the paper's "coverage correlation"): insight-level Pearson correlation of the
  coverage scores, full / partial / none mapped to 1 / 0.5 / 0;
- `linking_accuracy` (percent): among insights where the annotators chose a covering bullet and
  the judge named one bullet, how often it is the same bullet. Annotators count bullets from 0,
  judges from 1. An answer naming several bullets at once (a list) links to no single bullet:
  it is left out and counted in `n_multi_link`. This reproduces the paper's Table 1;
- `cohen_kappa` (3 classes, unweighted; the MLflow metric `kappa`), `cohen_kappa_linear`,
  `cohen_kappa_quadratic`, `exact_agreement` and `spearman`;
- a 95% percentile-bootstrap interval for each, resampling insights (seeded).

Judge vs judge: on the judgements the pipeline holds for the same summaries (the 78 released
news systems, 336 insights each), the same statistics between any two judges, pairing verdicts
by (generation, insight).

Bias (the paper's Table 4): per summarizer, the mean of (judge coverage - human coverage) over
its annotated summaries; the correlation of the judge's summary-level coverage with bullet
length (words per bullet) and of the delta with bullet length.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from pipeline.benchmarks.summhay.params import SummhayParams
from pipeline.benchmarks.summhay.scoring import count_words, extract_bullets
from pipeline.core.benchmark import AgreementResult, Context, HumanAgreement, JudgeInfo, RunRow
from pipeline.core.cards import CostStatus, JudgeCard, card, card_metrics, cost_per_1000
from pipeline.core.config import Params
from pipeline.core.errors import DataError
from pipeline.core.parallel import fork_map
from pipeline.core.records import Generation, Judgement
from pipeline.data.haystacks import Insight, Subtopic
from pipeline.metrics.agreement import (
    bootstrap_ci,
    cohen_kappa,
    exact_agreement,
    pearson,
    spearman,
)

log = logging.getLogger(__name__)

HUMAN_LABELS = {"fully_covered": "FULL", "partially_covered": "PARTIAL", "not_covered": "NO"}
JUDGE_LABELS = {"FULL_COVERAGE": "FULL", "PARTIAL_COVERAGE": "PARTIAL", "NO_COVERAGE": "NO"}
CLASSES = ["NO", "PARTIAL", "FULL"]  # ordered, for weighted kappa
SCORE = {"NO": 0.0, "PARTIAL": 0.5, "FULL": 1.0}
PREDICTION_PREFIX = "predictions_"
NO_SELECTION = "no_selection"
_SUMMARIZER_RE = re.compile(r"^summary_subtopic_(?:(.+)_)?([^_]+)$")


# ---------------------------------------------------------------- the labels file


@dataclass(frozen=True)
class Label:
    """One rater's verdict on one insight: its class and the bullet it points to (1-based).

    `link` is None when no bullet was chosen; `multi_link` marks an answer naming several
    bullets at once.
    """

    cls: str
    link: int | None
    multi_link: bool = False


@dataclass(frozen=True)
class Sample:
    index: int
    sample_id: str  # "<index>:<subtopic_id>:<summkey>", the name used in errors and rows
    subtopic_id: str
    summkey: str
    domain: str
    summary: list[str]
    insights: list[tuple[str, str]]  # (insight_id, text), in the file's order
    human: dict[str, Label]
    predictions: dict[str, dict[str, Label]]  # judge -> insight id -> label

    @property
    def bullets(self) -> list[str]:
        return extract_bullets("\n".join(self.summary))

    @property
    def summarizer(self) -> str:
        m = _SUMMARIZER_RE.match(self.summkey)
        return m.group(2) if m else self.summkey


def _need(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], ctx: _Ctx) -> Any:
    if key not in obj:
        raise DataError(f"missing field {key!r}", file=ctx.file, item=ctx.item, field=ctx.at(key))
    value = obj[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataError(
            f"expected {names}, got {type(value).__name__}",
            file=ctx.file,
            item=ctx.item,
            field=ctx.at(key),
        )
    return value


@dataclass(frozen=True)
class _Ctx:
    file: str
    item: str
    prefix: str = ""

    def at(self, key: str | int) -> str:
        part = f"[{key}]" if isinstance(key, int) else key
        if not self.prefix:
            return str(part)
        return f"{self.prefix}{part}" if isinstance(key, int) else f"{self.prefix}.{part}"

    def sub(self, key: str | int) -> _Ctx:
        return _Ctx(self.file, self.item, self.at(key))


def _human_label(raw: Mapping[str, Any], n_bullets: int, ctx: _Ctx) -> Label:
    coverage = _need(raw, "coverage", str, ctx)
    if coverage not in HUMAN_LABELS:
        raise DataError(
            f"unknown label {coverage!r}; expected one of {', '.join(HUMAN_LABELS)}",
            file=ctx.file,
            item=ctx.item,
            field=ctx.at("coverage"),
        )
    candidate = _need(raw, "candidate_id", (str, int), ctx)
    cls = HUMAN_LABELS[coverage]
    if candidate == NO_SELECTION:
        return Label(cls, None)
    text = str(candidate).strip()
    if not text.isdigit() or not 0 <= int(text) < n_bullets:
        raise DataError(
            f"candidate_id {candidate!r} is neither {NO_SELECTION!r} nor a 0-based bullet index"
            f" (0..{n_bullets - 1})",
            file=ctx.file,
            item=ctx.item,
            field=ctx.at("candidate_id"),
        )
    return Label(cls, int(text) + 1)  # annotators count from 0, judges from 1


def _judge_label(raw: Mapping[str, Any], ctx: _Ctx) -> Label:
    coverage = _need(raw, "coverage", str, ctx)
    if coverage not in JUDGE_LABELS:
        raise DataError(
            f"unknown label {coverage!r}; expected one of {', '.join(JUDGE_LABELS)}",
            file=ctx.file,
            item=ctx.item,
            field=ctx.at("coverage"),
        )
    if "bullet_id" not in raw:
        raise DataError(
            "missing field 'bullet_id'", file=ctx.file, item=ctx.item, field=ctx.at("bullet_id")
        )
    link = raw["bullet_id"]
    if isinstance(link, list):
        return Label(JUDGE_LABELS[coverage], None, multi_link=True)
    if isinstance(link, int) and not isinstance(link, bool):
        return Label(JUDGE_LABELS[coverage], link)
    if isinstance(link, str) and link.strip().isdigit():
        return Label(JUDGE_LABELS[coverage], int(link))
    return Label(JUDGE_LABELS[coverage], None)  # "NA" and the like: no bullet chosen


def parse_labels(raw: Any, file: str) -> list[Sample]:
    """The human-annotated summaries (the labels file's content), validated: every error names
    the file, the sample and the field."""
    if not isinstance(raw, list) or not raw:
        raise DataError("expected a non-empty JSON list of annotated summaries", file=file)
    samples = []
    seen: set[tuple[str, str]] = set()
    for index, obj in enumerate(raw):
        if not isinstance(obj, dict):
            raise DataError("expected an object", file=file, item=f"sample {index}")
        sub_id = obj.get("subtopic_id")
        key = obj.get("summkey")
        item = f"sample {index} ({sub_id}, {key})"
        ctx = _Ctx(file, item)
        sub_id = _need(obj, "subtopic_id", str, ctx)
        key = _need(obj, "summkey", str, ctx)
        if (sub_id, key) in seen:
            raise DataError("the same summary is annotated twice", file=file, item=item)
        seen.add((sub_id, key))
        summary = _need(obj, "summary", list, ctx)
        if not summary or not all(isinstance(line, str) for line in summary):
            raise DataError(
                "expected a non-empty list of lines", file=file, item=item, field="summary"
            )
        n_bullets = len(extract_bullets("\n".join(summary)))
        insights = []
        for i, ins in enumerate(_need(obj, "reference_insights", list, ctx)):
            ictx = ctx.sub("reference_insights").sub(i)
            if not isinstance(ins, dict):
                raise DataError("expected an object", file=file, item=item, field=ictx.prefix)
            insights.append((_need(ins, "insight_id", str, ictx), _need(ins, "insight", str, ictx)))
        ids = [i for i, _ in insights]
        if len(set(ids)) != len(ids) or not ids:
            raise DataError(
                "insight ids must be present and unique",
                file=file,
                item=item,
                field="reference_insights",
            )
        human: dict[str, Label] = {}
        for i, ann in enumerate(_need(obj, "annotation", list, ctx)):
            actx = ctx.sub("annotation").sub(i)
            if not isinstance(ann, dict):
                raise DataError("expected an object", file=file, item=item, field=actx.prefix)
            iid = _need(ann, "insight_id", str, actx)
            if iid not in ids:
                raise DataError(
                    f"insight {iid!r} is not among the sample's reference_insights",
                    file=file,
                    item=item,
                    field=actx.at("insight_id"),
                )
            if iid in human:
                raise DataError(
                    f"insight {iid!r} is annotated twice",
                    file=file,
                    item=item,
                    field=actx.at("insight_id"),
                )
            human[iid] = _human_label(ann, n_bullets, actx)
        missing = [i for i in ids if i not in human]
        if missing:
            raise DataError(
                f"{len(missing)} reference insight(s) have no annotation, e.g. {missing[0]!r}",
                file=file,
                item=item,
                field="annotation",
            )
        predictions: dict[str, dict[str, Label]] = {}
        for field_name in sorted(k for k in obj if k.startswith(PREDICTION_PREFIX)):
            judge = field_name[len(PREDICTION_PREFIX) :]
            by_id: dict[str, Label] = {}
            for i, pred in enumerate(_need(obj, field_name, list, ctx)):
                pctx = ctx.sub(field_name).sub(i)
                if not isinstance(pred, dict):
                    raise DataError("expected an object", file=file, item=item, field=pctx.prefix)
                iid = _need(pred, "insight_id", str, pctx)
                if iid not in ids or iid in by_id:
                    raise DataError(
                        f"insight {iid!r} is not among the sample's reference_insights"
                        if iid not in ids
                        else f"insight {iid!r} is predicted twice",
                        file=file,
                        item=item,
                        field=pctx.at("insight_id"),
                    )
                by_id[iid] = _judge_label(pred, pctx)
            if set(by_id) != set(ids):
                raise DataError(
                    f"predictions cover {len(by_id)} of the {len(ids)} insights",
                    file=file,
                    item=item,
                    field=field_name,
                )
            predictions[judge] = by_id
        topic_fn = obj.get("topic_fn")
        samples.append(
            Sample(
                index=index,
                sample_id=f"{index}:{sub_id}:{key}",
                subtopic_id=sub_id,
                summkey=key,
                domain="conversation" if topic_fn else "news",
                summary=list(summary),
                insights=insights,
                human=human,
                predictions=predictions,
            )
        )
    judges = {frozenset(s.predictions) for s in samples}
    if len(judges) > 1:
        first, other = sorted(judges, key=len)[:2]
        raise DataError(
            "samples carry different judges' predictions: "
            + ", ".join(sorted(first.symmetric_difference(other))),
            file=file,
            field=PREDICTION_PREFIX + "*",
        )
    return samples


def published_judges(samples: Sequence[Sample]) -> list[str]:
    return sorted(samples[0].predictions) if samples else []


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Pair:
    """Aligned labels of a judge and a reference on the same insights."""

    judge: list[Label]
    reference: list[Label]
    n_invalid: int = 0  # judge verdicts that could not be used (left out, counted)


def _linking(judge: Sequence[Label], ref: Sequence[Label]) -> tuple[np.ndarray, int]:
    """1/0 per insight where both chose one bullet; and the count of multi-bullet answers."""
    hits = []
    multi = 0
    for j, r in zip(judge, ref, strict=True):
        if r.link is None:
            continue
        if j.multi_link:
            multi += 1
            continue
        if j.link is None:
            continue
        hits.append(1.0 if j.link == r.link else 0.0)
    return np.asarray(hits, dtype=float), multi


def _ci_fields(
    name: str,
    stat: Callable[..., float],
    columns: Sequence[np.ndarray],
    n_resamples: int,
    seed: int,
    scale: float = 1.0,
) -> dict[str, float | None]:
    if len(columns[0]) == 0:
        return {name: None, f"{name}_ci_low": None, f"{name}_ci_high": None}

    def num(x: float) -> float | None:
        return None if math.isnan(x) else x * scale

    if n_resamples == 0:
        value = num(stat(*columns))
        return {name: value, f"{name}_ci_low": None, f"{name}_ci_high": None}
    ci = bootstrap_ci(stat, *columns, n_resamples=n_resamples, seed=seed)

    return {name: num(ci.estimate), f"{name}_ci_low": num(ci.low), f"{name}_ci_high": num(ci.high)}


def _kappa(w: str | None) -> Callable[[np.ndarray, np.ndarray], float]:
    def stat(a: np.ndarray, b: np.ndarray) -> float:
        return cohen_kappa(a, b, weights=w, categories=[0, 1, 2])  # type: ignore[arg-type]

    return stat


def compare(pair: Pair, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """All agreement statistics of one judge against one reference, with bootstrap CIs."""
    if not pair.judge:
        raise ValueError("no insights to compare")
    code = {c: i for i, c in enumerate(CLASSES)}
    jc = np.asarray([code[x.cls] for x in pair.judge])
    rc = np.asarray([code[x.cls] for x in pair.reference])
    js = np.asarray([SCORE[x.cls] for x in pair.judge])
    rs = np.asarray([SCORE[x.cls] for x in pair.reference])
    hits, multi = _linking(pair.judge, pair.reference)
    row: dict[str, Any] = {"n": len(pair.judge), "n_invalid": pair.n_invalid}
    row |= _ci_fields("pearson", pearson, [js, rs], n_resamples, seed)
    row |= _ci_fields("spearman", spearman, [js, rs], n_resamples, seed)
    row |= _ci_fields("cohen_kappa", _kappa(None), [jc, rc], n_resamples, seed)
    row |= _ci_fields("cohen_kappa_linear", _kappa("linear"), [jc, rc], n_resamples, seed)
    row |= _ci_fields("cohen_kappa_quadratic", _kappa("quadratic"), [jc, rc], n_resamples, seed)
    row |= _ci_fields("exact_agreement", exact_agreement, [jc, rc], n_resamples, seed)
    row |= _ci_fields(
        "linking_accuracy", lambda h: float(np.mean(h)), [hits], n_resamples, seed, scale=100.0
    )
    row["n_linked"] = len(hits)
    row["n_multi_link"] = multi
    row["coverage_judge"] = float(js.mean() * 100)
    row["coverage_reference"] = float(rs.mean() * 100)
    row["coverage_delta"] = row["coverage_judge"] - row["coverage_reference"]
    return row


def compare_or_empty(pair: Pair, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """`compare`, or a row of counts with no statistics when no verdict was usable."""
    if pair.judge:
        return compare(pair, n_resamples, seed)
    log.warning("no usable verdicts (%d invalid): the row carries counts only", pair.n_invalid)
    empty: dict[str, Any] = {"n": 0, "n_invalid": pair.n_invalid}
    for k in STATS:
        empty |= {k: None, f"{k}_ci_low": None, f"{k}_ci_high": None}
    none = dict.fromkeys(("coverage_judge", "coverage_reference", "coverage_delta"))
    return empty | none | {"n_linked": 0, "n_multi_link": 0}


STATS = (
    "pearson",
    "spearman",
    "cohen_kappa",
    "cohen_kappa_linear",
    "cohen_kappa_quadratic",
    "exact_agreement",
    "linking_accuracy",
)


def human_pair(samples: Sequence[Sample], judge: Mapping[str, Mapping[str, Label | None]]) -> Pair:
    """A judge's labels (sample id -> insight id -> label; None = invalid) against the humans."""
    js: list[Label] = []
    rs: list[Label] = []
    invalid = 0
    for s in samples:
        preds = judge.get(s.sample_id)
        if preds is None:
            continue
        for iid, _ in s.insights:
            if iid not in preds:
                continue
            label = preds[iid]
            if label is None:
                invalid += 1
                continue
            js.append(label)
            rs.append(s.human[iid])
    return Pair(js, rs, invalid)


def published_predictions(
    samples: Sequence[Sample], judge: str
) -> dict[str, dict[str, Label | None]]:
    return {s.sample_id: dict(s.predictions[judge]) for s in samples}


# ---------------------------------------------------------------- bias (Table 4)


def bias(
    samples: Sequence[Sample], judge: Mapping[str, Mapping[str, Label | None]]
) -> dict[str, Any]:
    """Per-summarizer coverage delta (judge - human, 0-1) and the length correlations."""
    per_summarizer: dict[str, list[float]] = defaultdict(list)
    lengths: list[float] = []
    scores: list[float] = []
    deltas: list[float] = []
    for s in samples:
        preds = judge.get(s.sample_id)
        if not preds:
            continue
        pairs = [(preds.get(i), s.human[i]) for i, _ in s.insights]
        usable = [(j, h) for j, h in pairs if j is not None]
        if not usable:
            continue
        auto = float(np.mean([SCORE[j.cls] for j, _ in usable]))
        manual = float(np.mean([SCORE[h.cls] for _, h in usable]))
        bullets = s.bullets
        words = sum(count_words(b) for b in bullets)
        length = words / len(bullets) if bullets else 0.0
        per_summarizer[s.summarizer].append(auto - manual)
        lengths.append(length)
        scores.append(auto)
        deltas.append(auto - manual)
    by = {k: float(np.mean(v)) for k, v in sorted(per_summarizer.items())}

    def corr(x: list[float], y: list[float]) -> float | None:
        value = pearson(x, y) if len(x) >= 2 else math.nan
        return None if math.isnan(value) else value

    return {
        "delta_by_summarizer": by,
        "n_by_summarizer": {k: len(v) for k, v in sorted(per_summarizer.items())},
        "delta_mean": float(np.mean(list(by.values()))) if by else None,
        "length_score_corr": corr(lengths, scores),
        "length_delta_corr": corr(lengths, deltas),
    }


# ---------------------------------------------------------------- judge vs judge


def judge_pairs(
    verdicts: Mapping[str, Mapping[tuple[str, str], Label | None]],
) -> list[tuple[str, str, Pair]]:
    """Every two judges' labels on the insights both judged: (judge, reference, pair)."""
    out = []
    for a, b in combinations(sorted(verdicts), 2):
        va, vb = verdicts[a], verdicts[b]
        shared = sorted(set(va) & set(vb))
        ja: list[Label] = []
        jb: list[Label] = []
        invalid = 0
        for key in shared:
            la, lb = va[key], vb[key]
            if la is None or lb is None:
                invalid += 1
                continue
            ja.append(la)
            jb.append(lb)
        if ja:
            out.append((a, b, Pair(ja, jb, invalid)))
    return out


# ---------------------------------------------------------------- project judges


def _label_of_verdict(label: str, link: int | str | None, ok: bool) -> Label | None:
    if not ok or label not in JUDGE_LABELS:
        return None
    cls = JUDGE_LABELS[label]
    if isinstance(link, int) and cls != "NO":
        return Label(cls, link)
    return Label(cls, None)


ANNOTATED = "annotated:"


def annotated_inputs(samples: Sequence[Sample]) -> tuple[dict[str, Subtopic], list[Generation]]:
    """The annotated summaries as Subtopics (items) and Generations, for the project's judges."""
    gens = []
    subs = {}
    for s in samples:
        item = f"{ANNOTATED}{s.sample_id}"
        gens.append(
            Generation(
                benchmark="summhay",
                item_id=item,
                model="annotated",
                system=s.summarizer,
                setting="annotated",
                status="ok",
                text="\n".join(s.summary),
            )
        )
        subs[item] = Subtopic(
            item_id=item,
            subtopic_id=s.subtopic_id,
            name="",
            subtopic="",
            query="",
            insights=[Insight(insight_id=i, name="", text=t, gold_docs=[]) for i, t in s.insights],
            retriever_scores={},
        )
    return subs, gens


def annotated_labels(judgements: Sequence[Judgement]) -> dict[str, dict[str, Label | None]]:
    """A project judge's labels on the annotated summaries: sample id -> insight id -> label."""
    out: dict[str, dict[str, Label | None]] = {}
    for j in judgements:
        out[j.item_id.removeprefix(ANNOTATED)] = {
            v.target_id: _label_of_verdict(v.label, v.link, v.status == "ok") for v in j.verdicts
        }
    return out


def pipeline_labels(judgements: Sequence[Judgement]) -> dict[tuple[str, str], Label | None]:
    """A judge's labels on the pipeline's outputs: (generation id, insight id) -> label."""
    out: dict[tuple[str, str], Label | None] = {}
    for j in judgements:
        if j.status == "error":
            continue
        for v in j.verdicts:
            out[(j.generation_id, v.target_id)] = _label_of_verdict(
                v.label, v.link, v.status == "ok"
            )
    return out


# ---------------------------------------------------------------- the judge card


def judge_cost(info: JudgeInfo) -> tuple[CostStatus, float | None, str]:
    """A judge's cost per 1,000 insight verdicts, from the recorded cost of its calls here."""
    if info.free:
        return cost_per_1000(0.0, info.n_judgements, free=True, note="calls no paid model")
    if info.cost_usd is None:
        return cost_per_1000(None, 0, note="replayed from the release: its cost was not recorded")
    if info.usage_missing:
        note = f"{info.usage_missing} answers came without token usage"
        return cost_per_1000(None, 0, note=note)
    return cost_per_1000(info.cost_usd, info.n_judgements)


def judge_card(
    name: str, pair: Pair, row: Mapping[str, Any], info: JudgeInfo, n_boot: int, seed: int
) -> JudgeCard:
    """The judge's card against the human labels (pipeline/core/cards.py): kappa of the three
    classes with its interval over insights, Pearson, linking accuracy, cost, throughput."""
    return card(
        judge=name,
        reference="human",
        unit="insight verdict",
        judge_labels=[x.cls for x in pair.judge],
        reference_labels=[x.cls for x in pair.reference],
        categories=CLASSES,
        kappa_kind="Cohen, 3 classes (full / partial / none), unweighted",
        pearson=row.get("pearson"),
        n_resamples=n_boot,
        seed=seed,
        cost=judge_cost(info),
        throughput_stage=info.timing_stage,
        linking=(row.get("linking_accuracy"), int(row.get("n_linked", 0))),
    )


# ---------------------------------------------------------------- the rows


ROW_ID = ("benchmark", "judge", "reference")


def agreement_rows(
    params: Params,
    section: SummhayParams,
    samples: Sequence[Sample],
    judged: Mapping[str, Mapping[str, Mapping[str, Label | None]]],
    info: Mapping[str, JudgeInfo],
    pipeline: Mapping[str, Mapping[tuple[str, str], Label | None]],
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Rows (every judge against people, then every two judges on the pipeline's outputs) and
    each judge's bias analysis."""
    cfg = section.agreement
    n_boot, seed = cfg.bootstrap_resamples, params.seed
    # The bootstrap intervals are most of this stage's time: each row's on its own core.
    humans = [(name, human_pair(samples, labels)) for name, labels in judged.items()]

    def human_stats(job: tuple[str, Pair]) -> tuple[dict[str, Any], dict[str, Any]]:
        name, pair = job
        stats = compare_or_empty(pair, n_boot, seed)
        return stats, judge_card(name, pair, stats, info[name], n_boot, seed).model_dump()

    pairs = []
    for a, b, pair in judge_pairs({j: v for j, v in pipeline.items() if v}):
        # A replayed judge is the natural reference for a judge that scores anew.
        a_pub = params.judges[a].provider == "published"
        judge_name, ref = (b, a) if a_pub else (a, b)
        if a_pub:
            pair = Pair(pair.reference, pair.judge, pair.n_invalid)
        pairs.append((judge_name, ref, pair))
    human_done = fork_map(human_stats, humans)
    pair_done = fork_map(lambda job: compare_or_empty(job[2], n_boot, seed), pairs)

    rows: list[dict[str, Any]] = []
    biases: dict[str, dict[str, Any]] = {}
    for (name, _), (stats, card_dump) in zip(humans, human_done, strict=True):
        labels = judged[name]
        row: dict[str, Any] = {"benchmark": "summhay", "judge": name, "reference": "human"}
        row |= {
            "source": info[name].source,
            "judge_provider": info[name].provider,
            "judge_prompt_sha": info[name].sha,
        }
        row |= stats
        row["n_samples"] = len(samples)
        if info[name].cost_usd is not None:
            row["cost_usd"] = info[name].cost_usd
        row["card"] = card_dump
        bs = bias(samples, labels)
        biases[name] = bs
        row |= {
            "bias_delta_mean": bs["delta_mean"],
            "length_score_corr": bs["length_score_corr"],
            "length_delta_corr": bs["length_delta_corr"],
        }
        rows.append(row)
    for (judge_name, ref, _), stats in zip(pairs, pair_done, strict=True):
        row = {"benchmark": "summhay", "judge": judge_name, "reference": ref}
        row |= {
            "source": "pipeline judgements",
            "judge_provider": params.judges[judge_name].provider,
            "judge_prompt_sha": info[judge_name].sha if judge_name in info else "none",
        }
        row |= stats
        rows.append(row)
    return rows, biases


METRICS = (
    "pearson",
    "spearman",
    "cohen_kappa",
    "cohen_kappa_linear",
    "cohen_kappa_quadratic",
    "exact_agreement",
    "linking_accuracy",
    "coverage_judge",
    "coverage_reference",
    "coverage_delta",
    "bias_delta_mean",
    "length_score_corr",
    "length_delta_corr",
    "cost_usd",
    "n",
    "n_invalid",
    "n_linked",
    "n_multi_link",
)


def run_rows(params: Params, rows: Sequence[Mapping[str, Any]]) -> list[RunRow]:
    """One MLflow run per agreement row (experiment `agreement`, metric `kappa`)."""
    sha = {r["judge"]: str(r.get("judge_prompt_sha", "none")) for r in rows}
    out = []
    for row in rows:
        metrics: dict[str, float] = {}
        for k in METRICS:
            for key in (k, f"{k}_ci_low", f"{k}_ci_high"):
                if row.get(key) is not None:
                    metrics[key] = float(row[key])
        if row.get("cohen_kappa") is not None:
            metrics["kappa"] = float(row["cohen_kappa"])
        if row.get("card") is not None:
            metrics |= card_metrics(JudgeCard.model_validate(row["card"]))
        judge = row["judge"]
        out.append(
            RunRow(
                key="|".join(str(row[k]) for k in ROW_ID),
                name=f"{judge} vs {row['reference']}",
                metrics=metrics,
                params={"judge": judge, "reference": row["reference"], "seed": str(params.seed)},
                tags={
                    "agreement.reference": row["reference"],
                    "agreement.source": row["source"],
                    "judge.name": judge,
                    "judge.provider": str(row.get("judge_provider", "")),
                    "judge.prompt_sha": sha[judge],
                },
                artifacts={"row.json": dict(row)},
            )
        )
    return out


class HumanLabels(HumanAgreement[SummhayParams, Subtopic]):
    """SummHay's 200 human-annotated summaries (`eval_benchmark_data.json`): the paper's Table 1
    (correlation, linking accuracy) and Table 4 (bias), plus kappa, with bootstrap intervals."""

    def load(self, ctx: Context[SummhayParams], raw: Any, file: str) -> list[Sample]:
        return parse_labels(raw, file)[: ctx.section.agreement.max_samples]

    def released(self, labelled: Any) -> dict[str, Any]:
        return {name: published_predictions(labelled, name) for name in published_judges(labelled)}

    def to_judge(self, labelled: Any) -> tuple[dict[str, Subtopic], list[Generation]]:
        return annotated_inputs(labelled)

    def labels(self, labelled: Any, judgements: Sequence[Judgement]) -> Any:
        return annotated_labels(judgements)

    def units(self, judgements: Sequence[Judgement]) -> Any:
        return pipeline_labels(judgements)

    def judge_vs_judge(self, section: SummhayParams) -> bool:
        return section.agreement.judge_vs_judge

    def llm_samples(self, section: SummhayParams) -> int | None:
        return section.agreement.llm_max_samples

    def evaluate(
        self,
        ctx: Context[SummhayParams],
        labelled: Any,
        judged: Mapping[str, Any],
        info: Mapping[str, JudgeInfo],
        pipeline: Mapping[str, Any],
        labels_digest: str,
    ) -> AgreementResult:
        from pipeline.benchmarks.summhay.agreement_report import plot, render

        rows, biases = agreement_rows(ctx.params, ctx.section, labelled, judged, info, pipeline)
        return AgreementResult(rows, render(rows, biases, labels_digest), plot(rows))

    def run_rows(
        self, ctx: Context[SummhayParams], rows: Sequence[Mapping[str, Any]]
    ) -> list[RunRow]:
        return run_rows(ctx.params, rows)
