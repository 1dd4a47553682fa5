"""Speed of the local judge on the 78 published systems x 336 news insights.

    python perf/local_judge.py [--model models/local-judge/model.json] [--cold-sample 2000]
                                     [--cold-full]

Judges every released news summary (5 haystacks, 3,276 summaries, 26,208 insight judgements)
with the trained model and prints one JSON line:

- `warm`: the judge with the embedding cache (.lfbench/cache/embeddings.sqlite) as the pipeline
  leaves it after the training stage (which embeds the same bullets): features, classifier,
  verdicts, and the embedding of any text not cached;
- `encoder`: MiniLM throughput (texts/s, worker start-up included) on a sample of `--cold-sample`
  distinct bullets, and the cold time it implies for all distinct texts (`cold_estimate_s`);
- `cold` (only with `--cold-full`): the whole run with an empty cache, measured (the encoder in
  `embed_workers` processes of one BLAS thread each; LFBENCH_EMBED_WORKERS=1 for one).

The machine is shared; `loadavg` is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.benchmarks.summhay.training import published_cases  # noqa: E402
from pipeline.local_judge.embeddings import Embedder, default_cache_path, workers  # noqa: E402
from pipeline.local_judge.features import clean_text  # noqa: E402
from pipeline.local_judge.model import LocalJudge  # noqa: E402
from pipeline.stages.common import FileInputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=ROOT / "models/local-judge/model.json")
    ap.add_argument("--data", type=Path, default=ROOT / "data/summhay")
    ap.add_argument("--cold-sample", type=int, default=2000)
    ap.add_argument("--cold-full", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    cases = published_cases(
        FileInputs(Path("/")), str(args.data.resolve()), [f"news{i}" for i in range(1, 6)]
    )
    load_s = time.perf_counter() - t0
    pairs = [(c.units, c.bullets) for c in cases]
    n_judgements = sum(len(c.units) for c in cases)
    texts = list(dict.fromkeys(clean_text(t) for c in cases for t in (*c.units, *c.bullets)))
    out: dict[str, object] = {
        "benchmark": "local_judge",
        "cpus": os.cpu_count(),
        "embed_workers": workers(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "summaries": len(cases),
        "judgements": n_judgements,
        "distinct_texts": len(texts),
        "read_data_s": round(load_s, 2),
    }

    judge = LocalJudge.load(args.model, cache=default_cache_path(ROOT))
    t0 = time.perf_counter()
    verdicts = judge.judge_many(pairs)
    warm_s = time.perf_counter() - t0
    assert sum(len(v) for v in verdicts) == n_judgements
    out["warm"] = {
        "seconds": round(warm_s, 2),
        "judgements_per_s": round(n_judgements / warm_s, 1),
        "texts_embedded": judge.embedder.computed,
        "texts_from_cache": judge.embedder.cache_hits,
    }
    judge.embedder.close()

    sample = sorted(texts, key=len)[:: max(1, len(texts) // args.cold_sample)][: args.cold_sample]
    fresh = Embedder(None)
    t0 = time.perf_counter()
    fresh.embed(sample)
    enc_s = time.perf_counter() - t0
    rate = len(sample) / enc_s
    out["encoder"] = {
        "sample": len(sample),
        "texts_per_s": round(rate, 1),
        "cold_estimate_s": round(len(texts) / rate + warm_s, 1),
    }

    if args.cold_full:
        with tempfile.TemporaryDirectory() as tmp:
            cold = LocalJudge.load(args.model, cache=Path(tmp) / "empty.sqlite")
            t0 = time.perf_counter()
            cold.judge_many(pairs)
            cold_s = time.perf_counter() - t0
            embedded = cold.embedder.computed
            cold.embedder.close()
        out["cold"] = {
            "seconds": round(cold_s, 1),
            "minutes": round(cold_s / 60, 2),
            "judgements_per_s": round(n_judgements / cold_s, 1),
            "texts_embedded": embedded,
        }
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
