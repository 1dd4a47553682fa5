"""Does the audit's prediction-powered interval hold? A coverage study on SummHay's people.

    python perf/audit_coverage.py [--draws 200] [--sizes 30,60,120] [--seed 0] [--json]

SummHay's release has 1,419 insight verdicts made by professional annotators (200 summaries).
Each draw plays an audit: n of the 1,419 verdicts are drawn as `lfbench audit sample` draws them
(`systematic_sample`: stratified by the judge's label, spread over the summaries, seeded with the
draw's number), the annotators' labels on those n stand in for the person's, and the judge's
values on all 1,419 are the run's. The target is the coverage (0-100) all 1,419 human labels
give. Per judge and n it reports, over the draws:

- `ppi`: how often the prediction-powered 95% interval (`ppi_mean`) covers the target, its mean
  width, and the mean error of its estimate;
- `human`: the same for the classical interval from the n human labels alone (`classical_mean`).

`--design srs` draws simple random samples instead (no stratification), for comparison: the
audit's stratified draw already uses the judge's labels, so there the human-only estimate is as
accurate as the corrected one and only its interval (which assumes simple random draws) is wider.

Judges: the local judge (stage local-judge-train's model, judging the annotated summaries as
stage summhay-agreement does: `dvc repro local-judge-train` first) and the released GPT-4o
judgements (`prompted_gpt-4o`, what the `published-gpt-4o` judge stands for). Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from pipeline.benchmarks.summhay.agreement import SCORE  # noqa: E402
from pipeline.core.params import load_params  # noqa: E402
from pipeline.core.registry import get as get_benchmark  # noqa: E402
from pipeline.metrics.audit import classical_mean, ppi_mean, systematic_sample  # noqa: E402
from pipeline.stages.agreement import judge_labelled  # noqa: E402
from pipeline.stages.common import context  # noqa: E402

LABELS = ROOT / "data/summhay/eval_benchmark_data.json"


def judges_on_people(root: Path) -> tuple[list[float], dict[str, tuple[list[str], list[float]]]]:
    """The annotators' values on the 1,419 verdicts, and each judge's labels and values on
    them (in the same order)."""
    bench = get_benchmark("summhay")
    params = load_params(root / "params.yaml", ["summhay"])
    ctx = context(bench, params, root)
    ag = bench.agreement
    assert ag is not None
    raw = json.loads(LABELS.read_text(encoding="utf-8"))
    samples = ag.load(ctx, raw, str(LABELS))
    released = ag.released(samples)
    mine, _ = judge_labelled(bench, ctx, samples, released, root)
    judged = {"gpt-4o (released)": released["prompted_gpt-4o"]}
    judged |= {f"{n} (lfbench)": v for n, v in mine.items() if n == "local"}
    human: list[float] = []
    out: dict[str, tuple[list[str], list[float]]] = {k: ([], []) for k in judged}
    for s in samples:
        for iid, _ in s.insights:
            human.append(100 * SCORE[s.human[iid].cls])
            for name, labels in judged.items():
                label = labels[s.sample_id][iid]
                cls = "NO" if label is None else label.cls  # an unusable verdict: none here
                out[name][0].append(cls)
                out[name][1].append(100 * SCORE[cls])
    return human, out


def study(
    human: list[float],
    judge: tuple[list[str], list[float]],
    items: list[str],
    n: int,
    draws: int,
    design: str = "audit",
) -> dict[str, Any]:
    labels, values = judge
    target = sum(human) / len(human)
    rows = {"ppi": [], "human": []}  # type: dict[str, list[tuple[bool, float, float]]]
    for d in range(draws):
        if design == "audit":
            idx = systematic_sample(labels, items, n, seed=d)
        else:  # simple random sampling, for comparison
            rng = np.random.default_rng(d)
            idx = sorted(int(i) for i in rng.choice(len(human), size=n, replace=False))
        h = [human[i] for i in idx]
        ppi = ppi_mean(values, [values[i] for i in idx], h)
        hum = classical_mean(h)
        for name, est in (("ppi", ppi), ("human", hum)):
            rows[name].append((est.low <= target <= est.high, est.width, est.estimate - target))
    out: dict[str, Any] = {"n": n, "draws": draws, "design": design, "target": round(target, 3)}
    for name, rs in rows.items():
        out[name] = {
            "coverage": sum(r[0] for r in rs) / len(rs),
            "mean_width": round(sum(r[1] for r in rs) / len(rs), 3),
            "mean_error": round(sum(r[2] for r in rs) / len(rs), 3),
            "rmse": round((sum(r[2] ** 2 for r in rs) / len(rs)) ** 0.5, 3),
        }
    out["judge_mean"] = round(sum(values) / len(values), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--sizes", default="30,60,120")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--design",
        choices=("audit", "srs"),
        default="audit",
        help="audit: as `lfbench audit sample` draws; srs: simple random draws",
    )
    args = ap.parse_args()
    human, judges = judges_on_people(ROOT)
    raw = json.loads(LABELS.read_text(encoding="utf-8"))
    items = [f"{i}" for i, s in enumerate(raw) for _ in s["annotation"]]
    results = []
    for name, judge in judges.items():
        for n in (int(x) for x in args.sizes.split(",")):
            results.append(
                {"judge": name, **study(human, judge, items, n, args.draws, args.design)}
            )
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{len(human)} human verdicts; target coverage {results[0]['target']:.2f}")
    print(
        f"{'judge':22} {'n':>4} {'judge mean':>10} | {'PPI cover':>9} {'width':>6} {'rmse':>5}"
        f" | {'human cover':>11} {'width':>6} {'rmse':>5}"
    )
    for r in results:
        p, h = r["ppi"], r["human"]
        print(
            f"{r['judge']:22} {r['n']:>4} {r['judge_mean']:>10.2f} | {p['coverage']:>9.1%}"
            f" {p['mean_width']:>6.2f} {p['rmse']:>5.2f} | {h['coverage']:>11.1%}"
            f" {h['mean_width']:>6.2f} {h['rmse']:>5.2f}"
        )


if __name__ == "__main__":
    main()
