"""Whole RAG systems as models: the user's Python (`provider: python`) or answers made
elsewhere (`provider: outputs`).

The benchmark says what such a system is asked for each item (`Benchmark.systems.questions`:
the question, the item's documents, the task in words) and how an answer becomes its output
(`generation`). Here:

- `python`: the entry point (`module:callable`, looked up in `inputs/systems/` first) is called
  once per question, `f(question, **options)`, `max_concurrency` at a time. It returns the
  answer text, or a mapping (or an object) with `answer` and optionally `passages` (the ids of
  the documents it used: its context, which CRUX judges) and `citations` (per bullet or
  sentence, the ids it cites). Each finished answer is journaled (fsync'd) and kept in the
  response cache (`pipeline.stages.memo`): a crash, a kill or Ctrl-C loses none, and a re-run
  calls the system only for what it never answered (an edit to its code: everything again).
  An exception is that item's error (the others are written; the stage fails, exit 3, and a
  re-run retries it).
- `outputs`: a JSONL file per benchmark, one `{"item_id", "answer", "passages"?, "citations"?}`
  per line; an unknown, missing or repeated item id, or a line that is not such an object, is an
  error naming the file and line.

`lfbench export outputs` writes a model's generations in the `outputs` form.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark, Context, Question, SystemAnswer
from pipeline.core.config import OutputsModel, PythonModel
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import iter_lines
from pipeline.core.records import Generation
from pipeline.core.types import UsageReport
from pipeline.stages.common import entry_sha, no_usage
from pipeline.stages.memo import Memo, memo_key
from pipeline.stages.plugins import SYSTEMS_DIR, load_entry_point

log = logging.getLogger(__name__)


class BadAnswer(ValueError):
    """A system's answer is not an answer (what is wrong, in words)."""


