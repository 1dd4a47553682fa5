"""A CRUD-RAG context over the synthetic fixture (every task family) or the released data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.benchmarks.crud_rag.params import CrudParams
from pipeline.core.benchmark import Context
from pipeline.core.params import validate_params
from pipeline.core.prompts import load_prompt
from pipeline.stages.common import FileInputs

HERE = Path(__file__).parent
ROOT = Path(__file__).resolve().parents[3]
ALL_TASKS = [
    "continuing_writing",
    "questanswer_1doc",
    "questanswer_2docs",
    "questanswer_3docs",
    "hallu_modified",
    "event_summary",
]


def ctx(root: Path = HERE, data_dir: str = "", **section: Any) -> Context[CrudParams]:
    raw = {
        "models": {
            "lead": {"provider": "baseline", "kind": "lead"},
            "extractive": {"provider": "baseline", "kind": "extractive"},
        },
        "judges": {"text": {"provider": "crud_rag-text"}},
        "crud_rag": {
            "source": "fixture/crud_split.json",
            "tasks": ALL_TASKS,
            "corpus": "fixture/corpus",
            "quest_eval": {"caches": "fixture"},
            "grid": {"base": {"chunk_size": 16, "chunk_overlap": 0, "retriever": "bm25",
                              "top_k": 2},
                     "chunk": [[16, 2], [32, 1]], "chunk_overlap": [0, 50],
                     "retriever": ["bm25"], "top_k": [1, 2]},
            "models": ["lead", "extractive"],
            "judges": ["text"],
            **section,
        },
    }  # fmt: skip
    params = validate_params(raw, benchmarks=["crud_rag"])
    cx = params.section("crud_rag", CrudParams)
    prompts = {k: load_prompt(v, ROOT) for k, v in cx.prompts.model_dump().items()}
    return Context(params, cx, prompts, FileInputs(root), data_dir)
