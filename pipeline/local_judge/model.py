"""The local coverage judge: MiniLM features and a calibrated multinomial logistic regression.

Given a reference unit (a SummHay insight; a Long2RAG key point) and a candidate split into
bullets (summary bullets; answer sentences), it says whether the candidate covers the unit fully,
partially or not at all, and which bullet covers it: the bullet most similar to the unit.
Nothing leaves the machine; it runs on CPU with the numpy MiniLM of `pipeline.retrieval.dense`.

The model file is JSON (see :func:`pipeline.local_judge.train.fit`): the feature names, the
standardisation (mean, scale), the coefficients and intercepts of the three classes, and a
description of the training data. Probabilities are the softmax of the linear scores, fit on
log loss; with `train.class_weight: balanced` (the default) the classes weigh equally, so they
are calibrated to equal class priors rather than to GPT-4o's training mix (mostly FULL), which
is what agrees best with people (docs/local_judge.md). The label is the most probable class.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.core.errors import DataError
from pipeline.core.parallel import fork_map
from pipeline.local_judge.embeddings import ENCODER_ID, Embedder
from pipeline.local_judge.features import FEATURE_NAMES, Row, clean_text, unit_rows

LABELS = ("NO_COVERAGE", "PARTIAL_COVERAGE", "FULL_COVERAGE")
FORMAT = "lfbench-local-judge/1"

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LocalVerdict:
    label: str  # "FULL_COVERAGE" | "PARTIAL_COVERAGE" | "NO_COVERAGE"
    bullet: int | None  # 1-based number of the most similar bullet; None when NO_COVERAGE
    proba: tuple[float, float, float]  # calibrated P(no), P(partial), P(full)


def softmax(scores: Array) -> Array:
    z = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: Array = e / e.sum(axis=1, keepdims=True)
    return out


@dataclass(frozen=True)
class LinearModel:
    """Standardise, then a linear score per class; softmax gives the probabilities."""

    mean: Array
    scale: Array
    coef: Array  # (3, n_features)
    intercept: Array  # (3,)

    def proba(self, x: Array) -> Array:
        z = (x - self.mean) / self.scale
        return softmax(z @ self.coef.T + self.intercept)

    def to_json(self) -> dict[str, Any]:
        def r(a: Array) -> Any:
            return np.round(a, 8).tolist()

        return {
            "mean": r(self.mean),
            "scale": r(self.scale),
            "coef": r(self.coef),
            "intercept": r(self.intercept),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LinearModel:
        return cls(
            mean=np.asarray(raw["mean"], dtype=np.float64),
            scale=np.asarray(raw["scale"], dtype=np.float64),
            coef=np.asarray(raw["coef"], dtype=np.float64),
            intercept=np.asarray(raw["intercept"], dtype=np.float64),
        )


def featurise(
    cases: Sequence[tuple[Sequence[str], Sequence[str]]], embedder: Embedder
) -> list[list[Row]]:
    """Feature rows per case and unit; every distinct text is embedded once, in one batch."""
    cleaned = [
        ([clean_text(u) for u in units], [clean_text(b) for b in bullets])
        for units, bullets in cases
    ]
    texts = list(dict.fromkeys(t for units, bullets in cleaned for t in (*units, *bullets)))
    vectors = embedder.embed(texts)
    index = {t: i for i, t in enumerate(texts)}

    def rows(case: tuple[list[str], list[str]]) -> list[Row]:
        units, bullets = case
        u = (
            vectors[[index[t] for t in units]]
            if units
            else np.zeros((0, vectors.shape[1]), np.float32)
        )
        b = (
            vectors[[index[t] for t in bullets]]
            if bullets
            else np.zeros((0, vectors.shape[1]), np.float32)
        )
        return unit_rows(units, bullets, u, b)

    return fork_map(rows, cleaned, min_items=200)  # each case on its own: on every core


class LocalJudge:
    """A trained local judge (see the module docstring)."""

    def __init__(
        self, model: LinearModel, sha: str, meta: dict[str, Any], embedder: Embedder
    ) -> None:
        self.model = model
        self._sha = sha
        self.meta = meta
        self.embedder = embedder

    @classmethod
    def load(cls, path: Path, *, cache: Path | None = None) -> LocalJudge:
        """The model file written by the training stage; `cache` is the embedding cache file
        (see `pipeline.local_judge.embeddings`), None to embed everything in memory."""
        if not path.exists():
            raise DataError(
                "model file not found; run the training stage first (dvc repro local-judge-train)",
                file=str(path),
            )
        data = path.read_bytes()
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise DataError(f"not a {FORMAT} file", file=str(path), field="format")
            if raw.get("encoder") != ENCODER_ID:
                raise DataError(
                    f"trained on encoder {raw.get('encoder')!r}, this code embeds with"
                    f" {ENCODER_ID!r}; retrain",
                    file=str(path),
                    field="encoder",
                )
            if tuple(raw.get("features", ())) != FEATURE_NAMES:
                raise DataError(
                    "the model's features differ from this code's; retrain",
                    file=str(path),
                    field="features",
                )
            model = LinearModel.from_json(raw["model"])
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"unreadable model: {e}", file=str(path)) from e
        n = len(FEATURE_NAMES)
        if model.coef.shape != (3, n) or model.mean.shape != (n,) or model.scale.shape != (n,):
            raise DataError("model arrays have the wrong shape", file=str(path), field="model")
        if not (model.scale > 0).all():
            raise DataError("a feature scale is not positive", file=str(path), field="model.scale")
        return cls(model, hashlib.sha256(data).hexdigest(), raw.get("meta", {}), Embedder(cache))

    @property
    def sha(self) -> str:
        return self._sha

    def judge_many(
        self, cases: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> list[list[LocalVerdict]]:
        """cases = [(insight_texts, bullet_texts), ...] one per summary; verdicts per insight."""
        rows = featurise(cases, self.embedder)
        flat = [r for case in rows for r in case]
        if not flat:
            return [[] for _ in cases]
        proba = self.model.proba(np.asarray([r.values for r in flat], dtype=np.float64))
        verdicts = []
        for r, p in zip(flat, proba, strict=True):
            label = LABELS[int(np.argmax(p))] if r.top is not None else LABELS[0]
            verdicts.append(
                LocalVerdict(
                    label=label,
                    bullet=None if label == LABELS[0] or r.top is None else r.top + 1,
                    proba=(float(p[0]), float(p[1]), float(p[2])),
                )
            )
        out, k = [], 0
        for case in rows:
            out.append(verdicts[k : k + len(case)])
            k += len(case)
        return out
