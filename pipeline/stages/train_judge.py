"""Stage `local-judge-train`: a benchmark's released judgements -> the local judge's model file
and its held-out evaluation.

The benchmark supplies the labelled cases (its `JudgeTraining` extension: what to train on, what to
hold out entirely, which groups it excluded because people annotated them); this stage embeds
them (the shared embedding cache), fits the classifier, measures it leave-one-group-out and on
the held-out groups, and writes the model (the same bytes on every run) and the metrics.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark
from pipeline.core.config import LocalJudge, Params
from pipeline.core.errors import ConfigError
from pipeline.core.extensions import JudgeTraining
from pipeline.core.io import atomic_write_text, write_json
from pipeline.stages.common import context

log = logging.getLogger(__name__)


def train(
    bench: AnyBenchmark,
    params: Params,
    judge_name: str,
    data_dir: Path,
    annotated: Path,
    out: Path,
    metrics_path: Path,
    root: Path,
) -> dict[str, Any]:
    from pipeline.local_judge.embeddings import Embedder, default_cache_path
    from pipeline.local_judge.model import LABELS
    from pipeline.local_judge.train import (
        build_matrices,
        evaluate,
        fit_and_evaluate,
        model_file,
    )

    spec = params.judges.get(judge_name)
    if not isinstance(spec, LocalJudge):
        raise ConfigError(f"judges.{judge_name} is not a judge with provider: local")
    training: JudgeTraining[Any] | None = JudgeTraining.of(bench)
    if training is None:
        raise ConfigError(f"benchmark {bench.name} offers no training data for the local judge")
    ctx = context(bench, params, root, data_dir)
    try:
        data = training.cases(ctx, spec, str(annotated))
    except ConfigError as e:
        raise ConfigError(f"judges.{judge_name}.{e}") from e
    embedder = Embedder(default_cache_path(root) if spec.embedding_cache else None)
    m, hm = build_matrices([data.train, data.heldout], embedder)
    cw = None if spec.train.class_weight == "none" else "balanced"
    c = spec.train.c
    log.info("local judge: %d training judgements from %s", len(m.y), ", ".join(data.train_groups))
    model, logo = fit_and_evaluate(m, c=c, class_weight=cw)
    ref = data.reference_key
    metrics: dict[str, Any] = {
        "train_haystacks": data.train_groups,
        "excluded_haystacks": data.excluded,
        "n_train": len(m.y),
        "train_labels": {LABELS[k]: int((m.y == k).sum()) for k in range(3)},
        f"vs_{ref}_leave_one_haystack_out": logo,
    }
    if data.heldout_groups:
        metrics[f"vs_{ref}_heldout"] = {
            "haystacks": data.heldout_groups,
            **evaluate(model.proba(hm.x), hm),
        }
    meta = {
        "train_haystacks": data.train_groups,
        "excluded_haystacks": sorted(data.excluded),
        "n_train": len(m.y),
        "c": c,
        "class_weight": spec.train.class_weight,
        "reference_judge": data.reference,
    }
    atomic_write_text(out, model_file(model, meta))
    write_json(metrics_path, metrics)
    log.info(
        "local judge: LOHO kappa %s vs %s; held-out %s kappa %s; wrote %s",
        logo["pooled"]["kappa"] if logo["pooled"] else logo.get("skipped"),
        ref,
        ",".join(data.heldout_groups) or "-",
        metrics.get(f"vs_{ref}_heldout", {}).get("kappa"),
        out,
    )
    embedder.close()
    return metrics
