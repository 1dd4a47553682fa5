"""`lfbench export`: what a pipeline made elsewhere needs, and what it gives back.

- `queries`: what a retriever ranks for a benchmark (query ids and texts, passage ids and,
  with `--texts`, texts), as its retrieval stage sees them: index them in your own search
  engine and bring back a TREC run file (`provider: run`).
- `questions`: what a whole RAG system is asked (item ids, questions, the task in words, the
  documents): answer them anywhere and bring back an `outputs` file (`provider: outputs`).
- `outputs`: a model's generations in the `outputs` form (e.g. to hand a colleague the answers
  of your Python system, or to check that replaying them gives the same numbers).

Everything is read from the dataset file the benchmark's construct stage wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark
from pipeline.core.config import Params
from pipeline.core.errors import ConfigError
from pipeline.core.io import read_jsonl
from pipeline.core.records import Generation
from pipeline.stages.common import context, read_dataset


def _dataset(bench: AnyBenchmark, params: Params, root: Path, path: Path, data: Path) -> Any:
    if not path.exists():
        raise ConfigError(
            f"{path}: the dataset is not built yet: run `dvc repro {bench.name}-construct`"
        )
    return context(bench, params, root, data), read_dataset(bench, path)


def queries(
    bench: AnyBenchmark,
    params: Params,
    root: Path,
    dataset: Path,
    data: Path,
    retriever: str | None,
    texts: bool,
) -> Iterator[dict[str, Any]]:
    if bench.retrieval is None:
        raise ConfigError(f"{bench.name} takes no retrievers of yours")
    ctx, ds = _dataset(bench, params, root, dataset, data)
    for q in bench.retrieval.queries(ctx, ds, retriever or ""):
        passages: list[Any] = (
            [{"id": p.id, "text": p.text} for p in q.passages]
            if texts
            else [p.id for p in q.passages]
        )
        yield {"query_id": q.id, "query": q.text, "depth": q.depth, "passages": passages}


def questions(
    bench: AnyBenchmark, params: Params, root: Path, dataset: Path, data: Path
) -> Iterator[dict[str, Any]]:
    if bench.systems is None:
        raise ConfigError(f"{bench.name} runs no whole RAG system")
    ctx, ds = _dataset(bench, params, root, dataset, data)
    for q in bench.systems.questions(ctx, ds):
        yield {
            "item_id": q.id,
            "question": q.question,
            "task": q.task,
            "documents": [{"id": d.id, "text": d.text} for d in q.documents],
        }


def outputs(generations: Path) -> list[dict[str, Any]]:
    from pipeline.stages.systems import export_outputs

    return export_outputs(read_jsonl(generations, Generation))


def data_dir(root: Path, benchmark: str) -> Path:
    """The raw-data folder the benchmark's stages read: `--data` of its construct stage in
    dvc.yaml (empty when it has none)."""
    from pipeline.core import dvcfile
    from pipeline.stages.plan import StageCmd

    spec = dvcfile.stages(root / "dvc.yaml").get(f"{benchmark}-construct") or {}
    return Path(
        StageCmd.parse(f"{benchmark}-construct", str(spec.get("cmd", ""))).options.get("data", "")
    )
