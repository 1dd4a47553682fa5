"""Stage `<benchmark>-judge@<model>-<judge>`: outputs -> one judgement per output by one judge.

- an LLM judge (`openai`): the benchmark's judge tasks through the one judge loop (first pass,
  one repair, invalid verdicts recorded with the raw answer and counted, never scored);
- a coverage judge: the local judge (its trained model file) or a no-model judge the benchmark
  defines, on the benchmark's view of each output (`coverage_case`);
- a replayed release (`published`): the benchmark's `released` judgements, for released outputs
  only;
- a no-model judge the benchmark defines that is not a coverage judge (e.g. CRUX's `labels`):
  the benchmark's `no_model_judge`.

The kind of judge is resolved once (`pipeline.core.judging.judge_kind`), from what the benchmark
declares.

Outputs whose generation failed are not judged (the aggregate counts them). A pair the judge
does not judge, by design or by choice (`not_judged`: a replayed judge of a new model; an LLM
judge of a model its entry's `models` leaves out, by default every model without calls), costs
nothing: the stage writes no judgements and the aggregate lists the pair under `not_judged`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark, Context, CoverageJudge, llm_capability
from pipeline.core.config import JudgeSpec, LocalJudge, OpenAIJudge, Params
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.extensions import ReleasedJudgements
from pipeline.core.io import read_jsonl, write_jsonl
from pipeline.core.judging import judge_kind
from pipeline.core.records import Generation, Judgement, Usage, Verdict
from pipeline.core.types import EndpointConfig, UsageReport
from pipeline.llm.client import cost_usd, resolve_api_key, write_usage
from pipeline.stages.common import (
    context,
    entry_sha,
    finish_llm_stage,
    judge_stage,
    llm_paths,
    no_usage,
    not_judged,
    read_dataset,
    usage_path,
)
from pipeline.stages.timing import Throughput, throughput, write_throughput

log = logging.getLogger(__name__)


def llm_judgements(
    bench: AnyBenchmark,
    ctx: Context[Any],
    judge: str,
    spec: OpenAIJudge,
    items: Mapping[str, Any],
    gens: Sequence[Generation],
    stage: str,
    root: Path,
) -> tuple[list[Judgement], UsageReport]:
    """An LLM judge's judgements of `gens` (ok generations of known items)."""
    from pipeline.llm_judge.loop import ask_all

    endpoint = spec.endpoint()
    resolve_api_key(endpoint, f"judges.{judge}")
    tasks = llm_capability(bench).tasks(ctx, spec, items, gens)
    asks = [a for t in tasks for a in t.asks]
    cache, journal = llm_paths(root, stage)
    answers, report = ask_all(
        endpoint, asks, repair=spec.repair, cache_path=cache, journal_path=journal, label=stage
    )
    out, k = [], 0
    for task in tasks:
        mine = answers[k : k + len(task.asks)]
        k += len(task.asks)
        errors = [e for a in mine for e in a.errors]
        verdicts: list[Verdict] = []
        for target in task.targets:
            value = next((a.values[target] for a in mine if target in a.values), None)
            if isinstance(value, Verdict):
                verdicts.append(value)
                continue
            problem = next((a.invalid[target] for a in mine if target in a.invalid), "no verdict")
            verdicts.append(
                Verdict(target_id=target, label="INVALID", link=None, status="invalid", raw=problem)
            )
        tin = sum(a.input_tokens for a in mine)
        tout = sum(a.output_tokens for a in mine)
        status = (
            "error"
            if errors
            else "invalid"
            if any(v.status == "invalid" for v in verdicts)
            else "ok"
        )
        out.append(
            Judgement.of(
                bench.name,
                task.generation,
                judge,
                task.prompt_sha,
                status,
                [] if errors else verdicts,
                error="; ".join(errors[:3]) if errors else None,
                usage=Usage(
                    input_tokens=tin,
                    output_tokens=tout,
                    requests=sum(a.calls for a in mine),
                    cost_usd=round(cost_usd(spec, tin, tout), 8),
                ),
            )
        )
    return out, report


