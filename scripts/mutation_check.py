"""Do the tests catch a broken metric? Break one line of the code at a time, run the tests that
should notice, and report whether they failed (they must). The source is restored after each.

    python scripts/mutation_check.py            # every mutation
    python scripts/mutation_check.py kappa-w    # the ones whose name contains "kappa-w"

Each mutation is a bug one could plausibly write: an off-by-one between the annotators' 0-based
and the judges' 1-based bullets, linear weights where quadratic belong, Randolph's k from the
labels seen, a question without key points counted as recall 0, the leakage guard switched off,
a replayed judge rated by the wrong released predictions, embedding workers' results put
back in the wrong order; and in the shared layers: a judge loop that never repairs or re-reads
targets it already has, stage dependencies blind to imports inside functions, a registry that
accepts a duplicate, a construct stage blind to a missing retriever. Exit status 1 if any
survives.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    tests: str


MUTATIONS = [
    Mutation(
        "audit-rectifier-sign",
        "pipeline/metrics/audit.py",
        "rectifier = hl - lam * fl",
        "rectifier = lam * fl - hl",
        "tests/metrics/test_audit.py",
    ),
    Mutation(
        "audit-finite-population-correction-dropped",
        "pipeline/metrics/audit.py",
        "se = math.sqrt(factor * _var(rectifier) / n)",
        "se = math.sqrt(_var(rectifier) / n)",
        "tests/metrics/test_audit.py",
    ),
    Mutation(
        "audit-judge-weight-not-clipped",
        "pipeline/metrics/audit.py",
        "return min(max(cov / var_f, 0.0), 1.0)",
        "return cov / var_f",
        "tests/metrics/test_audit.py",
    ),
    Mutation(
        "audit-sample-not-stratified",
        "pipeline/metrics/audit.py",
        "key=lambda i: (stratum_rank[repr(strata[i])], item_rank[repr(items[i])], int(inner[i])),",
        "key=lambda i: (item_rank[repr(items[i])], int(inner[i])),",
        "tests/metrics/test_audit.py",
    ),
    Mutation(
        "audit-metrics-in-the-rows-fingerprint",
        "pipeline/stages/tracking.py",
        "metrics = {k: v for k, v in run.data.metrics.items() if not k.startswith(AUDIT)}",
        "metrics = dict(run.data.metrics)",
        "tests/stages/test_audit.py",
    ),
    Mutation(
        "linking-off-by-one",
        "pipeline/benchmarks/summhay/agreement.py",
        "hits.append(1.0 if j.link == r.link else 0.0)",
        "hits.append(1.0 if j.link - 1 == r.link else 0.0)",
        "tests/benchmarks/summhay/test_agreement.py",
    ),
    Mutation(
        "multi-link-counted-as-miss",
        "pipeline/benchmarks/summhay/agreement.py",
        "        if j.multi_link:\n            multi += 1\n            continue\n",
        "        if j.multi_link:\n            multi += 1\n            hits.append(0.0)\n"
        "            continue\n",
        "tests/benchmarks/summhay/test_agreement.py",
    ),
    Mutation(
        "kappa-weights-quadratic-as-linear",
        "pipeline/metrics/agreement.py",
        "w = ((i - j) ** 2).astype(float)",
        "w = np.abs(i - j).astype(float)",
        "tests/metrics/test_agreement.py",
    ),
    Mutation(
        "randolph-k-from-observed-labels",
        "pipeline/metrics/agreement.py",
        "    table, cats = _count_table(ratings, categories)\n    k = len(cats)\n",
        "    table, cats = _count_table(ratings, None)\n    k = len(cats)\n",
        "tests/metrics/test_agreement.py",
    ),
    Mutation(
        "replayed-judge-wrong-proxy",
        "pipeline/stages/agreement.py",
        "            judged[name] = released[proxy]\n",
        "            judged[name] = released[next(iter(released))]\n",
        "tests/benchmarks/summhay/test_agreement.py",
    ),
    Mutation(
        "kpr-excluded-question-as-zero",
        "pipeline/benchmarks/long2rag/scoring.py",
        "            excluded += 1\n            continue\n",
        "            excluded += 1\n            recalls.append(0.0)\n            continue\n",
        "tests/benchmarks/long2rag/test_scoring.py",
    ),
    Mutation(
        "embedding-workers-out-of-order",
        "pipeline/local_judge/embeddings.py",
        "        yield from pool.map(encode_texts, parts)\n",
        "        yield from pool.map(encode_texts, parts[::-1])\n",
        "tests/judging/test_local.py",
    ),
    Mutation(
        "leakage-guard-off",
        "pipeline/benchmarks/summhay/training.py",
        "        if reasons:\n",
        "        if reasons and False:\n",
        "tests/benchmarks/summhay/test_training.py",
    ),
    Mutation(
        "judge-loop-never-repairs",
        "pipeline/llm_judge/loop.py",
        "        if repair and answer.ask.repair is not None:\n",
        "        if False:\n",
        "tests/judging/test_loop.py",
    ),
    Mutation(
        "judge-loop-repair-rereads-every-target",
        "pipeline/llm_judge/loop.py",
        "            still = _absorb(answer, result, list(bad))\n",
        "            still = _absorb(answer, result, answer.ask.targets)\n",
        "tests/judging/test_loop.py",
    ),
    Mutation(
        "stage-deps-skip-function-level-imports",
        "pipeline/env/deps.py",
        "    nodes: Iterable[ast.AST] = tree.body if top_level_only else ast.walk(tree)\n",
        "    nodes: Iterable[ast.AST] = tree.body\n",
        "tests/test_deps.py",
    ),
    Mutation(
        "registry-accepts-a-duplicate",
        "pipeline/core/registry.py",
        "    if name in _REGISTRY:\n",
        "    if False:\n",
        "tests/core/test_benchmark.py",
    ),
    Mutation(
        "construct-ignores-a-missing-retriever",
        "pipeline/benchmarks/summhay/benchmark.py",
        "                    if setting not in have:\n",
        "                    if False:\n",
        "tests/stages/test_construct_generate.py",
    ),
]


def run(m: Mutation) -> tuple[bool, float]:
    """(caught, seconds): apply, run the tests, restore."""
    path = ROOT / m.file
    original = path.read_text(encoding="utf-8")
    if original.count(m.old) != 1:
        raise SystemExit(f"{m.name}: the line to break is not in {m.file} exactly once")
    start = time.monotonic()
    try:
        path.write_text(original.replace(m.old, m.new), encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", m.tests],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    finally:
        path.write_text(original, encoding="utf-8")
    return proc.returncode != 0, time.monotonic() - start


def main() -> int:
    wanted = [m for m in MUTATIONS if not sys.argv[1:] or any(a in m.name for a in sys.argv[1:])]
    survived = []
    for m in wanted:
        caught, secs = run(m)
        print(f"{'caught  ' if caught else 'SURVIVED'} {m.name:36} {m.tests} ({secs:.0f} s)")
        if not caught:
            survived.append(m.name)
    print(f"{len(wanted) - len(survived)} of {len(wanted)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
