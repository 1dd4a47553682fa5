"""What a sweep of M models x J judges over the four benchmarks asks of a model API: requests and
tokens counted from the datasets `dvc repro` built (cl100k_base tokens, the project's counter),
then dollars and hours at the prices and rates you give. The figures of docs/scale.md.

    python perf/scale_plan.py [--models 10] [--judges 3] [--price-in 2.5] [--price-out 10]
                              [--tpm 2000000] [--rpm 5000]

Counting rules (one model, one judge; the papers' default grids):
- SummHay: the 10 released haystacks (92 subtopics, 621 insights), settings full haystack and a
  15k-token RAG context; a summary of ~400 tokens; judged per insight (one request per insight
  and summary: the summary, the insight and ~350 tokens of instructions).
- Long^2RAG: the 92 questions of the default slice, settings long context and three RAG budgets
  (512/1024/2048 tokens per retrieved chunk set, 5 chunks); an answer of ~400 tokens; one judge
  request per key point.
- CRUX: 92 queries; one rating request per (passage in the 15k-token context, sub-question).
- CRUD-RAG: 100 event-summary records, 8 retrieved 128-character chunks; RAGQuestEval answers
  its cached questions from the output (one request per record).
Instruction overheads are the project's prompts' sizes, rounded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.retrieval.tokens import count_tokens  # noqa: E402

ANSWER = 400  # tokens of a summary or answer
INSTR = 350  # tokens of a judge prompt's instructions
VERDICT = 60  # tokens of a verdict


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summhay(ds: Path) -> dict[str, float]:
    rows = [r for r in jsonl(ds / "summhay.jsonl") if r.get("derived") is None]
    hay = [sum(count_tokens(d["text"]) for d in r["documents"]) for r in rows]
    subs = [(i, s) for i, r in enumerate(rows) for s in r["subtopics"]]
    insights = sum(len(s["insights"]) for _, s in subs)
    full_in = sum(hay[i] + INSTR for i, _ in subs)
    rag_in = len(subs) * (15000 + INSTR)
    gen_req = 2 * len(subs)
    judge_req = 2 * insights
    return {
        "gen_requests": gen_req,
        "gen_in": full_in + rag_in,
        "gen_out": gen_req * ANSWER,
        "judge_requests": judge_req,
        "judge_in": judge_req * (ANSWER + 40 + INSTR),
        "judge_out": judge_req * VERDICT,
    }


def long2rag(ds: Path) -> dict[str, float]:
    rows = jsonl(ds / "long2rag.jsonl")
    docs = [sum(count_tokens(d["text"]) for d in r["documents"]) for r in rows]
    kps = sum(len(r["key_points"]) for r in rows)
    settings_in = sum(d + INSTR for d in docs) + sum(
        len(rows) * (5 * b + INSTR) for b in (512, 1024, 2048)
    )
    gen_req = 4 * len(rows)
    judge_req = 4 * kps
    return {
        "gen_requests": gen_req,
        "gen_in": settings_in,
        "gen_out": gen_req * ANSWER,
        "judge_requests": judge_req,
        "judge_in": judge_req * (ANSWER + 60 + INSTR),
        "judge_out": judge_req * VERDICT,
    }


def crux(ds: Path) -> dict[str, float]:
    cols = jsonl(ds / "crux.jsonl")
    req = tin = 0
    for c in cols:
        plen = {p["pid"]: count_tokens(p["text"]) for p in c["passages"]}
        mean_p = sum(plen.values()) / max(1, len(plen))
        per_ctx = int(15000 // max(1.0, mean_p))  # passages packed into a 15k context
        for q in c["queries"]:
            n = per_ctx * len(q["subquestions"])
            req += n
            tin += n * (int(mean_p) + 30 + INSTR)
    return {
        "gen_requests": 0,
        "gen_in": 0,
        "gen_out": 0,
        "judge_requests": req,
        "judge_in": tin,
        "judge_out": req * 10,
    }


def crud_rag(ds: Path) -> dict[str, float]:
    rows = jsonl(ds / "crud_rag.jsonl")
    q = sum(count_tokens(r["query"]) for r in rows)
    ctx = len(rows) * count_tokens("字" * 128) * 8
    return {
        "gen_requests": len(rows),
        "gen_in": q + ctx + len(rows) * INSTR,
        "gen_out": len(rows) * ANSWER,
        "judge_requests": len(rows),
        "judge_in": len(rows) * (ANSWER + 300 + INSTR),
        "judge_out": len(rows) * 150,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=Path, default=ROOT / "datasets")
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--judges", type=int, default=3)
    p.add_argument("--price-in", type=float, default=2.5, help="$ per 1M input tokens")
    p.add_argument("--price-out", type=float, default=10.0, help="$ per 1M output tokens")
    p.add_argument("--tpm", type=float, default=2_000_000, help="the API's tokens per minute")
    p.add_argument("--rpm", type=float, default=5_000, help="the API's requests per minute")
    a = p.parse_args()
    per = {
        "summhay": summhay(a.datasets),
        "long2rag": long2rag(a.datasets),
        "crux": crux(a.datasets),
        "crud_rag": crud_rag(a.datasets),
    }
    out: dict[str, Any] = {"per_model_judge": per}
    total = {"requests": 0.0, "in": 0.0, "out": 0.0}
    for name, c in per.items():
        # generation once per model; judging once per model and judge (CRUX: per judge only)
        gens = 0 if name == "crux" else a.models
        judged = a.judges if name == "crux" else a.models * a.judges
        total["requests"] += gens * c["gen_requests"] + judged * c["judge_requests"]
        total["in"] += gens * c["gen_in"] + judged * c["judge_in"]
        total["out"] += gens * c["gen_out"] + judged * c["judge_out"]
    dollars = total["in"] / 1e6 * a.price_in + total["out"] / 1e6 * a.price_out
    minutes = max(total["requests"] / a.rpm, (total["in"] + total["out"]) / a.tpm)
    out.update(
        models=a.models,
        judges=a.judges,
        total_requests=int(total["requests"]),
        total_input_tokens=int(total["in"]),
        total_output_tokens=int(total["out"]),
        dollars=round(dollars, 2),
        hours_at_rate_limit=round(minutes / 60, 2),
    )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
