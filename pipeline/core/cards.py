"""A judge card: what one judge is worth, next to what it costs, in one small record.

Each benchmark's agreement code builds one card per judge measured against people (SummHay's
human labels, CRUX's labels) with `card()`; it goes into the agreement row under the key
`card` (metrics/agreement.json, the `agreement` list of metrics/crux.json) and the report
draws every card in one table, "Judge cards".

Fields and where they come from:

- `kappa`, `kappa_ci_low/high`: Cohen's kappa of the judge's labels against the reference's on
  the same units (`kappa_kind` says which classes), with a seeded 95% percentile-bootstrap
  interval resampling the label pairs (`pipeline.metrics.agreement.kappa_interval`);
- `pearson`: Pearson correlation of the judge's scores and the reference's on those units;
- `linking_accuracy` (percent) and `n_linked`: where the judge names the evidence a unit rests
  on (SummHay: the summary bullet covering an insight), how often it is the bullet the people
  chose; None where the benchmark has no such link;
- `cost_per_1000`: US dollars per 1,000 judgements (`unit` says what one judgement is), from
  the recorded cost of the judge's calls that made these judgements; 0 for a judge that calls
  no paid model (the local judge, a no-model judge); None ("unknown") when some answers came
  without token usage (`usage_missing`) or the judgements were replayed from a release whose
  cost was not recorded. `cost_status` says which;
- throughput (run state, not in the card: `pipeline/stages/timing.py`): judgements per second
  of the measured wall time of the judging, and what the clock covered. The stage that judged
  writes it to `.lfbench/timing/<stage>.json`; the report joins it to the card. Wall
  time is run state: like the usage summary's, it never goes into a metrics file (those are
  the same bytes wherever they are re-made).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

CostStatus = Literal["measured", "free", "unknown"]


class JudgeCard(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    judge: str
    reference: str
    unit: str
    n: int
    kappa_kind: str
    kappa: float | None
    kappa_ci_low: float | None
    kappa_ci_high: float | None
    n_resamples: int
    pearson: float | None
    linking_accuracy: float | None = None
    n_linked: int | None = None
    cost_status: CostStatus
    cost_per_1000: float | None
    cost_note: str
    throughput_stage: str | None  # the stage whose `.lfbench/timing/<stage>.json` times it


def cost_per_1000(
    cost_usd: float | None, n_judgements: int, *, free: bool = False, note: str = ""
) -> tuple[CostStatus, float | None, str]:
    """(status, dollars per 1,000 judgements, note) from a judge's recorded cost."""
    if free:
        return "free", 0.0, note or "calls no paid model"
    if cost_usd is None or n_judgements == 0:
        return "unknown", None, note or "cost not recorded"
    return "measured", cost_usd / n_judgements * 1000.0, note or "recorded cost of the calls"


def card(
    *,
    judge: str,
    reference: str,
    unit: str,
    judge_labels: Sequence[Hashable],
    reference_labels: Sequence[Hashable],
    categories: Sequence[Hashable],
    kappa_kind: str,
    pearson: float | None,
    n_resamples: int,
    seed: int,
    cost: tuple[CostStatus, float | None, str],
    throughput_stage: str | None,
    linking: tuple[float | None, int] | None = None,
) -> JudgeCard:
    """One judge's card (see the module's docstring for each field)."""
    if len(judge_labels) != len(reference_labels):
        raise ValueError(
            f"judge {judge}: {len(judge_labels)} labels against {len(reference_labels)}"
        )
    if judge_labels:
        from pipeline.metrics.agreement import kappa_interval

        k, lo, hi = kappa_interval(
            judge_labels, reference_labels, categories, n_resamples=n_resamples, seed=seed
        )
    else:
        k = lo = hi = None
    status, per_1000, note = cost
    return JudgeCard(
        judge=judge,
        reference=reference,
        unit=unit,
        n=len(judge_labels),
        kappa_kind=kappa_kind,
        kappa=k,
        kappa_ci_low=lo,
        kappa_ci_high=hi,
        n_resamples=n_resamples,
        pearson=pearson,
        linking_accuracy=None if linking is None else linking[0],
        n_linked=None if linking is None else linking[1],
        cost_status=status,
        cost_per_1000=per_1000,
        cost_note=note,
        throughput_stage=throughput_stage,
    )


CARD_METRICS = (
    "kappa",
    "kappa_ci_low",
    "kappa_ci_high",
    "pearson",
    "linking_accuracy",
    "cost_per_1000",
)


def card_metrics(card_: JudgeCard) -> dict[str, float]:
    """The card's numbers as MLflow metrics (`card.<field>`), unknown ones left out (the stage
    adds the judge's throughput in its run, `card.judgements_per_second`, when it timed it)."""
    out = {f"card.{k}": getattr(card_, k) for k in CARD_METRICS}
    metrics = {k: float(v) for k, v in out.items() if v is not None}
    if card_.cost_status == "unknown":
        metrics["card.cost_unknown"] = 1.0
    return metrics
