"""A model `tiny` on one SummHay haystack through the construct and generate stages, against a
test server: what the stage tests of generation share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core import registry
from pipeline.core.params import validate_params
from pipeline.stages.construct import construct
from pipeline.stages.generate import generate

ROOT = Path(__file__).resolve().parents[2]


def generate_tiny(base_url: str, data: Path, tmp: Path, **model: Any) -> Path:
    """Construct the dataset of `data` (news1) and generate with model `tiny` (oracle setting,
    `model`'s extra entry fields); the generations file (written even when the stage fails)."""
    entry = {
        "provider": "openai",
        "base_url": base_url,
        "model": "tiny",
        "api_key_env": None,
        "settings": ["oracle"],
        **model,
    }
    params = validate_params(
        {
            "models": {"tiny": entry},
            "judges": {"local": {"provider": "local"}},
            "summhay": {"haystacks": ["news1"], "models": ["tiny"], "judges": ["local"]},
        },
        benchmarks=["summhay"],
    )
    bench = registry.get("summhay")
    ds, out = tmp / "ds.jsonl", tmp / "tiny.jsonl"
    construct(bench, params, data, ds, ROOT)
    generate(bench, params, "tiny", ds, data, out, ROOT)
    return out
