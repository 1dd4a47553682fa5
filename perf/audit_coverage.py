"""Does the audit's prediction-powered interval hold? A coverage study on SummHay's people.

    python perf/audit_coverage.py [--draws 1000] [--sizes 30,60,120] [--design audit|srs]
                                  [--json] [--save FILE] [--from FILE] [--write-readme]

SummHay's release has 1,419 insight verdicts made by professional annotators (200 summaries).
Each draw plays an audit: n of the 1,419 verdicts are drawn as `lfbench audit sample` draws them
(`systematic_sample`: stratified by the judge's label, spread over the summaries, seeded with the
draw's number), the annotators' labels on those n stand in for the person's, and the judge's
values on all 1,419 are the run's (so N = 1,419, the labelled units among them). The target is
the coverage (0-100) all 1,419 human labels give. Per judge and n it reports, over the draws:

- `ppi`: how often the corrected 95% interval (`ppi_mean`: power-tuned, with the
  finite-population correction, clipped to 0-100) covers the target, its mean width, the root
  mean squared error of its estimate, and the mean weight lambda it gave the judge;
- `human`: the same for the interval from the n human labels alone (`classical_mean`, the same
  correction).

Judges: the local judge (stage local-judge-train's model, judging the annotated summaries as
stage summhay-agreement does: `dvc repro local-judge-train` first), the released GPT-4o
judgements (`prompted_gpt-4o`, what the `published-gpt-4o` judge stands for), and two made-up
ones that show what a weak judge does to the interval: the people's own labels with 30% of them
changed to another label at random, and an uninformative judge (the people's labels shuffled:
the same shares, no information). Both are seeded.

`--design srs` draws simple random samples instead (no stratification), for comparison.
`--save FILE` keeps the results as JSON; `--from FILE` prints them again without computing;
`--write-readme` rewrites the README's block between `<!-- audit-coverage:begin -->` and
`<!-- audit-coverage:end -->` with `readme_block` of the results (a test checks that the README
holds the block of the committed `perf/audit_coverage.json`). Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

LABELS = ROOT / "data/summhay/eval_benchmark_data.json"
RESULTS = ROOT / "perf/audit_coverage.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- audit-coverage:begin -->", "<!-- audit-coverage:end -->"
BOUNDS = (0.0, 100.0)
FLIPPED, RANDOM = "people, 30% flipped", "uninformative"


def judges_on_people(root: Path) -> tuple[list[float], dict[str, tuple[list[str], list[float]]]]:
    """The annotators' values on the 1,419 verdicts, and each judge's labels and values on
    them (in the same order)."""
    from pipeline.benchmarks.summhay.agreement import SCORE
    from pipeline.core.params import load_params
    from pipeline.core.registry import get as get_benchmark
    from pipeline.stages.agreement import judge_labelled
    from pipeline.stages.common import context

    bench = get_benchmark("summhay")
    params = load_params(root / "params.yaml", ["summhay"])
    ctx = context(bench, params, root)
    ag = bench.agreement
    assert ag is not None
    raw = json.loads(LABELS.read_text(encoding="utf-8"))
    samples = ag.load(ctx, raw, str(LABELS))
    released = ag.released(samples)
    mine, _ = judge_labelled(bench, ctx, samples, released, root)
    judged = {"local judge (lfbench)": mine["local"]}
    judged |= {"GPT-4o (released judgements)": released["prompted_gpt-4o"]}
    human_cls: list[str] = []
    out: dict[str, tuple[list[str], list[float]]] = {k: ([], []) for k in judged}
    for s in samples:
        for iid, _ in s.insights:
            human_cls.append(s.human[iid].cls)
            for name, labels in judged.items():
                label = labels[s.sample_id][iid]
                cls = "NO" if label is None else label.cls  # an unusable verdict: none here
                out[name][0].append(cls)
                out[name][1].append(100 * SCORE[cls])
    rng = np.random.default_rng(0)
    classes = sorted(set(SCORE))
    flipped = [
        str(rng.choice([c for c in classes if c != h])) if rng.random() < 0.3 else h
        for h in human_cls
    ]
    shuffled = [human_cls[i] for i in rng.permutation(len(human_cls))]
    for name, cls in ((FLIPPED, flipped), (RANDOM, shuffled)):
        out[name] = (cls, [100 * SCORE[c] for c in cls])
    return [100 * SCORE[c] for c in human_cls], out


def study(
    human: list[float],
    judge: tuple[list[str], list[float]],
    items: list[str],
    n: int,
    draws: int,
    design: str = "audit",
) -> dict[str, Any]:
    from pipeline.metrics.audit import classical_mean, ppi_mean, systematic_sample

    labels, values = judge
    big_n = len(human)
    target = sum(human) / big_n
    rows: dict[str, list[tuple[bool, float, float]]] = {"ppi": [], "human": []}
    lams = []
    for d in range(draws):
        if design == "audit":
            idx = systematic_sample(labels, items, n, seed=d)
        else:  # simple random sampling, for comparison
            rng = np.random.default_rng(d)
            idx = sorted(int(i) for i in rng.choice(big_n, size=n, replace=False))
        h = [human[i] for i in idx]
        ppi = ppi_mean(values, [values[i] for i in idx], h, bounds=BOUNDS)
        hum = classical_mean(h, n_all=big_n, bounds=BOUNDS)
        lams.append(ppi.lam or 0.0)
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
    out["ppi"]["mean_lambda"] = round(sum(lams) / len(lams), 3)
    out["judge_mean"] = round(sum(values) / len(values), 3)
    return out


def run_study(draws: int, sizes: list[int], design: str) -> list[dict[str, Any]]:
    human, judges = judges_on_people(ROOT)
    raw = json.loads(LABELS.read_text(encoding="utf-8"))
    items = [f"{i}" for i, s in enumerate(raw) for _ in s["annotation"]]
    return [
        {"judge": name, **study(human, judge, items, n, draws, design)}
        for name, judge in judges.items()
        for n in sizes
    ]


def render_text(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{results[0]['target']:.2f}: the target coverage (all human labels); "
        f"{results[0]['draws']} draws, design {results[0]['design']}",
        f"{'judge':30} {'n':>4} {'judge mean':>10} | {'PPI cover':>9} {'width':>6} {'rmse':>5}"
        f" {'lambda':>6} | {'human cover':>11} {'width':>6} {'rmse':>5}",
    ]
    for r in results:
        p, h = r["ppi"], r["human"]
        lines.append(
            f"{r['judge']:30} {r['n']:>4} {r['judge_mean']:>10.2f} | {p['coverage']:>9.1%}"
            f" {p['mean_width']:>6.2f} {p['rmse']:>5.2f} {p['mean_lambda']:>6.2f} |"
            f" {h['coverage']:>11.1%} {h['mean_width']:>6.2f} {h['rmse']:>5.2f}"
        )
    return "\n".join(lines) + "\n"


def readme_block(results: list[dict[str, Any]]) -> str:
    """The README's text between the markers: the target, the judges' means, the table."""
    means: dict[str, float] = {}
    for r in results:
        means.setdefault(r["judge"], r["judge_mean"])
    first = results[0]
    said = "; ".join(f"{name} {mean:.2f}" for name, mean in means.items())
    intro = (
        f"The target is the coverage all 1,419 human labels give ({first['target']:.2f}); the"
        f" judges' own means on them: {said}. Measured here ({first['draws']:,} draws each,"
        f" design `{first['design']}`; `python perf/audit_coverage.py --save"
        " perf/audit_coverage.json --write-readme` writes this block, in about 25 s):"
    )
    lines = [
        *textwrap.wrap(intro, width=96, break_on_hyphens=False, break_long_words=False),
        "",
        "| judge | n | corrected: covers | mean width | RMSE | mean lambda"
        " | people alone: covers | mean width | RMSE |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p, h = r["ppi"], r["human"]
        lines.append(
            f"| {r['judge']} | {r['n']} | {p['coverage']:.1%} | {p['mean_width']:.1f}"
            f" | {p['rmse']:.2f} | {p['mean_lambda']:.2f} | {h['coverage']:.1%}"
            f" | {h['mean_width']:.1f} | {h['rmse']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str:
    """`text` (the README) with its block between the markers replaced by `block`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"README.md: expected one {BEGIN} and one {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def readme_table(text: str) -> str:
    """The block the README holds between the markers."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].removeprefix("\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    # 1,000 draws: a coverage's standard error about 0.7 points (200 left it near 1.5); about
    # 20 s on 2 cores, most of it the local judge on the 200 annotated summaries
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--sizes", default="30,60,120")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--design",
        choices=("audit", "srs"),
        default="audit",
        help="audit: as `lfbench audit sample` draws; srs: simple random draws",
    )
    ap.add_argument("--save", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--from", dest="src", type=Path, default=None, help="results saved before")
    ap.add_argument("--write-readme", action="store_true", help="rewrite the README's table")
    args = ap.parse_args()
    if args.src is not None:
        results = json.loads(args.src.read_text(encoding="utf-8"))
    else:
        sizes = [int(x) for x in args.sizes.split(",")]
        results = run_study(args.draws, sizes, args.design)
    if args.save is not None:
        args.save.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if args.write_readme:
        README.write_text(
            replace_block(README.read_text(encoding="utf-8"), readme_block(results)),
            encoding="utf-8",
        )
    print(json.dumps(results, indent=1) if args.json else render_text(results), end="")


if __name__ == "__main__":
    main()
