"""Speed of lfbench's retrieval pieces on one real haystack (CPU, offline).

    python perf/retrieval_speed.py [--mirror DIR] [--haystack news1] [--json]

Times cl100k_base token counting over the haystack's documents, BM25 scoring of them for one
subtopic, and the numpy all-MiniLM-L6-v2 encoder: `embed` (each document truncated to 256 word
pieces) and `dense_scores` (every document cut into 256-word-piece windows, max over windows).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pipeline.data.haystacks import haystack_file, load_raw_haystack, normalise
from pipeline.retrieval import bm25, dense, tokens
from pipeline.retrieval.context import retrieval_query

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_mirror = os.environ.get("LFBENCH_DATA_MIRROR", str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--mirror", type=Path, default=Path(default_mirror))
    ap.add_argument("--haystack", default="news1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    path = args.mirror / "summhay" / haystack_file(args.haystack)
    hay = normalise(args.haystack, load_raw_haystack(path), path.name)
    docs = [d.text for d in hay.documents]
    query = retrieval_query(hay.subtopics[0])
    out: dict[str, float] = {"documents": len(docs)}

    tokens.get_encoding()
    t = time.perf_counter()
    n = sum(tokens.count_tokens(d) for d in docs)
    out["cl100k_tokens"] = n
    out["cl100k_tokens_per_s"] = n / (time.perf_counter() - t)

    t = time.perf_counter()
    bm25.bm25_scores(query, docs)
    out["bm25_s"] = time.perf_counter() - t

    t = time.perf_counter()
    model = dense.get_model()
    out["dense_load_s"] = time.perf_counter() - t
    pieces = model.word_pieces(docs)
    out["wordpieces"] = sum(map(len, pieces))
    out["windows"] = sum(len(model.windows(p, all_windows=True)) for p in pieces)

    t = time.perf_counter()
    dense.embed(docs)
    out["dense_embed_truncated_s"] = time.perf_counter() - t

    dense._CHUNK_CACHE.clear()
    t = time.perf_counter()
    dense.dense_scores(query, docs)
    out["dense_scores_windowed_s"] = time.perf_counter() - t
    out["dense_windowed_wordpieces_per_s"] = out["windows"] * 256 / out["dense_scores_windowed_s"]

    t = time.perf_counter()
    dense.dense_scores(retrieval_query(hay.subtopics[1]), docs)
    out["dense_scores_cached_s"] = time.perf_counter() - t

    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:36s} {v:,.2f}")


if __name__ == "__main__":
    main()
