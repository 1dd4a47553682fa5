"""What the local judge embeds on CRUX's default contexts, and how long that takes.

    python perf/crux_local_judge.py [--dataset datasets/crux.jsonl]
        [--generations generations/crux/crux-contexts.jsonl] [--sample-texts 400]

For each way of showing the local judge a (passage, sub-question) pair (every sentence of the
passage; its 1 or 2 sentences sharing the most content words with the sub-question) and each
query sample (the first 3 queries per collection, crux.judge_sample's default; every query),
the number of distinct texts to embed; then the embedding throughput on 2 workers, measured on
`--sample-texts` of those sentences with an empty cache, and the time each option would take
cold. Prints JSON. Needs the outputs of `dvc repro crux-generate@crux-contexts`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.baselines import split_sentences  # noqa: E402
from pipeline.benchmarks.crux.judging import best_sentences  # noqa: E402


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="datasets/crux.jsonl")
    ap.add_argument("--generations", default="generations/crux/crux-contexts.jsonl")
    ap.add_argument("--sample-texts", type=int, default=400)
    args = ap.parse_args()
    cols = _jsonl(ROOT / args.dataset)
    text = {p["pid"]: p["text"] for c in cols for p in c["passages"]}
    queries = {q["item_id"]: (n, q) for c in cols for n, q in enumerate(c["queries"])}
    gens = _jsonl(ROOT / args.generations)
    counts: dict[str, int] = {}
    sentences: set[str] = set()
    for sample in (3, None):
        pairs = {
            (p, s["text"])
            for g in gens
            if sample is None or queries[g["item_id"]][0] < sample
            for p in g["meta"]["ranking"]
            for s in queries[g["item_id"]][1]["subquestions"]
        }
        where = "all queries" if sample is None else f"first {sample} per collection"
        every = {x for p in {p for p, _ in pairs} for x in split_sentences(text[p])}
        counts[f"every sentence, {where}"] = len(every)
        for k in (1, 2):
            chosen = {x for p, q in pairs for x in best_sentences(text[p], q, k)}
            counts[f"{k} best sentence(s), {where}"] = len(chosen)
        sentences |= every
    from pipeline.local_judge.embeddings import Embedder

    probe = sorted(sentences)[: args.sample_texts]
    with tempfile.TemporaryDirectory() as tmp:
        emb = Embedder(Path(tmp) / "cache.sqlite")
        start = time.perf_counter()
        emb.embed(probe)
        elapsed = time.perf_counter() - start
        emb.close()
    rate = len(probe) / elapsed
    print(
        json.dumps(
            {
                "texts_per_second": round(rate, 1),
                "texts": counts,
                "cold_seconds": {k: round(v / rate) for k, v in counts.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
