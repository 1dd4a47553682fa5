"""Processes that embed the same texts at once on one cache: the CPU they spend together.

    python perf/shared_embedding.py [--texts 1500] [--processes 2] [--workers 1]
                                    [--save perf/shared_embedding.json]

`--processes` new interpreters start together (a barrier) and each embeds the same `--texts`
SummHay bullets (the released summaries of news1, the local judge's texts) with the local
judge's `Embedder` on one fresh SQLite cache, `LFBENCH_EMBED_WORKERS=--workers` each: what
several stages or project copies sharing `LFBENCH_EMBEDDING_CACHE` do when they miss the same
texts together. Reported: each process's texts computed and read, the CPU of all processes
(their own and their encoding workers', from resource.getrusage of the parent) and the wall
time. "claims" is the code as it is; "no claims" makes `EmbeddingCache.claim` hand every text
to its caller (what each process did before the claims: compute every text it missed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _summhay_bullets(n: int) -> list[str]:
    """The first `n` distinct bullets of the released summaries (news haystacks)."""
    import os

    mirror = Path(os.environ.get("LFBENCH_DATA_MIRROR", ROOT.parent / "shared" / "data"))
    out: list[str] = []
    for path in sorted((mirror / "summhay").rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        stack: list[Any] = [data]
        while stack and len(out) < n:
            x = stack.pop()
            if isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
            elif isinstance(x, str) and 40 <= len(x) <= 400 and x not in out:
                out.append(x)
        if len(out) >= n:
            break
    if len(out) < n:
        raise SystemExit(f"only {len(out)} texts found under {mirror / 'summhay'}")
    return out


def _child(cache: str, texts: list[str], workers: int, claims: bool, start: Any, out: Any) -> None:
    import os

    os.environ["LFBENCH_EMBED_WORKERS"] = str(workers)
    from pipeline.local_judge import embeddings as E

    if not claims:  # each process computes every text it missed, as before the claims

        def everything(self: Any, keys: Any, owner: str, limit: int) -> Any:
            return list(keys), {}, []

        E.EmbeddingCache.claim = everything  # type: ignore[method-assign]
    emb = E.Embedder(Path(cache))
    start.wait()
    emb.embed(texts)
    out.put((emb.computed, emb.cache_hits))
    emb.close()


def measure(texts: list[str], processes: int, workers: int, claims: bool) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "embeddings.sqlite")
        start, out = ctx.Barrier(processes), ctx.Queue()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        procs = [
            ctx.Process(target=_child, args=(cache, texts, workers, claims, start, out))
            for _ in range(processes)
        ]
        for p in procs:
            p.start()
        got = [out.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "claims": claims,
        "computed": [c for c, _ in got],
        "read": [h for _, h in got],
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=1500)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--save", type=Path)
    a = ap.parse_args()
    texts = _summhay_bullets(a.texts)
    rows = [measure(texts, a.processes, a.workers, claims) for claims in (False, True)]
    for r in rows:
        print(
            f"{'claims' if r['claims'] else 'no claims':>9}: computed {r['computed']}, read"
            f" {r['read']}, {r['cpu_s']} CPU-s, {r['wall_s']} s wall"
        )
    if a.save:
        a.save.write_text(
            json.dumps({"args": vars(a) | {"save": str(a.save)}, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
