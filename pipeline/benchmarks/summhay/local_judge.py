"""SummHay data for the local judge: training cases, the leakage guard, and judging.

Training uses the GPT-4o judgements released with the news haystacks, minus every haystack that
appears in the human-annotated set (`eval_benchmark_data.json`), so that the judge's agreement
with the human labels is measured on haystacks it never saw. Membership is read from the data:
a haystack is annotated when an annotated item shares its subtopic id, one of its insight ids, or
its topic text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.benchmarks.summhay.schema import Haystack, haystack_file, item_id, load_raw_haystack
from pipeline.benchmarks.summhay.scoring import extract_bullets
from pipeline.config import LocalJudge as LocalJudgeSpec
from pipeline.config import Params
from pipeline.errors import ConfigError, DataError
from pipeline.io import read_json, write_json
from pipeline.judges.embeddings import Embedder, default_cache_path
from pipeline.judges.local import LABELS, LocalJudge
from pipeline.judges.train import (
    LabelledCase,
    build_matrix,
    evaluate,
    fit,
    leave_one_group_out,
    model_file,
)
from pipeline.records import Generation, Judgement, Verdict

log = logging.getLogger(__name__)

HUMAN_LABELS = {
    "fully_covered": "FULL_COVERAGE",
    "partially_covered": "PARTIAL_COVERAGE",
    "not_covered": "NO_COVERAGE",
}


# ---------------------------------------------------------------- the human-annotated set


def read_annotated(path: Path) -> list[dict[str, Any]]:
    raw = read_json(path)
    if not isinstance(raw, list):
        raise DataError("expected a list of annotated summaries", file=str(path))
    for n, item in enumerate(raw):
        for key in ("subtopic_id", "topic", "summary", "reference_insights", "annotation"):
            if not isinstance(item, dict) or key not in item:
                raise DataError("missing field", file=str(path), item=f"[{n}]", field=key)
    return raw


def annotated_haystacks(
    eval_path: Path, data_dir: Path, haystack_ids: Sequence[str]
) -> dict[str, str]:
    """The haystacks among `haystack_ids` that the human-annotated set draws on, with why."""
    items = read_annotated(eval_path)
    subtopics = {str(i["subtopic_id"]) for i in items}
    insights = {str(r.get("insight_id")) for i in items for r in i["reference_insights"]}
    topics = {str(i["topic"]).strip() for i in items}
    out = {}
    for hid in haystack_ids:
        raw = load_raw_haystack(data_dir / haystack_file(hid))
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
            out[hid] = "shares " + ", ".join(reasons) + f" with {eval_path.name}"
    return out


def human_cases(eval_path: Path) -> list[LabelledCase]:
    """The annotated summaries as labelled cases (annotators number bullets from 0)."""
    cases = []
    for n, item in enumerate(read_annotated(eval_path)):
        bullets = extract_bullets("\n".join(item["summary"]))
        texts = {r["insight_id"]: r["insight"] for r in item["reference_insights"]}
        units, labels, links = [], [], []
        for a in item["annotation"]:
            if a["insight_id"] not in texts or a["coverage"] not in HUMAN_LABELS:
                raise DataError(
                    "annotation of an unknown insight or with an unknown label",
                    file=str(eval_path),
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


def published_cases(data_dir: Path, haystack_ids: Sequence[str]) -> list[LabelledCase]:
    """One case per released summary with a released judgement, labelled by GPT-4o."""
    cases = []
    for hid in haystack_ids:
        raw = load_raw_haystack(data_dir / haystack_file(hid))
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
    spec: LocalJudgeSpec, data_dir: Path, eval_path: Path
) -> tuple[list[str], dict[str, str]]:
    """(haystacks to train on, excluded haystacks with the reason)."""
    candidates = [h for h in spec.train.haystacks if h.startswith("news")]
    excluded = annotated_haystacks(eval_path, data_dir, candidates)
    return [h for h in candidates if h not in excluded], excluded


def local_spec(params: Params, judge_name: str) -> LocalJudgeSpec:
    spec = params.judges.get(judge_name)
    if not isinstance(spec, LocalJudgeSpec):
        raise ConfigError(f"judges.{judge_name} is not a judge with provider: local")
    return spec


def train(
    params: Params,
    judge_name: str,
    data_dir: Path,
    eval_path: Path,
    out: Path,
    metrics_path: Path,
    root: Path,
) -> dict[str, Any]:
    spec = local_spec(params, judge_name)
    train_ids, excluded = training_split(spec, data_dir, eval_path)
    if not train_ids:
        raise ConfigError(
            f"judges.{judge_name}.train.haystacks: every news haystack is in the annotated set"
        )
    heldout_ids = [h for h in spec.train.haystacks if h in excluded and h.startswith("news")]
    cases = published_cases(data_dir, train_ids)
    leaked = {c.group for c in cases} & set(excluded)
    if leaked:  # pragma: no cover - guarded by construction; the test checks it too
        raise DataError(f"training cases from annotated haystacks {sorted(leaked)}")
    embedder = Embedder(default_cache_path(root) if spec.embedding_cache else None)
    m = build_matrix(cases, embedder)
    cw = None if spec.train.class_weight == "none" else "balanced"
    c = spec.train.c
    log.info("local judge: %d training judgements from %s", len(m.y), ", ".join(train_ids))
    logo = leave_one_group_out(m, c=c, class_weight=cw)
    model = fit(m.x, m.y, c=c, class_weight=cw)
    metrics: dict[str, Any] = {
        "train_haystacks": train_ids,
        "excluded_haystacks": excluded,
        "n_train": len(m.y),
        "train_labels": {LABELS[k]: int((m.y == k).sum()) for k in range(3)},
        "vs_gpt4o_leave_one_haystack_out": logo,
    }
    if heldout_ids:
        hm = build_matrix(published_cases(data_dir, heldout_ids), embedder)
        metrics["vs_gpt4o_heldout"] = {
            "haystacks": heldout_ids,
            **evaluate(model.proba(hm.x), hm),
        }
    meta = {
        "train_haystacks": train_ids,
        "excluded_haystacks": sorted(excluded),
        "n_train": len(m.y),
        "c": c,
        "class_weight": spec.train.class_weight,
        "reference_judge": "published GPT-4o (SummHay release)",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(model_file(model, meta), encoding="utf-8")
    write_json(metrics_path, metrics)
    log.info(
        "local judge: LOHO kappa %s vs GPT-4o; held-out %s kappa %s; wrote %s",
        logo["pooled"]["kappa"] if logo["pooled"] else logo.get("skipped"),
        ",".join(heldout_ids) or "-",
        metrics.get("vs_gpt4o_heldout", {}).get("kappa"),
        out,
    )
    embedder.close()
    return metrics


# ---------------------------------------------------------------- judging generations


def judge_generations(
    judge_name: str,
    spec: LocalJudgeSpec,
    dataset: list[Haystack],
    gens: list[Generation],
    root: Path,
) -> list[Judgement]:
    judge = LocalJudge.load(
        root / spec.model_path, cache=default_cache_path(root) if spec.embedding_cache else None
    )
    subs = {s.item_id: s for h in dataset for s in h.subtopics}
    todo = []
    for gen in gens:
        if gen.status != "ok":
            continue  # nothing to judge; aggregate counts it as a failed generation
        if gen.item_id not in subs:
            raise DataError(
                "generation of an item that is not in the dataset",
                item=gen.generation_id,
                field="item_id",
            )
        todo.append(gen)
    cases = [
        ([i.text for i in subs[g.item_id].insights], extract_bullets(g.text or "")) for g in todo
    ]
    verdicts = judge.judge_many(cases)
    log.info(
        "local judge %s: %d summaries, %d texts embedded, %d read from the cache",
        judge.sha[:12],
        len(todo),
        judge.embedder.computed,
        judge.embedder.cache_hits,
    )
    judge.embedder.close()
    out = []
    for g, vs in zip(todo, verdicts, strict=True):
        sub = subs[g.item_id]
        out.append(
            Judgement(
                benchmark="summhay",
                generation_id=g.generation_id,
                item_id=g.item_id,
                model=g.model,
                system=g.system,
                setting=g.setting,
                sample=g.sample,
                judge=judge_name,
                judge_prompt_sha=judge.sha,
                status="ok",
                verdicts=[
                    Verdict(
                        target_id=ins.insight_id,
                        label=v.label,
                        link=v.bullet,
                        raw=",".join(f"{p:.4f}" for p in v.proba),
                    )
                    for ins, v in zip(sub.insights, vs, strict=True)
                ],
            )
        )
    return out


def proba_array(verdicts: Sequence[Sequence[Any]]) -> np.ndarray:
    return np.asarray([v.proba for vs in verdicts for v in vs])