def coverage_judge(bench: AnyBenchmark, judge: str, spec: JudgeSpec, root: Path) -> CoverageJudge:
    """The local judge (its trained model) or the benchmark's own coverage judge."""
    if isinstance(spec, LocalJudge):  # the local judge's model file, else the benchmark's own
        from pipeline.local_judge.embeddings import default_cache_path
        from pipeline.local_judge.model import LocalJudge as Model

        cache = default_cache_path(root) if spec.embedding_cache else None
        return Model.load(root / spec.model_path, cache=cache)
    own = bench.coverage.judge(spec) if bench.coverage is not None else None
    if own is None:
        raise ConfigError(f"judges.{judge}: provider {spec.provider!r} cannot judge {bench.name}")
    return own


def coverage_judgements(
    bench: AnyBenchmark,
    ctx: Context[Any],
    judge: str,
    cj: CoverageJudge,
    items: Mapping[str, Any],
    gens: Sequence[Generation],
) -> list[Judgement]:
    """A coverage judge's judgements of `gens` (ok generations of known items). A case that
    several outputs share (the same units against the same bullets) is judged once."""
    cover = bench.coverage
    if cover is None:
        raise ConfigError(
            f"judges.{judge}: {bench.name} has no coverage judging (no local judge for it; use"
            " an openai judge or one of its own)"
        )
    per_gen = [cover.cases(ctx, items[g.item_id], g) for g in gens]
    cases = [c for cs in per_gen for c in cs]
    texts = [(tuple(t for _, t in c.targets), tuple(c.bullets)) for c in cases]
    unique = list(dict.fromkeys(texts))
    answered = cj.judge_many(unique)
    if len(answered) != len(unique):
        raise ValueError(f"judge {judge} answered {len(answered)} cases for {len(unique)}")
    by_case = dict(zip(unique, answered, strict=True))
    verdicts = [by_case[t] for t in texts]
    out, k = [], 0
    for g, cs in zip(gens, per_gen, strict=True):
        row = []
        for case, vs in zip(cs, verdicts[k : k + len(cs)], strict=True):
            if len(vs) != len(case.targets):
                n = len(case.targets)
                raise ValueError(f"judge {judge} gave {len(vs)} verdicts for {n} units")
            row += [cover.verdict(t, v) for (t, _), v in zip(case.targets, vs, strict=True)]
        k += len(cs)
        status = "invalid" if any(v.status == "invalid" for v in row) else "ok"
        out.append(Judgement.of(bench.name, g, judge, cj.sha, status, row))
    embedder = getattr(cj, "embedder", None)
    if embedder is not None:
        log.info(
            "judge %s (%s): %d outputs, %d texts embedded, %d read from the cache",
            judge,
            cj.sha[:12],
            len(gens),
            embedder.computed,
            embedder.cache_hits,
        )
        embedder.close()
    return out


def judgeable(items: Mapping[str, Any], gens: Sequence[Generation], where: str) -> list[Generation]:
    """The generations to judge: the ok ones, each of an item of the dataset."""
    out = []
    for g in gens:
        if g.status != "ok":
            continue  # nothing to judge; the aggregate counts it as a failed generation
        if g.item_id not in items:
            raise DataError(
                "generation of an item that is not in the dataset",
                file=where,
                item=g.generation_id,
                field="item_id",
            )
        out.append(g)
    return out


class Embedder:
    """The `embed` of a no-model judge's context: the local MiniLM, or an OpenAI-compatible
    endpoint (journaled per stage: a kill loses no finished vector, a re-run sends no text
    twice); its usage becomes the stage's."""

    def __init__(self, choice: str | EndpointConfig | None, stage: str, root: Path) -> None:
        self.choice = choice
        self.stage = stage
        self.journal = llm_paths(root, stage)[1].with_suffix(".embeddings.jsonl")
        self.report: UsageReport | None = None

    @property
    def wanted(self) -> bool:
        return self.choice is not None

    def __call__(self, texts: Sequence[str]) -> Any:
        from pipeline.llm.embeddings import embed_local, embed_remote

        if not isinstance(self.choice, EndpointConfig):
            return embed_local(texts)
        vectors, report = embed_remote(self.choice, texts, self.journal, label=self.stage)
        self.report = report if self.report is None else self.report.merged(report)
        return vectors


