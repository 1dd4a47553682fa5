"""Does the local judge's encoder give the same bits on SSE4.2, AVX and this machine's CPU?

    python perf/encoder_isa.py [--sample 200] [--cpus Nehalem SandyBridge] [--model FILE]

Embeds `--sample` distinct SummHay texts (insights and bullets of the five news haystacks'
released summaries, spread over all lengths, plus the empty text and one over 256 word pieces)
with the encoder here and under QEMU's user-mode emulator (`qemu-x86_64 -cpu MODEL`, Debian
`qemu-user`) for each CPU model, the emulated runs side by side, and prints one JSON line per
model: vectors differing (raw float32 and after the float16 rounding of the embedding cache), the
largest difference, the lowest cosine, the CPU features numpy saw under emulation, seconds.
`--model` checks another graph file, e.g. one built by an earlier commit's
`pipeline.local_judge.encoder_onnx` (the before of a change; `--level all` runs it as that commit
did, with ONNX Runtime's fusions). QEMU 7.2 runs about 2.5 s per text.
Run it under `flock /tmp/lfbench-heavy.lock` on the shared machine.

Measured (this AMD EPYC, AVX2/FMA, QEMU 7.2): see docs/local_judge.md, "The same vectors on
every CPU".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.benchmarks.summhay.training import published_cases  # noqa: E402
from pipeline.local_judge import encoder_onnx, portability  # noqa: E402
from pipeline.local_judge.features import clean_text  # noqa: E402
from pipeline.stages.common import FileInputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=ROOT / "data/summhay")
    ap.add_argument("--sample", type=int, default=200)
    ap.add_argument("--cpus", nargs="+", default=list(portability.EMULATED_CPUS.values()))
    ap.add_argument("--model", type=Path, help="an ONNX file (default: build the current graph)")
    ap.add_argument("--level", choices=["basic", "all"], default="basic", help="ORT optimisation")
    args = ap.parse_args()
    if portability.qemu() is None:
        raise SystemExit("qemu-x86_64 not found: apt-get install qemu-user")

    cases = published_cases(
        FileInputs(Path("/")), str(args.data.resolve()), [f"news{i}" for i in range(1, 6)]
    )
    texts = sorted(
        {clean_text(t) for c in cases for t in (*c.units, *c.bullets)}, key=lambda t: (len(t), t)
    )
    step = max(1, len(texts) // args.sample)
    sample = [*texts[::step][: args.sample], "", " ".join(texts[-40:])]

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or encoder_onnx.model_path(Path(tmp))
        here = portability.native_vectors(sample, model, level=args.level)
        with ThreadPoolExecutor(max_workers=len(args.cpus)) as pool:
            runs = list(
                pool.map(
                    lambda cpu: portability.emulated_vectors(sample, model, cpu, level=args.level),
                    args.cpus,
                )
            )
    for cpu, (vectors, report) in zip(args.cpus, runs, strict=True):
        cos = (vectors * here).sum(1) / (
            np.linalg.norm(vectors, axis=1) * np.linalg.norm(here, axis=1) + 1e-30
        )
        f16 = (vectors.astype(np.float16) != here.astype(np.float16)).any(1)
        print(
            json.dumps(
                {
                    "benchmark": "encoder_isa",
                    "model": model.name,
                    "level": args.level,
                    "cpu": cpu,
                    "texts": len(sample),
                    "differ": int((vectors != here).any(1).sum()),
                    "differ_after_f16": int(f16.sum()),
                    "max_abs_diff": float(np.abs(vectors - here).max()),
                    "cos_min": round(float(cos.min()), 6),
                    "emulated_features": report["features"],
                    "native_cpu_flags": sorted(
                        {
                            f
                            for f in Path("/proc/cpuinfo").read_text(encoding="utf-8").split()
                            if f in ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni")
                        }
                    )
                    if Path("/proc/cpuinfo").exists()
                    else [],
                    "emulated_s": report["wall_s"],
                }
            )
        )


if __name__ == "__main__":
    main()
