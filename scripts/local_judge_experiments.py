"""Variants of the local judge, measured against the human labels (development aid).

    python scripts/local_judge_experiments.py [--data data/summhay] [--variants lr,lr-balanced,...]

Trains each variant on the released GPT-4o judgements of the non-annotated news haystacks (the
same split as stage local-judge-train), then prints one JSON line per variant with its agreement
with the 1,419 human labels of eval_benchmark_data.json (3-class Cohen's kappa, summary-level
Pearson correlation of coverage scores, linking accuracy) and with GPT-4o on news3 (held out).
The released GPT-4o predictions in the annotated file are scored the same way, as the reference.
Embeddings come from (and go to) .lfbench/cache/embeddings.sqlite.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import pearsonr
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import cohen_kappa_score
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from pipeline.benchmarks.summhay.training import (
    HUMAN_LABELS,
    annotated_haystacks,
    human_cases,
    published_cases,
    read_annotated,
)
from pipeline.core.records import LabelledCase
from pipeline.local_judge.embeddings import Embedder, default_cache_path
from pipeline.local_judge.features import clean_text
from pipeline.local_judge.model import LABELS
from pipeline.local_judge.train import Matrix, build_matrix, fit
from pipeline.stages.common import FileInputs

CREDIT = np.array([0.0, 0.5, 1.0])


def agreement(pred: np.ndarray, top: np.ndarray, m: Matrix, sizes: list[int]) -> dict[str, Any]:
    """3-class kappa, summary-level correlation of coverage, linking accuracy."""
    judge_cov, human_cov, k = [], [], 0
    for n in sizes:
        judge_cov.append(CREDIT[pred[k : k + n]].mean())
        human_cov.append(CREDIT[m.y[k : k + n]].mean())
        k += n
    both = (pred > 0) & (m.y > 0) & (m.links > 0)
    return {
        "kappa": round(float(cohen_kappa_score(m.y, pred)), 4),
        "accuracy": round(float((pred == m.y).mean()), 4),
        "pearson_summary_coverage": round(float(pearsonr(judge_cov, human_cov)[0]), 4),
        "link_accuracy": round(float((top[both] == m.links[both]).mean()), 4),
        "n_linked": int(both.sum()),
        "predicted": {LABELS[i]: int((pred == i).sum()) for i in range(3)},
    }


def pair_features(cases: list[LabelledCase], m: Matrix, emb: Embedder) -> np.ndarray:
    """|u - v| and u * v of the unit and its most similar bullet (768 extra columns)."""
    out = []
    k = 0
    for c in cases:
        units = emb.embed([clean_text(u) for u in c.units])
        bullets = emb.embed([clean_text(b) for b in c.bullets]) if c.bullets else None
        for i in range(len(c.units)):
            t = m.top[k] - 1
            v = bullets[t] if bullets is not None and t >= 0 else np.zeros(units.shape[1])
            out.append(np.concatenate([np.abs(units[i] - v), units[i] * v]))
            k += 1
    return np.asarray(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("data/summhay"))
    ap.add_argument("--variants", default="lr,lr-balanced,lr-c0.1,hgb,hgb-pairs")
    args = ap.parse_args()
    files, data = FileInputs(Path("/")), str(args.data.resolve())
    eval_path = f"{data}/eval_benchmark_data.json"
    news = [f"news{i}" for i in range(1, 6)]
    excluded = annotated_haystacks(files, eval_path, data, news)
    train_ids = [h for h in news if h not in excluded]
    emb = Embedder(default_cache_path())
    train_cases = published_cases(files, data, train_ids)
    held_cases = published_cases(files, data, sorted(excluded))
    hum_cases = human_cases(files.json(eval_path), eval_path)
    mt, mh, mu = (build_matrix(c, emb) for c in (train_cases, held_cases, hum_cases))
    sizes = [len(c.units) for c in hum_cases]

    # The reference: GPT-4o's released predictions on the annotated summaries.
    items = read_annotated(files.json(eval_path), eval_path)
    g_pred, g_top = [], []
    for item in items:
        p = {x["insight_id"]: x for x in item["predictions_prompted_gpt-4o"]}
        for a in item["annotation"]:
            x = p[a["insight_id"]]
            g_pred.append(LABELS.index(x["coverage"]))
            try:
                g_top.append(int(x["bullet_id"]))
            except (TypeError, ValueError):
                g_top.append(0)
    assert len(g_pred) == len(mu.y) and set(HUMAN_LABELS.values()) == set(LABELS)
    ref = agreement(np.asarray(g_pred), np.asarray(g_top), mu, sizes)
    print(json.dumps({"variant": "published-gpt-4o (reference)", "vs_humans": ref}))

    pairs: dict[str, np.ndarray] = {}
    for name in args.variants.split(","):
        t0 = time.perf_counter()
        if name.startswith("lr"):
            cw = "balanced" if name == "lr-balanced" else None
            c = 0.1 if name == "lr-c0.1" else 1.0
            model = fit(mt.x, mt.y, c=c, class_weight=cw)
            p_hum, p_held = model.proba(mu.x), model.proba(mh.x)
        elif name.startswith("poly2"):
            # Logistic regression on the features and their pairwise products.
            poly = make_pipeline(
                StandardScaler(), PolynomialFeatures(2, include_bias=False), StandardScaler()
            )
            xt = poly.fit_transform(mt.x)
            cw = "balanced" if name == "poly2-balanced" else None
            lr = LogisticRegression(C=1.0, class_weight=cw, max_iter=3000)
            lr.fit(xt, mt.y)
            p_hum, p_held = (
                lr.predict_proba(poly.transform(mu.x)),
                lr.predict_proba(poly.transform(mh.x)),
            )
        elif name == "mlp":
            sc = StandardScaler().fit(mt.x)
            mlp = MLPClassifier(
                (64, 32), alpha=1e-3, max_iter=300, early_stopping=True, random_state=0
            )
            mlp.fit(sc.transform(mt.x), mt.y)
            p_hum, p_held = (
                mlp.predict_proba(sc.transform(mu.x)),
                mlp.predict_proba(sc.transform(mh.x)),
            )
        else:
            xt, xu, xh = mt.x, mu.x, mh.x
            if name == "hgb-pairs":
                if not pairs:
                    pairs = {
                        "t": pair_features(train_cases, mt, emb),
                        "u": pair_features(hum_cases, mu, emb),
                        "h": pair_features(held_cases, mh, emb),
                    }
                xt, xu, xh = (
                    np.hstack([a, pairs[k]]) for a, k in ((xt, "t"), (xu, "u"), (xh, "h"))
                )
            clf = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.1, random_state=0)
            clf.fit(xt, mt.y)
            p_hum, p_held = clf.predict_proba(xu), clf.predict_proba(xh)
        pred_h = p_hum.argmax(axis=1)
        held = p_held.argmax(axis=1)
        print(
            json.dumps(
                {
                    "variant": name,
                    "vs_humans": agreement(pred_h, mu.top, mu, sizes),
                    "vs_gpt4o_news3": {
                        "kappa": round(float(cohen_kappa_score(mh.y, held)), 4),
                        "accuracy": round(float((held == mh.y).mean()), 4),
                    },
                    "fit_s": round(time.perf_counter() - t0, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
