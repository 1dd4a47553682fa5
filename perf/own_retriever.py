"""The `dense` retriever against an `embeddings` retriever serving the same MiniLM from a real
server (llama.cpp's, the GGUF written by `pipeline.testing.minilm_gguf`), on SummHay and CRUX.

    python perf/own_retriever.py [--haystacks news1,news2,...] [--subtopics N] [--threads 2]
                                 [--out perf/own_retriever.json]

In a fresh copy of the project (its tracked files, data from the local mirror): SummHay's
released haystacks (no length study) and CRUX derived from the same, two retrievers entries,
`dense-e` (provider dense) and `minilm-api` (provider embeddings, windows of 254 MiniLM word
pieces, as the dense retriever cuts). Both run as retrieval stages of both benchmarks (`dvc
repro`), CRUX judges the contexts with its labels. Prints (and writes as JSON):

- per SummHay query, whether the two retrievers' top-5 documents are the same set; the share
  of queries where they are, the mean overlap, and Kendall's tau of the two full rankings;
- CRUX Coverage at |Z*| and alpha-nDCG at 10 of both (and of bm25 beside them), per domain;
- the server's requests and time, and a second `dvc repro -f` of the embeddings stage: its
  requests (0: the response cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.testing.minilm_gguf import convert, serve  # noqa: E402
from tests.conftest import make_project, run  # noqa: E402

RETRIEVERS = ("bm25", "dense-e", "minilm-api")


def configure(proj: Path, base_url: str, haystacks: list[str], subtopics: int | None) -> None:
    p = yaml.safe_load((proj / "params.yaml").read_text(encoding="utf-8"))
    p["runtime"] = "local"
    p["retrievers"] = {
        "dense-e": {"provider": "dense"},
        "minilm-api": {
            "provider": "embeddings",
            "base_url": base_url,
            "model": "minilm",
            "api_key_env": None,
            "window_tokens": 254,
            "tokenizer": "minilm",
            "batch_size": 32,
            "max_concurrency": 1,
            "timeout_s": 600,
        },
    }
    s = p["summhay"]
    s.update(haystacks=haystacks, subtopics=subtopics, retrievers=["dense-e", "minilm-api"])
    s["lengths"]["haystacks"] = []
    # what CRUX's aggregate needs of SummHay's outputs, kept to seconds (no answers compared)
    p["models"]["published"].update(systems=["gpt-4o"], settings=["oracle"])
    s.update(models=["published"], judges=["published-gpt-4o"])
    s["agreement"].update(bootstrap_resamples=20, max_samples=4)
    p["judges"]["local"]["train"]["haystacks"] = ["news1"]
    c = p["crux"]
    c["derived"].update(haystacks=haystacks, subtopics=subtopics)
    c.update(retrievers=["dense-e", "minilm-api"], judges=["crux-labels"])
    c["answers"]["generations"] = None
    p["models"]["crux-contexts"]["retrievers"] = ["zstar", "bm25", "dense-e", "minilm-api"]
    (proj / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False), encoding="utf-8")


def rankings(proj: Path, bench: str, name: str) -> dict[str, list[str]]:
    path = proj / "retrievals" / bench / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return {r["query_id"]: [p for p, _ in r["ranking"]] for r in rows}


def kendall(a: list[str], b: list[str]) -> float:
    from scipy.stats import kendalltau

    pos = {p: i for i, p in enumerate(b)}
    return float(kendalltau(list(range(len(a))), [pos[p] for p in a]).statistic)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--haystacks",
        default="news1,news2,news3,news4,news5,conv1,conv2,conv3,conv4,conv5",
    )
    ap.add_argument("--subtopics", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    mirror = ROOT.parent / "shared" / "data"
    with tempfile.TemporaryDirectory(prefix="lfbench-own-retriever-") as tmp_:
        tmp = Path(tmp_)
        proj = make_project(tmp / "proj", mirror)
        gguf = convert(tmp / "minilm.gguf")
        log = tmp / "server.log"
        with serve(gguf, log, threads=args.threads) as base:
            configure(proj, base, args.haystacks.split(","), args.subtopics)
            stages = [
                "summhay-retrieve@dense-e",
                "summhay-retrieve@minilm-api",
                "crux-retrieve@dense-e",
                "crux-retrieve@minilm-api",
                "crux-aggregate",
            ]
            t0 = time.perf_counter()
            run(["dvc", "repro", *stages], proj)
            wall = time.perf_counter() - t0
            usage = json.loads((proj / "retrievals/usage/summhay/minilm-api.json").read_text())
            sent = log.read_text().count("POST /v1/embeddings")
            run(["dvc", "repro", "-f", "summhay-retrieve@minilm-api"], proj)
            again = log.read_text().count("POST /v1/embeddings") - sent
        dense, api = rankings(proj, "summhay", "dense-e"), rankings(proj, "summhay", "minilm-api")
        same5 = [set(dense[q][:5]) == set(api[q][:5]) for q in dense]
        overlap = [len(set(dense[q][:5]) & set(api[q][:5])) / 5 for q in dense]
        taus = [kendall(dense[q], api[q]) for q in dense]
        rows = json.loads((proj / "metrics" / "crux.json").read_text())["rows"]
        crux: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["judge"] != "crux-labels" or r["retriever"] not in RETRIEVERS:
                continue
            key = f"{r['retriever']} ({r['domain']})"
            if r["cutoff"] == "zstar":
                crux.setdefault(key, {})["coverage@zstar"] = r["coverage"]
            if r["cutoff"] == "10":
                crux.setdefault(key, {})["alpha_ndcg@10"] = r["alpha_ndcg"]
        result = {
            "summhay_queries": len(same5),
            "same_top5_share": round(sum(same5) / len(same5), 4),
            "top5_overlap_mean": round(sum(overlap) / len(overlap), 4),
            "kendall_tau_mean": round(sum(taus) / len(taus), 4),
            "crux": crux,
            "embedding_requests": usage["requests_sent"],
            "embedded_texts": usage["items"],
            "server_tokens": usage["input_tokens"],
            "repro_wall_s": round(wall, 1),
            "requests_on_forced_rerun": again,
        }
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