def _ids(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise BadAnswer(f"{what} is {type(value).__name__}, not a list of document ids")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise BadAnswer(f"{what} holds {v!r}, not a document id (a string or a number)")
        out.append(str(v))
    return tuple(out)


def as_answer(got: Any) -> SystemAnswer:
    """A system's return value as an answer: a string, or a mapping (or object) with `answer`
    and optionally `passages` and `citations`."""
    if isinstance(got, str):
        return SystemAnswer(got)
    if isinstance(got, SystemAnswer):
        return got
    fields = got if isinstance(got, Mapping) else vars(got) if hasattr(got, "__dict__") else None
    if fields is None or "answer" not in fields:
        raise BadAnswer(
            f"returned {type(got).__name__}; return the answer text, or a mapping with"
            " 'answer' (and optionally 'passages', 'citations')"
        )
    unknown = sorted(set(fields) - {"answer", "passages", "citations", "item_id"})
    if isinstance(got, Mapping) and unknown:
        raise BadAnswer(f"unknown field(s) {unknown}: an answer has answer, passages, citations")
    text = fields["answer"]
    if not isinstance(text, str):
        raise BadAnswer(f"'answer' is {type(text).__name__}, not text")
    passages = fields.get("passages")
    citations = fields.get("citations")
    cited = None
    if citations is not None:
        if not isinstance(citations, list | tuple):
            raise BadAnswer("'citations' is not a list (one list of document ids per bullet)")
        cited = tuple(_ids(c, f"citations[{n}]") for n, c in enumerate(citations))
    return SystemAnswer(text, None if passages is None else _ids(passages, "'passages'"), cited)


def answer_json(a: SystemAnswer) -> str:
    return json.dumps(
        {
            "answer": a.answer,
            "passages": None if a.passages is None else list(a.passages),
            "citations": None if a.citations is None else [list(c) for c in a.citations],
        },
        ensure_ascii=False,
    )


def error_generation(
    bench: str, question: Question, model: str, system: str, setting: str, error: str
) -> Generation:
    return Generation(
        benchmark=bench, item_id=question.id, model=model, system=system, setting=setting,
        status="error", error=error,
    )  # fmt: skip


def _generation(
    bench: AnyBenchmark,
    ctx: Context[Any],
    model: str,
    system: str,
    q: Question,
    a: SystemAnswer,
) -> Generation:
    assert bench.systems is not None
    g = bench.systems.generation(ctx, model, system, q, a)
    extra: dict[str, Any] = {}
    if a.passages is not None:
        extra["passages"] = list(a.passages)
    return g.model_copy(update={"meta": {**g.meta, **extra}}) if extra else g


def python_generations(
    bench: AnyBenchmark,
    ctx: Context[Any],
    model: str,
    spec: PythonModel,
    questions: Sequence[Question],
    root: Path,
    stage: str,
) -> tuple[list[Generation], UsageReport, str]:
    """Ask the user's system every question (journaled); the outputs, the usage (items and
    time), and the code's digest."""
    assert bench.systems is not None
    system = spec.system or model
    setting = bench.systems.setting(model, system)
    where = f"models.{model} ({spec.entry})"
    ep = load_entry_point(spec.entry, root, SYSTEMS_DIR, where)
    t0 = time.monotonic()
    entry = entry_sha(spec, bench.name)

    def key(q: Question) -> str:
        docs = [[p.id, p.text] for p in q.documents]
        return memo_key("system", ep.code_sha, entry, q.id, q.question, q.task, docs)

    answers: dict[int, SystemAnswer | str] = {}
    keys = [key(q) for q in questions]
    lock = threading.Lock()
    with Memo(root, stage) as memo:
        done = memo.get_many(keys)
        for n, k in enumerate(keys):
            if k in done:
                answers[n] = as_answer(json.loads(done[k]))
        todo = [n for n in range(len(questions)) if n not in answers]

        def ask(n: int) -> None:
            q = questions[n]
            try:
                got = as_answer(ep.func(q, **spec.options))
            except BadAnswer as e:
                result: SystemAnswer | str = f"{where}: {e}"
            except Exception as e:  # noqa: BLE001 - the user's code: an error of this item
                result = f"{where} raised {type(e).__name__}: {str(e)[:300]}"
            else:
                result = got
                with lock:
                    memo.put(keys[n], q.id, answer_json(got))
            with lock:
                answers[n] = result

        if spec.max_concurrency > 1 and len(todo) > 1:
            with ThreadPoolExecutor(spec.max_concurrency, "lfbench-system") as pool:
                list(pool.map(ask, todo))
        else:
            for n in todo:
                ask(n)
        hits, cache_hits = memo.journal_hits, memo.cache_hits
    gens = []
    for n, q in enumerate(questions):
        a = answers[n]
        if isinstance(a, str):
            gens.append(error_generation(bench.name, q, model, system, setting, a))
        else:
            gens.append(_generation(bench, ctx, model, system, q, a))
    failed = sum(1 for g in gens if g.status != "ok")
    report = no_usage(stage).model_copy(
        update={
            "items": len(gens),
            "ok": len(gens) - failed,
            "errors": failed,
            "journal_hits": hits,
            "cache_hits": cache_hits,
            "wall_s": round(time.monotonic() - t0, 3),
        }
    )
    log.info(
        "%s: %s answered %d questions (%d from the journal, %d from the cache), %d failed, %.1f s",
        stage,
        spec.entry,
        len(todo),
        hits,
        cache_hits,
        failed,
        report.wall_s,
    )
    return gens, report, ep.code_sha


def read_outputs(path: Path, shown: str, questions: Sequence[Question]) -> dict[str, SystemAnswer]:
    """The answers of an outputs file, checked against the questions (see the module doc)."""
    if not path.is_file():
        raise DataError("outputs file not found", file=shown)
    wanted = {q.id for q in questions}
    seen: dict[str, str] = {}
    out: dict[str, SystemAnswer] = {}
    for lineno, line in iter_lines(path, shown):
        if not line.strip():
            continue
        where = f"{shown}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"not valid JSON ({e.msg})", file=where) from e
        if not isinstance(row, dict):
            raise DataError("a line is a JSON object", file=where)
        item = row.get("item_id")
        if not isinstance(item, str):
            raise DataError("no item_id (a string)", file=where, field="item_id")
        if item not in wanted:
            example = next(iter(sorted(wanted)), "-")
            raise DataError(
                f"unknown item id {item!r}: not an item this model runs (e.g. {example};"
                " `lfbench export questions` lists them)",
                file=where,
                field="item_id",
            )
        if item in seen:
            raise DataError(f"item {item!r} is answered twice (first at {seen[item]})", file=where)
        seen[item] = where
        try:
            out[item] = as_answer(row)
        except BadAnswer as e:
            raise DataError(str(e), file=where, item=item) from e
    missing = [q.id for q in questions if q.id not in out]
    if missing:
        raise DataError(
            f"{len(missing)} of the {len(questions)} items have no answer (first: {missing[0]});"
            " answer every item, or cut the model's slice (models.<name>.slice)",
            file=shown,
        )
    return out


def outputs_generations(
    bench: AnyBenchmark,
    ctx: Context[Any],
    model: str,
    spec: OutputsModel,
    questions: Sequence[Question],
    root: Path,
) -> list[Generation]:
    shown = spec.files[bench.name]
    answers = read_outputs(root / shown, shown, questions)
    system = spec.system or model
    return [_generation(bench, ctx, model, system, q, answers[q.id]) for q in questions]


def system_generations(
    bench: AnyBenchmark,
    ctx: Context[Any],
    model: str,
    spec: PythonModel | OutputsModel,
    dataset: Sequence[Any],
    root: Path,
    stage: str,
) -> tuple[list[Generation], UsageReport, dict[str, str]]:
    """The outputs of a whole RAG system, its usage, and its lineage (code or file digest)."""
    from pipeline.stages.plugins import file_sha

    if bench.systems is None:
        raise ConfigError(f"models.{model}: {bench.name} cannot run a whole RAG system")
    questions = bench.systems.questions(ctx, dataset)
    if isinstance(spec, PythonModel):
        gens, report, code = python_generations(bench, ctx, model, spec, questions, root, stage)
        return gens, report, {"entry_point": spec.entry, "code_sha": code}
    gens = outputs_generations(bench, ctx, model, spec, questions, root)
    shown = spec.files[bench.name]
    report = no_usage(stage).model_copy(update={"items": len(gens), "ok": len(gens)})
    return gens, report, {"file": shown, "file_sha": file_sha(root / shown)}


def export_outputs(gens: Sequence[Generation]) -> list[dict[str, Any]]:
    """A model's generations in the `outputs` form (ok ones; the first sample of each item)."""
    out = []
    seen = set()
    for g in gens:
        if g.status != "ok" or g.item_id in seen:
            continue
        seen.add(g.item_id)
        row: dict[str, Any] = {"item_id": g.item_id, "answer": g.text}
        passages = g.meta.get("passages")
        if passages is None and "context_docs" in g.meta:
            passages = [str(p) for p in g.meta["context_docs"]]
        if passages is not None:
            row["passages"] = [str(p) for p in passages]
        out.append(row)
    return out
