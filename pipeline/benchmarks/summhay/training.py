"""SummHay data for the local judge: training cases and the leakage guard.

Training uses the GPT-4o judgements released with the news haystacks, minus every haystack that
appears in the human-annotated set (`eval_benchmark_data.json`), so that the judge's agreement
with the human labels is measured on haystacks it never saw. Membership is read from the data:
a haystack is annotated when an annotated item shares its subtopic id, one of its insight ids, or
its topic text. The stage layer (`pipeline/stages/train_judge.py`) embeds, fits and writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.benchmarks.summhay.params import SummhayParams
from pipeline.benchmarks.summhay.published import raw_haystack
from pipeline.benchmarks.summhay.scoring import extract_bullets
from pipeline.core.benchmark import Context, Inputs
from pipeline.core.config import LocalJudge
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.extensions import JudgeTraining, TrainingData
from pipeline.core.records import LabelledCase
from pipeline.data.haystacks import HAYSTACK_IDS, item_id

HUMAN_LABELS = {
    "fully_covered": "FULL_COVERAGE",
    "partially_covered": "PARTIAL_COVERAGE",
    "not_covered": "NO_COVERAGE",
}
# The haystacks whose release carries summaries with GPT-4o judgements.
JUDGED_HAYSTACKS = tuple(h for h in HAYSTACK_IDS if h.startswith("news"))
REFERENCE = "published GPT-4o (SummHay release)"


# ---------------------------------------------------------------- the human-annotated set


def read_annotated(raw: Any, file: str) -> list[dict[str, Any]]:
    """The annotated summaries (the labels file's content), checked for the fields used here."""
    if not isinstance(raw, list):
        raise DataError("expected a list of annotated summaries", file=file)
    for n, item in enumerate(raw):
        for key in ("subtopic_id", "topic", "summary", "reference_insights", "annotation"):
            if not isinstance(item, dict) or key not in item:
                raise DataError("missing field", file=file, item=f"[{n}]", field=key)
    return raw


def annotated_haystacks(
    inputs: Inputs, annotated_path: str, data_dir: str, haystack_ids: Sequence[str]
) -> dict[str, str]:
    """The haystacks among `haystack_ids` that the human-annotated set draws on, with why."""
    items = read_annotated(inputs.json(annotated_path), annotated_path)
    subtopics = {str(i["subtopic_id"]) for i in items}
    insights = {str(r.get("insight_id")) for i in items for r in i["reference_insights"]}
    topics = {str(i["topic"]).strip() for i in items}
    name = annotated_path.rsplit("/", 1)[-1]
    out = {}
    for hid in haystack_ids:
        _, raw = raw_haystack(inputs, data_dir, hid)
        reasons = []
        shared_sub = {s.subtopic_id for s in raw.subtopics} & subtopics
        if shared_sub:
            reasons.append(f"{len(shared_sub)} subtopic ids")
        shared_ins = {i.insight_id for s in raw.subtopics for i in s.insights} & insights
        if shared_ins:
            reasons.append(f"{len(shared_ins)} insight ids")
        if raw.topic.strip() in topics:
            reasons.append("its topic")
        if reasons:
            out[hid] = "shares " + ", ".join(reasons) + f" with {name}"
    return out


def human_cases(raw: Any, file: str) -> list[LabelledCase]:
    """The annotated summaries as labelled cases (annotators number bullets from 0)."""
    cases = []
    for n, item in enumerate(read_annotated(raw, file)):
        bullets = extract_bullets("\n".join(item["summary"]))
        texts = {r["insight_id"]: r["insight"] for r in item["reference_insights"]}
        units, labels, links = [], [], []
        for a in item["annotation"]:
            if a["insight_id"] not in texts or a["coverage"] not in HUMAN_LABELS:
                raise DataError(
                    "annotation of an unknown insight or with an unknown label",
                    file=file,
                    item=f"[{n}]",
                    field="annotation",
                )
            units.append(texts[a["insight_id"]])
            labels.append(HUMAN_LABELS[a["coverage"]])
            cand = str(a.get("candidate_id", ""))
            links.append(int(cand) + 1 if cand.isdigit() else None)
        cases.append(
            LabelledCase(
                group=str(item.get("topic_fn") or item.get("topic_id") or "?"),
                case_id=f"{item['subtopic_id']}#{item.get('summkey', n)}",
                units=tuple(units),
                bullets=tuple(bullets),
                labels=tuple(labels),
                links=tuple(links),
            )
        )
    return cases


# ---------------------------------------------------------------- released GPT-4o judgements


def _link(bullet_id: int | str | None) -> int | None:
    try:
        return int(bullet_id)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def published_cases(
    inputs: Inputs, data_dir: str, haystack_ids: Sequence[str]
) -> list[LabelledCase]:
    """One case per released summary with a released judgement, labelled by GPT-4o."""
    cases = []
    for hid in haystack_ids:
        _, raw = raw_haystack(inputs, data_dir, hid)
        for sub in raw.subtopics:
            texts = {i.insight_id: i.insight for i in sub.insights}
            for key in sorted(sub.eval_summaries):
                if key not in sub.summaries:
                    continue
                evals = [e for e in sub.eval_summaries[key] if e.insight_id in texts]
                if not evals:
                    continue
                cases.append(
                    LabelledCase(
                        group=hid,
                        case_id=f"{item_id(hid, sub.subtopic_id)}#{key}",
                        units=tuple(texts[e.insight_id] for e in evals),
                        bullets=tuple(extract_bullets("\n".join(sub.summaries[key]))),
                        labels=tuple(e.coverage for e in evals),
                        links=tuple(_link(e.bullet_id) for e in evals),
                    )
                )
    return cases


def training_split(
    inputs: Inputs, spec: LocalJudge, data_dir: str, annotated_path: str
) -> tuple[list[str], dict[str, str]]:
    """(haystacks to train on, excluded haystacks with the reason)."""
    wanted = spec.train.haystacks or list(JUDGED_HAYSTACKS)
    candidates = [h for h in wanted if h in JUDGED_HAYSTACKS]
    excluded = annotated_haystacks(inputs, annotated_path, data_dir, candidates)
    return [h for h in candidates if h not in excluded], excluded


class SummhayTraining(JudgeTraining[SummhayParams]):
    """The released GPT-4o judgements of the news haystacks that people did not annotate."""

    def cases(
        self, ctx: Context[SummhayParams], spec: LocalJudge, annotated_path: str
    ) -> TrainingData:
        wanted = spec.train.haystacks or list(JUDGED_HAYSTACKS)
        unknown = [h for h in wanted if h not in HAYSTACK_IDS]
        if unknown:
            raise ConfigError(f"train.haystacks: unknown haystack(s) {unknown}")
        train_ids, excluded = training_split(ctx.inputs, spec, ctx.data_dir, annotated_path)
        if not train_ids:
            raise ConfigError("train.haystacks: every news haystack is in the annotated set")
        heldout_ids = [h for h in wanted if h in excluded and h in JUDGED_HAYSTACKS]
        train = published_cases(ctx.inputs, ctx.data_dir, train_ids)
        leaked = {c.group for c in train} & set(excluded)
        if leaked:  # pragma: no cover - guarded by construction; the test checks it too
            raise DataError(f"training cases from annotated haystacks {sorted(leaked)}")
        return TrainingData(
            train=train,
            train_groups=train_ids,
            heldout=published_cases(ctx.inputs, ctx.data_dir, heldout_ids) if heldout_ids else [],
            heldout_groups=heldout_ids,
            excluded=excluded,
            reference=REFERENCE,
            reference_key="gpt4o",
        )