def judge(
    bench: AnyBenchmark,
    params: Params,
    model: str,
    judge_name: str,
    dataset_path: Path,
    generations_path: Path,
    data_dir: Path,
    out: Path,
    root: Path,
) -> int:
    stage = judge_stage(bench.name, model, judge_name)
    gens = read_jsonl(generations_path, Generation)
    spec = params.judges[judge_name]
    why = not_judged(params, model, judge_name)
    if why is not None:
        log.info("%s: not judged, by choice (%s): nothing sent, no judgements written", stage, why)
        write_jsonl(out, [])
        write_usage(usage_path(out), no_usage(stage))
        return 0
    ctx = context(bench, params, root, data_dir)
    dataset = read_dataset(bench, dataset_path)
    report: UsageReport
    speed: Throughput | None = None  # how fast it judged: run state (.lfbench/timing)
    kind = judge_kind(bench, judge_name, spec)
    if kind == "released":
        released: ReleasedJudgements[Any, Any] | None = ReleasedJudgements.of(bench)
        assert released is not None  # judge_kind says so
        js = released.judgements(ctx, judge_name, spec, dataset, gens)
        report = no_usage(stage)
    else:
        items = bench.items(dataset)
        todo = judgeable(items, gens, str(generations_path))
        if kind == "llm":
            assert isinstance(spec, OpenAIJudge)
            started = time.perf_counter()
            js, report = llm_judgements(bench, ctx, judge_name, spec, items, todo, stage, root)
            reused = report.cache_hits + report.journal_hits
            speed = throughput(
                judge_name,
                stage,
                sum(len(j.verdicts) for j in js),
                time.perf_counter() - started,
                f"this run's judge calls on {len(todo)} outputs, repairs included; {reused} of"
                f" {report.items} answers came from the cache or journal",
            )
        elif kind == "no_model":
            # a judge the benchmark defines that needs no model (e.g. CRUX's labels), or only
            # embeddings (e.g. CRUD-RAG's text metrics with an embedding similarity)
            own = bench.no_model_judge
            assert own is not None  # judge_kind says so
            embedder = Embedder(own.embedding(spec), stage, root)
            if embedder.wanted:
                ctx = replace(ctx, embed=embedder)
            js = own.judgements(ctx, judge_name, spec, items, todo)
            report = no_usage(stage).model_copy(update={"items": len(js), "ok": len(js)})
            if embedder.report is not None:
                report = embedder.report.model_copy(update={"items": len(js), "ok": len(js)})
        else:
            started = time.perf_counter()
            cj = coverage_judge(bench, judge_name, spec, root)
            js = coverage_judgements(bench, ctx, judge_name, cj, items, todo)
            # The usage file is a DVC output: a stage that calls no model records its counts
            # only, so a re-run anywhere writes the same bytes; its time is in the log.
            report = no_usage(stage).model_copy(update={"items": len(js), "ok": len(js)})
            wall = time.perf_counter() - started
            log.info("%s: %d judgements in %.1f s", stage, len(js), wall)
            speed = throughput(
                judge_name,
                stage,
                sum(len(j.verdicts) for j in js),
                wall,
                f"loading the judge and judging {len(todo)} outputs in this run (embeddings"
                " read from the cache where it holds them)",
            )
    write_jsonl(out, js)
    write_usage(usage_path(out), report, entry_sha(spec, bench.name))
    if speed is not None:
        write_throughput(root, stage, [speed])
    n_invalid = sum(1 for j in js for v in j.verdicts if v.status == "invalid")
    log.info("wrote %s: %d judgements, %d invalid verdicts", out, len(js), n_invalid)
    if n_invalid:
        log.warning(
            "%s: %d verdicts were unusable after a repair attempt; they are counted as invalid"
            " and left out of the scores",
            stage,
            n_invalid,
        )
    finish_llm_stage(stage, root, report, [j for j in js if j.status == "error"])
    # the outputs are written: the embedding journal has served its purpose
    Embedder(None, stage, root).journal.unlink(missing_ok=True)
    return len(js)
