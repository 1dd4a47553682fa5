"""Reference values from the CRUD-RAG authors' own metric functions, computed OUTSIDE lfbench.

tests/benchmarks/crud_rag/fixture/authors_metrics.json records what the authors'
`bleu_score` (with and without `with_penalty`) and `rougeL_score` (their
`src/metric/common.py`, through the `evaluate` scripts they ship in `src/.cache/huggingface/`)
return on chosen pairs; tests/benchmarks/crud_rag/test_metrics.py checks lfbench's metrics equal
them to 1e-6. This script recomputes those values, so anyone can check the fixture:

    git clone https://github.com/IAAR-Shanghai/CRUD_RAG /tmp/crud_rag_repo
    python3 -m venv /tmp/crud-ref && /tmp/crud-ref/bin/pip install evaluate==0.4.3 \\
        jieba==0.42.1 rouge_score==0.1.2 nltk absl-py
    /tmp/crud-ref/bin/python scripts/crud_rag_authors_values.py /tmp/crud_rag_repo \\
        --mirror ../shared/data

It runs the authors' functions from their checkout (nothing of theirs is copied into lfbench):
their `evaluate.load('src/.cache/huggingface/...')` paths are resolved against the checkout,
and their `text2vec`/`loguru` imports (unused by these two functions) are stubbed. It prints
each pair's values next to the fixture's, and exits non-zero on a difference above 1e-9.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests/benchmarks/crud_rag/fixture/authors_metrics.json"
)
RELEASED = "crud_rag/event_summary.first1328.json"


def authors_functions(repo: Path) -> dict[str, object]:
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.modules.setdefault("text2vec", types.SimpleNamespace(Similarity=None))  # type: ignore[arg-type]
    if "loguru" not in sys.modules:
        import logging

        sys.modules["loguru"] = types.SimpleNamespace(logger=logging.getLogger("authors"))  # type: ignore[assignment]
    os.chdir(repo)  # their evaluate.load paths are relative to the repository root
    ns: dict[str, object] = {}
    path = repo / "src/metric/common.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), ns)
    return ns


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo", type=Path, help="a checkout of IAAR-Shanghai/CRUD_RAG")
    ap.add_argument("--mirror", type=Path, required=True, help="the data mirror (../shared/data)")
    args = ap.parse_args()
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    records = json.loads((args.mirror / RELEASED).read_text(encoding="utf-8"))
    ns = authors_functions(args.repo.resolve())
    bleu, rouge = ns["bleu_score"], ns["rougeL_score"]
    worst = 0.0
    for pair in doc["pairs"]:
        if "record" in pair:
            rec = records[pair["record"]]
            gen, ref = rec["text"][:200], rec["summary"]
        else:
            gen, ref = pair["generation"], pair["reference"]
        b, bp, r = bleu(gen, ref), bleu(gen, ref, with_penalty=True), rouge(gen, ref)  # type: ignore[operator]
        got = {
            "bleu": None if b is None else b[0],
            "bleu_bp": None if bp is None else bp[0],
            "precisions": None if b is None else list(b[1:]),
            "rouge_l": r,
        }
        want = pair["authors"]
        for k in ("bleu", "bleu_bp", "rouge_l"):
            if got[k] is not None and want[k] is not None:
                worst = max(worst, abs(got[k] - want[k]))
            elif got[k] != want[k]:
                worst = float("inf")
        print(pair["name"], json.dumps(got, ensure_ascii=False))
    print(f"largest difference from the fixture: {worst:.3g}")
    return 0 if worst <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
