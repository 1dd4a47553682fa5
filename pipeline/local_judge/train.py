"""Fitting and evaluating the local judge: generic over where the labelled cases come from.

A labelled case is a candidate (bullets) with its reference units, each unit labelled by a
reference judge (NO/PARTIAL/FULL_COVERAGE, and the bullet it linked), plus a group (for SummHay
the haystack) used for leave-one-group-out evaluation.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]
from sklearn.metrics import cohen_kappa_score, confusion_matrix  # type: ignore[import-untyped]
from threadpoolctl import threadpool_limits

from pipeline.core.parallel import fork_map
from pipeline.core.records import LabelledCase
from pipeline.local_judge.embeddings import ENCODER_ID, Embedder
from pipeline.local_judge.features import FEATURE_NAMES, Row
from pipeline.local_judge.model import FORMAT, LABELS, LinearModel, featurise


@dataclass(frozen=True)
class Matrix:
    x: np.ndarray
    y: np.ndarray  # class index into LABELS
    groups: np.ndarray
    top: np.ndarray  # 1-based most similar bullet (0 when none)
    links: np.ndarray  # reference judge's bullet (0 when none)


def build_matrix(cases: Sequence[LabelledCase], embedder: Embedder) -> Matrix:
    return build_matrices([cases], embedder)[0]


def build_matrices(case_sets: Sequence[Sequence[LabelledCase]], embedder: Embedder) -> list[Matrix]:
    """One matrix per set of cases, their texts embedded together (one pool of encoder
    processes for all the sets, not one per set)."""
    cases = [c for cs in case_sets for c in cs]
    rows = featurise([(c.units, c.bullets) for c in cases], embedder)
    out, start = [], 0
    for cs in case_sets:
        out.append(_matrix(cs, rows[start : start + len(cs)]))
        start += len(cs)
    return out


def _matrix(cases: Sequence[LabelledCase], rows: Sequence[Sequence[Row]]) -> Matrix:
    x, y, groups, top, links = [], [], [], [], []
    for case, case_rows in zip(cases, rows, strict=True):
        for r, label, link in zip(case_rows, case.labels, case.links, strict=True):
            x.append(r.values)
            y.append(LABELS.index(label))
            groups.append(case.group)
            top.append(0 if r.top is None else r.top + 1)
            links.append(link or 0)
    # Rounding makes the fit independent of float noise in the features (bytes-identical models).
    return Matrix(
        x=np.round(np.asarray(x, dtype=np.float64), 6).reshape(-1, len(FEATURE_NAMES)),
        y=np.asarray(y, dtype=np.int64),
        groups=np.asarray(groups),
        top=np.asarray(top, dtype=np.int64),
        links=np.asarray(links, dtype=np.int64),
    )


def fit(x: np.ndarray, y: np.ndarray, *, c: float, class_weight: str | None) -> LinearModel:
    # Rounded as the model file stores them, so the fitted and the reloaded model agree.
    mean = np.round(x.mean(axis=0), 8)
    scale = np.round(x.std(axis=0), 8)
    scale[scale < 1e-6] = 1.0  # a constant feature
    clf = LogisticRegression(C=c, class_weight=class_weight, max_iter=2000, tol=1e-8)
    # One BLAS thread: with more, the solver's sums round differently and the coefficients of
    # the 37 correlated features moved by up to 2e-4 (other bytes); on shared cores it is also
    # the faster (the whole fit takes seconds).
    with threadpool_limits(limits=1):
        clf.fit((x - mean) / scale, y)
    if list(clf.classes_) != [0, 1, 2]:
        raise ValueError(f"training data lacks a class: {list(clf.classes_)}")
    return LinearModel(
        mean=mean, scale=scale, coef=clf.coef_.copy(), intercept=clf.intercept_.copy()
    )


def expected_calibration_error(proba: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Top-label ECE: sum over confidence bins of |accuracy - mean confidence| x bin share."""
    conf = proba.max(axis=1)
    correct = (proba.argmax(axis=1) == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in itertools.pairwise(edges):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += m.mean() * abs(correct[m].mean() - conf[m].mean())
    return float(ece)


def evaluate(proba: np.ndarray, m: Matrix) -> dict[str, Any]:
    """Agreement of predictions with the reference judge's labels and links."""
    pred = proba.argmax(axis=1)
    covered = (pred > 0) & (m.y > 0) & (m.links > 0)
    per_class = {}
    for k, name in enumerate(LABELS):
        tp = int(((pred == k) & (m.y == k)).sum())
        n_pred, n_true = int((pred == k).sum()), int((m.y == k).sum())
        per_class[name] = {
            "support": n_true,
            "predicted": n_pred,
            "precision": round(tp / n_pred, 4) if n_pred else None,
            "recall": round(tp / n_true, 4) if n_true else None,
        }
    binary_true, binary_pred = (m.y > 0).astype(int), (pred > 0).astype(int)
    return {
        "n": len(m.y),
        "kappa": round(float(cohen_kappa_score(m.y, pred)), 4),
        "kappa_covered": round(float(cohen_kappa_score(binary_true, binary_pred)), 4),
        "accuracy": round(float((pred == m.y).mean()), 4),
        "link_accuracy": round(float((m.top[covered] == m.links[covered]).mean()), 4)
        if covered.any()
        else None,
        "log_loss": round(
            float(-np.mean(np.log(np.clip(proba[np.arange(len(m.y)), m.y], 1e-12, 1)))), 4
        ),
        "ece": round(expected_calibration_error(proba, m.y), 4),
        "per_class": per_class,
        "confusion": confusion_matrix(m.y, pred, labels=[0, 1, 2]).tolist(),
    }


def leave_one_group_out(m: Matrix, *, c: float, class_weight: str | None) -> dict[str, Any]:
    """Fit on all groups but one, evaluate on that one; pooled and per held-out group.

    With a single group there is nothing to hold out: the result says so instead of fitting
    on nothing."""
    return fit_and_evaluate(m, c=c, class_weight=class_weight)[1]


def fit_and_evaluate(
    m: Matrix, *, c: float, class_weight: str | None
) -> tuple[LinearModel, dict[str, Any]]:
    """The model fit on every group, and the leave-one-group-out evaluation.

    The fits are independent, so they run side by side on the cores (`fork_map`); each is the
    single-threaded fit it would be alone, so the models are the same bytes on any number of
    cores."""
    groups = sorted(set(m.groups.tolist()))
    held_out = groups if len(groups) >= 2 else []

    def fit_without(g: str | None) -> LinearModel:
        keep = np.ones(len(m.y), dtype=bool) if g is None else m.groups != g
        return fit(m.x[keep], m.y[keep], c=c, class_weight=class_weight)

    # the largest fit (every group) first: the others fill the cores around it
    model, *fitted = fork_map(fit_without, [None, *held_out])
    if not held_out:
        return model, {"pooled": None, "per_group": {}, "skipped": "needs two or more haystacks"}
    proba = np.zeros((len(m.y), 3))
    per_group = {}
    for g, fitted_g in zip(held_out, fitted, strict=True):
        test = m.groups == g
        proba[test] = fitted_g.proba(m.x[test])
        per_group[g] = {
            k: v for k, v in evaluate(proba[test], _subset(m, test)).items() if k != "per_class"
        }
    return model, {"pooled": evaluate(proba, m), "per_group": per_group}


def _subset(m: Matrix, mask: np.ndarray) -> Matrix:
    return Matrix(m.x[mask], m.y[mask], m.groups[mask], m.top[mask], m.links[mask])


def model_file(model: LinearModel, meta: dict[str, Any]) -> str:
    """The model file's text: stable key order and rounding, so a re-run writes the same bytes."""
    return (
        json.dumps(
            {
                "format": FORMAT,
                "encoder": ENCODER_ID,
                "labels": list(LABELS),
                "features": list(FEATURE_NAMES),
                "model": model.to_json(),
                "meta": meta,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
