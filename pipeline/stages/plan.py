"""`lfbench plan`: what a `dvc repro` would send, before it sends anything.

For each stage DVC reports changed (`dvc status`, through the `dvc.repo.Repo` API), the requests
are built exactly as the stage builds them (the benchmark's `plan_generations` and its LLM
judge's `tasks`, the agreement stage's labelled outputs), their cache keys looked up in the
response cache and the stage's journal (never sent), and counted:

- requests: distinct requests the stage would send (cache and journal hits left out);
- prompt tokens: the built prompts in cl100k_base tokens (`pipeline.retrieval.tokens`), message
  contents only (a server adds a few tokens of chat template per message);
- completion tokens: an upper bound (each request's max_tokens), and an estimate where an earlier
  run of the same stage recorded its mean answer length (its usage file);
- dollars from the entry's prices (upper bound, and estimate), and a time: at least what the
  entry's rate limits allow, or the measured request rate of an earlier run of the stage (its
  usage file; for a run stopped before its end, the progress file the model client wrote:
  requests answered over the time it sent), or the seconds per request given for the model or
  judge entry (`rates`, `lfbench plan --rate NAME=SECONDS` or `--probe`), else for every entry
  (`seconds_per_request`), at the entry's concurrency.

A judge stage whose generations do not exist yet (or will be remade) judges the answers the
response cache already holds for them, and stand-ins for the others: one per planned generation,
empty, each its own request (never merged with another's, never a cache hit), so the number of
requests is exact; such a stage is *estimated*: each stand-in's prompt is counted as the empty
one plus the output's length (the mean answer of an earlier run of the generation, else its
max_tokens: an upper bound). Repair requests (one per unusable answer) and retries cannot be
known in advance and are not counted. Stages that call no model show 0 requests.

`dvc repro --dry` cannot serve here: DVC looks each changed stage up in its run cache, which
hashes every dependency, and fails on one another stage has yet to make (treeverse/dvc#9818,
open); `dvc_dry_run` (`lfbench plan --dry`) is that dry run with the lookup skipped for such a
stage.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.core.benchmark import AnyBenchmark, Context, llm_capability
from pipeline.core.config import (
    EmbeddingsRetriever,
    OpenAIJudge,
    OpenAIModel,
    OutputsModel,
    Params,
    PythonModel,
    PythonRetriever,
    RerankRetriever,
)
from pipeline.core.errors import DataError, LfbenchError
from pipeline.core.io import read_json, read_jsonl
from pipeline.core.judging import judge_kind
from pipeline.core.records import Generation
from pipeline.core.types import ChatRequest, EndpointConfig
from pipeline.llm.client import cache_key, effective_max_tokens, read_wall
from pipeline.stages.common import (
    agreement_stage,
    context,
    generate_stage,
    judge_stage,
    llm_paths,
    not_judged,
    rankings_reader,
    read_dataset,
    retrieval_path,
    retrieve_stage,
    usage_path,
)
from pipeline.stages.generate import model_dataset

# a whole RAG system's answer, for planning its judging before it ran (about 300 words)
SYSTEM_ANSWER_TOKENS = 400
# requests `lfbench plan --probe` sends per model or judge entry
PROBE_REQUESTS = 3

# ---------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class Measured:
    """What an earlier run of a stage recorded (its usage file): requests sent, answer tokens
    and wall time."""

    requests: int
    output_tokens: int
    wall_s: float

    @property
    def mean_output(self) -> float | None:
        return self.output_tokens / self.requests if self.requests else None

    @property
    def rate(self) -> float | None:
        """Requests per second."""
        return self.requests / self.wall_s if self.requests and self.wall_s > 0 else None


def cost(endpoint: EndpointConfig, prompt_tokens: float, completion_tokens: float) -> float:
    return (
        prompt_tokens * endpoint.price_input_per_1m
        + completion_tokens * endpoint.price_output_per_1m
    ) / 1e6


def duration(
    endpoint: EndpointConfig,
    requests: int,
    tokens: float,
    *,
    measured_rate: float | None = None,
    seconds_per_request: float | None = None,
) -> tuple[float | None, str]:
    """Seconds to send `requests` requests of `tokens` tokens in all, and how it was found.

    The rate limits give a floor, as the client's limiter schedules them: (n - 1) * 60 / rpm,
    and tokens * 60 / tpm. The pace: the measured rate of an earlier run, else
    `seconds_per_request` per request with max_concurrency requests at a time. The larger wins.
    None when there is no limit and no pace to go by."""
    if requests == 0:
        return 0.0, "nothing to send"
    floors: list[tuple[float, str]] = []
    if endpoint.requests_per_minute:
        floors.append(((requests - 1) * 60.0 / endpoint.requests_per_minute, "requests_per_minute"))
    if endpoint.tokens_per_minute:
        floors.append((tokens * 60.0 / endpoint.tokens_per_minute, "tokens_per_minute"))
    if measured_rate:
        floors.append((requests / measured_rate, "measured rate of an earlier run"))
    elif seconds_per_request is not None:
        waves = math.ceil(requests / endpoint.max_concurrency)
        floors.append(
            (
                waves * seconds_per_request,
                f"{seconds_per_request:g} s/request at concurrency {endpoint.max_concurrency}",
            )
        )
    if not floors:
        return None, (
            "unknown: no rate limit, no measured rate (give --rate NAME=SECONDS, --probe or"
            " --seconds-per-request)"
        )
    secs, basis = max(floors)
    return secs, basis


# ---------------------------------------------------------------- a stage's plan


@dataclass
class StagePlan:
    stage: str
    kind: str  # retrieve | generate | judge | agreement | other
    benchmark: str | None = None
    model: str | None = None
    judge: str | None = None
    provider: str = "none"
    built: int = 0  # requests built (distinct cache keys)
    cache_hits: int = 0  # of those, answered by the response cache or the stage's journal
    requests: int = 0  # to send
    prompt_tokens: int = 0
    completion_tokens_max: int = 0
    completion_tokens_est: int | None = None
    cost_usd_max: float | None = 0.0  # None: unknown (the entry sets no prices)
    cost_usd_est: float | None = None
    time_s: float | None = 0.0
    time_basis: str = "no model"
    estimated: bool = False
    # requests whose prompt and max_tokens exceed the entry's context_window (none declared: 0)
    over_context: int = 0
    notes: list[str] = field(default_factory=list)
    # the first requests it would send, with their endpoint: what `lfbench plan --probe` sends
    probe: tuple[EndpointConfig, list[ChatRequest]] | None = field(default=None, repr=False)

    def row(self) -> dict[str, Any]:
        out = asdict(replace(self, probe=None))
        out.pop("probe")
        return out


@dataclass(frozen=True)
class Built:
    """A request built as its stage builds it."""

    request: ChatRequest
    extra_tokens: int = 0  # a stand-in output's estimated length, added to its prompt
    # the stand-in output it judges (its text unknown: never a cache hit, never one request
    # with another's)
    standin: str | None = None


def message_tokens(request: ChatRequest) -> int:
    from pipeline.retrieval.tokens import count_tokens_batch

    return sum(count_tokens_batch([m.get("content", "") for m in request.messages]))


PRICES = ("price_input_per_1m", "price_output_per_1m")


def unpriced(spec: EndpointConfig) -> list[str]:
    """The prices a model or judge entry does not set: its cost is unknown, not $0 (a free
    local model says so with 0)."""
    return [p for p in PRICES if p not in spec.model_fields_set]


def fill(
    plan: StagePlan,
    endpoint: EndpointConfig,
    built: Sequence[Built],
    root: Path,
    stage: str,
    measured: Measured | None,
    seconds_per_request: float | None,
    unpriced: Sequence[str] = (),
) -> StagePlan:
    """Count the requests of a stage: distinct cache keys, less the hits; tokens, cost (None
    when the entry leaves out a price, `unpriced`), time."""
    by_key: dict[str, Built] = {}
    for b in built:
        key = cache_key(endpoint, b.request)
        by_key.setdefault(key if b.standin is None else f"{b.standin}#{key}", b)
    real = [k for k, b in by_key.items() if b.standin is None]
    hits = cached_answers(root, stage, real)
    todo = [b for k, b in by_key.items() if k not in hits]
    plan.built, plan.cache_hits, plan.requests = len(by_key), len(hits), len(todo)
    real_todo = [b.request for b in todo if b.standin is None]
    plan.probe = (endpoint, real_todo[:PROBE_REQUESTS]) if real_todo else None
    sizes = [message_tokens(b.request) + b.extra_tokens for b in todo]
    plan.prompt_tokens = sum(sizes)
    over = over_window(endpoint, [(b.request, n) for b, n in zip(todo, sizes, strict=True)])
    plan.over_context = len(over)
    if over:
        plan.notes.append(window_note(endpoint, over, len(todo)))
    plan.completion_tokens_max = sum(effective_max_tokens(endpoint, b.request) for b in todo)
    mean = measured.mean_output if measured and measured.output_tokens else None
    plan.completion_tokens_est = None if mean is None else round(mean * len(todo))
    if unpriced and plan.requests:
        plan.cost_usd_max = None
        who = f"judges.{plan.judge}" if plan.kind != "generate" else f"models.{plan.model}"
        plan.notes.append(
            f"cost unknown: {who} sets no {' / '.join(unpriced)} (USD per 1M tokens;"
            " 0 for a free local model)"
        )
    else:
        plan.cost_usd_max = cost(endpoint, plan.prompt_tokens, plan.completion_tokens_max)
        if plan.completion_tokens_est is not None:
            plan.cost_usd_est = cost(endpoint, plan.prompt_tokens, plan.completion_tokens_est)
    completion = (
        plan.completion_tokens_est
        if plan.completion_tokens_est is not None
        else plan.completion_tokens_max
    )
    plan.time_s, plan.time_basis = duration(
        endpoint,
        plan.requests,
        plan.prompt_tokens + completion,
        measured_rate=measured.rate if measured else None,
        seconds_per_request=seconds_per_request,
    )
    return plan


def over_window(
    endpoint: EndpointConfig, sized: Sequence[tuple[ChatRequest, int]]
) -> list[tuple[str, int]]:
    """(request key, prompt + answer tokens) of the requests that do not fit the endpoint's
    declared `context_window`: the prompt (cl100k_base) and the answer's budget (max_tokens)
    together exceed it. None declared: none."""
    window = endpoint.context_window
    if window is None:
        return []
    out = []
    for request, prompt in sized:
        need = prompt + effective_max_tokens(endpoint, request)
        if need > window:
            out.append((request.key, need))
    return out


def window_note(endpoint: EndpointConfig, over: Sequence[tuple[str, int]], of: int) -> str:
    """The plan's (and check's) line about the prompts that will not fit."""
    largest = max(n for _, n in over)
    shown = ", ".join(k for k, _ in over[:3]) + (", ..." if len(over) > 3 else "")
    return (
        f"{len(over)} of {of} requests will not fit the context window"
        f" ({endpoint.context_window:,} tokens; prompt in cl100k_base + max_tokens, up to"
        f" {largest:,}): {shown}. A server refuses them (HTTP 400) or, started with a larger"
        " context than the model was trained for, answers them with nonsense"
    )


def cached_answers(root: Path, stage: str, keys: Sequence[str]) -> dict[str, str]:
    """The answers (by cache key) the response cache or the stage's journal already holds:
    nothing is sent; a workspace without a cache file has none, and no file is made."""
    import os

    from pipeline.llm.cache import CACHE_URL_ENV, ResponseCache, backend_for
    from pipeline.llm.journal import load_journal

    cache_path, journal_path = llm_paths(root, stage)
    wanted = set(keys)
    found = {k: e.text for k, e in load_journal(journal_path).items() if k in wanted}
    if not os.environ.get(CACHE_URL_ENV, "").strip() and not cache_path.exists():
        return found
    backend = backend_for(cache_path)
    if backend is None:
        return found
    cache = ResponseCache(backend=backend)
    try:
        got = cache.get_many([k for k in keys if k not in found])
    finally:
        cache.close()
    return found | {k: a.text for k, a in got.items()}


def interrupted(root: Path, stage: str) -> Measured | None:
    """What the newest run of `stage` that answered anything wrote to its progress file
    (`.lfbench/progress/<run>/<stage>.json`, the model client's, run state): requests
    answered, over the time from its first batch to its last write. A run stopped before its
    end leaves no usage file, but this."""
    best: tuple[float, Measured] | None = None
    for path in (root / ".lfbench" / "progress").glob(f"*/{stage.replace('/', '_')}.json"):
        try:
            raw = read_json(path)
            mtime = path.stat().st_mtime
        except (OSError, ValueError, DataError):
            continue
        done, t0 = raw.get("done"), raw.get("t0") if isinstance(raw, dict) else None
        if not isinstance(done, int) or not isinstance(t0, int | float) or done <= 0:
            continue
        if mtime > t0 and (best is None or mtime > best[0]):
            best = (mtime, Measured(done, 0, mtime - t0))
    return best[1] if best else None


def measured(path: Path, root: Path | None = None, stage: str | None = None) -> Measured | None:
    """An earlier run's usage file of this stage, when it sent anything; else (`root` and
    `stage` given) what a stopped run of it measured (`interrupted`)."""
    if not path.exists():
        return interrupted(root, stage) if root is not None and stage is not None else None
    raw = read_json(path)
    sent = int(raw.get("requests_sent") or 0)
    if sent <= 0:
        return None
    wall = read_wall(path)  # run state: a stage run in this workspace (or an older usage file)
    if wall is None:
        wall = float(raw.get("wall_s") or 0.0)
    return Measured(sent, int(raw.get("output_tokens") or 0), wall)


# ---------------------------------------------------------------- the stages


def configured_llms(section: Any) -> list[str]:
    """The judges entries a benchmark section names as its `llm` (construction, synthesis, ...)."""
    found: list[str] = []
    if isinstance(section, dict):
        for key, value in section.items():
            if key == "llm" and isinstance(value, str):
                found.append(value)
            else:
                found += configured_llms(value)
    return found


@dataclass(frozen=True)
class StageCmd:
    """A dvc.yaml stage: its name and the options of its `lfbench run <kind>` command."""

    name: str
    kind: str
    options: dict[str, str]

    @classmethod
    def parse(cls, name: str, cmd: str) -> StageCmd:
        words = shlex.split(cmd)
        kind, options = "other", {}
        if len(words) >= 3 and words[0] == "lfbench" and words[1] in ("run", "stage"):
            kind = words[2]
            rest = words[3:]
            for i, w in enumerate(rest):
                if w.startswith("--"):
                    nxt = rest[i + 1] if i + 1 < len(rest) else ""
                    options[w[2:]] = "" if nxt.startswith("--") else nxt
        return cls(name, kind, options)


class Planner:
    """Plans the stages of one project: params, benchmarks and their datasets, read once."""

    def __init__(
        self,
        root: Path,
        params: Params,
        changed: Sequence[str],
        seconds_per_request: float | None,
        rates: Mapping[str, float] | None = None,
    ) -> None:
        self.root = root
        self.params = params
        self.changed = set(changed)
        self.seconds_per_request = seconds_per_request
        self.rates = dict(rates or {})  # a models/judges/retrievers entry -> s per request
        self._datasets: dict[str, list[Any]] = {}

    def spr(self, entry: str | None) -> float | None:
        """The seconds per request to assume for an entry: its own rate, else the default."""
        return self.rates.get(entry or "", self.seconds_per_request)

    def _bench(self, name: str) -> AnyBenchmark:
        from pipeline.core import registry

        return registry.get(name)

    def _path(self, p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else self.root / q

    def _dataset(self, bench: AnyBenchmark, path: str) -> list[Any]:
        if path not in self._datasets:
            full = self._path(path)
            if not full.exists():
                raise DataError(
                    f"the dataset is not built yet: run `dvc repro {bench.name}-construct` first"
                    " (the default construction calls no model), then plan",
                    file=path,
                )
            self._datasets[path] = read_dataset(bench, full)
        return self._datasets[path]

    def _ctx(self, bench: AnyBenchmark, data: str) -> Context[Any]:
        return context(bench, self.params, self.root, self._path(data) if data else "")

    def plan(self, cmd: StageCmd) -> StagePlan:
        o = cmd.options
        if cmd.kind == "generate":
            return self.generate(
                cmd.name, o["benchmark"], o["model"], o["dataset"], o.get("data", "")
            )
        if cmd.kind == "judge":
            return self.judge(cmd, o["benchmark"], o["model"], o["judge"])
        if cmd.kind == "retrieve":
            return self.retrieve(cmd)
        plan = StagePlan(cmd.name, "other", benchmark=o.get("benchmark"))
        llms = configured_llms(self.params.raw_section(o.get("benchmark", "")))
        if cmd.kind == "construct" and llms:
            plan.notes.append(f"not planned: construction through {', '.join(llms)}")
        return plan

    def _planned_generations(
        self,
        bench: AnyBenchmark,
        model: str,
        spec: OpenAIModel,
        dataset_path: str,
        data: str,
        plan: StagePlan | None = None,
    ) -> list[Any]:
        ctx = self._ctx(bench, data)
        full = self._dataset(bench, dataset_path)
        ctx = replace(ctx, rankings=self._rankings(bench, ctx, full, plan))
        dataset = model_dataset(bench, full, spec, model, dataset_path)
        return bench.plan_generations(ctx, model, spec, dataset)

    def _rankings(
        self, bench: AnyBenchmark, ctx: Context[Any], dataset: list[Any], plan: StagePlan | None
    ) -> Callable[[str], Mapping[str, Any]]:
        """Your retrievers' rankings for planning: their retrieval stages' outputs, or, for one
        not made yet (or about to be remade), a stand-in order of the same passages (the
        contexts then hold as many tokens; their requests are not cache hits: estimated)."""
        made = rankings_reader(self.root, bench.name)

        def read(name: str) -> Mapping[str, Any]:
            stage = retrieve_stage(bench.name, name)
            if stage not in self.changed and retrieval_path(self.root, bench.name, name).exists():
                return made(name)
            assert bench.retrieval is not None
            if plan is not None:
                plan.estimated = True
                note = (
                    f"estimated: {name}'s rankings are not made yet ({stage}): contexts built"
                    " from a stand-in order of the same passages"
                )
                if note not in plan.notes:
                    plan.notes.append(note)
            queries = bench.retrieval.queries(ctx, dataset, name)
            return {q.id: [(p.id, None) for p in q.passages] for q in queries}

        return read

    def retrieve(self, cmd: StageCmd) -> StagePlan:
        """A retrieval stage: the embedding texts or rerank requests the cache and journal do
        not hold, their tokens (cl100k_base, the texts sent), cost and time."""
        o = cmd.options
        name = o["retriever"]
        spec = self.params.retrievers[name]
        plan = StagePlan(cmd.name, "retrieve", o["benchmark"], name, provider=spec.provider)
        bench = self._bench(o["benchmark"])
        if bench.retrieval is None:
            return plan
        if isinstance(spec, PythonRetriever):
            plan.notes.append(f"your code ({spec.entry}): its calls and cost are not planned")
            return plan
        if not isinstance(spec, EmbeddingsRetriever | RerankRetriever):
            return plan
        from pipeline.llm.retrieval import embedding_key, rerank_key
        from pipeline.retrieval.tokens import count_tokens_batch

        ctx = self._ctx(bench, o.get("data", ""))
        queries = bench.retrieval.queries(ctx, self._dataset(bench, o["dataset"]), name)
        texts: dict[str, str] = {}  # cache key -> what is sent
        sizes: dict[str, int] = {}
        if isinstance(spec, EmbeddingsRetriever):
            from pipeline.retrieval.windows import cut

            passages = list(dict.fromkeys(p.text for q in queries for p in q.passages))
            windows = cut(passages, spec.window_tokens, spec.tokenizer, str(self.root))
            for t in [spec.query_prefix + q.text for q in queries] + [
                spec.passage_prefix + w for ws in windows for w in ws
            ]:
                texts.setdefault(embedding_key(spec.model, t, spec.dimensions), t)
        else:
            from pipeline.stages.retrieve import base_ranking

            for q in queries:
                by_id = {p.id: p.text for p in q.passages}
                docs = [by_id[p][: spec.max_chars] for p in base_ranking(spec.over, q)]
                docs = docs[: spec.top_k]
                key = rerank_key(spec.model, q.text, docs, len(docs))
                texts[key] = q.text
                sizes[key] = len(docs)
        hits = cached_answers(self.root, cmd.name, list(texts))
        todo = [k for k in texts if k not in hits]
        plan.built, plan.cache_hits = len(texts), len(hits)
        counts = dict(zip(todo, count_tokens_batch([texts[k] for k in todo]), strict=True))
        if isinstance(spec, EmbeddingsRetriever):
            plan.requests = math.ceil(len(todo) / spec.batch_size)
            plan.prompt_tokens = sum(counts.values())
            plan.notes.append(
                f"{len(todo)} of {len(texts)} texts to embed, {spec.batch_size} per request"
            )
        else:
            plan.requests = len(todo)
            # a reranker reads the query beside each document
            plan.prompt_tokens = sum(counts[k] * sizes[k] for k in todo)
            plan.notes.append("rerank tokens: the query counted once per document, documents not")
        endpoint = spec.endpoint()
        price = plan.prompt_tokens * spec.price_input_per_1m / 1e6
        if isinstance(spec, RerankRetriever):
            price += plan.requests * spec.price_per_1k_requests / 1000
        plan.cost_usd_max = round(price, 8)
        plan.time_s, plan.time_basis = duration(
            endpoint,
            plan.requests,
            plan.prompt_tokens,
            measured_rate=None,
            seconds_per_request=self.spr(name),
        )
        return plan

    def generate(
        self, stage: str, benchmark: str, model: str, dataset_path: str, data: str
    ) -> StagePlan:
        spec = self.params.models[model]
        plan = StagePlan(stage, "generate", benchmark, model, provider=spec.provider)
        if isinstance(spec, PythonModel):
            plan.notes.append(f"your code ({spec.entry}): its calls and cost are not planned")
        if not isinstance(spec, OpenAIModel):
            return plan
        bench = self._bench(benchmark)
        planned = self._planned_generations(bench, model, spec, dataset_path, data, plan)
        out = self._path(f"generations/{benchmark}/{model}.jsonl")
        fitted = fitted_note(spec, planned)
        if fitted:
            plan.notes.append(fitted)
        return fill(
            plan,
            spec.endpoint(),
            [Built(p.request) for p in planned],
            self.root,
            generate_stage(benchmark, model),
            measured(usage_path(out), self.root, stage),
            self.spr(model),
            unpriced(spec),
        )

    def _generations(
        self, cmd: StageCmd, plan: StagePlan
    ) -> tuple[list[Generation], dict[str, int]]:
        """The outputs a judge stage will judge, and the estimated tokens of each stand-in (by
        generation id): the file when it exists and its generate stage is not about to remake
        it; else, for an LLM, the answers the response cache already holds and stand-ins for the
        others (one per planned request); a no-model provider's outputs are made here, as its
        stage makes them."""
        o = cmd.options
        benchmark, model = o["benchmark"], o["model"]
        path = self._path(o["generations"])
        remade = generate_stage(benchmark, model) in self.changed
        if path.exists() and not remade:
            return read_jsonl(path, Generation), {}
        bench = self._bench(benchmark)
        spec = self.params.models[model]
        if isinstance(spec, PythonModel | OutputsModel):
            return self._system_standins(bench, model, spec, o, plan)
        if not isinstance(spec, OpenAIModel):
            ctx = self._ctx(bench, o.get("data", ""))
            dataset = self._dataset(bench, o["dataset"])
            ctx = replace(ctx, rankings=self._rankings(bench, ctx, dataset, plan))
            gens = bench.offline_generations(ctx, model, spec, dataset)
            plan.notes.append(f"{model}'s outputs made here (no model call)")
            return gens, {}
        planned = self._planned_generations(bench, model, spec, o["dataset"], o.get("data", ""))
        endpoint = spec.endpoint()
        keys = [cache_key(endpoint, p.request) for p in planned]
        cached = cached_answers(self.root, generate_stage(benchmark, model), keys)
        m = measured(usage_path(path))
        length = round(m.mean_output) if m and m.mean_output is not None else spec.max_tokens
        gens, extra = [], {}
        for p, k in zip(planned, keys, strict=True):
            text = cached.get(k)
            g = Generation(
                benchmark=bench.name,
                item_id=p.item_id,
                model=model,
                system=p.system,
                setting=p.setting,
                sample=p.sample,
                # an empty cached answer is a failed generation: not judged
                status="ok" if text is None or text.strip() else "error",
                text=text or "",
                meta=dict(p.meta),
            )
            if text is None:
                extra[g.generation_id] = length
            gens.append(g)
        if extra:
            plan.estimated = True
            plan.notes.append(
                f"estimated: {len(extra)} of {model}'s {len(gens)} outputs do not exist yet; each"
                f" counted as {length} tokens"
                + (" (its mean in an earlier run)" if m else " (its max_tokens: an upper bound)")
            )
        return gens, extra

    def _system_standins(
        self,
        bench: AnyBenchmark,
        model: str,
        spec: PythonModel | OutputsModel,
        o: Mapping[str, str],
        plan: StagePlan,
    ) -> tuple[list[Generation], dict[str, int]]:
        """A whole RAG system's outputs: an outputs file's are read (no call); a python
        system's are stand-ins, one per question, of SYSTEM_ANSWER_TOKENS each (estimated)."""
        from pipeline.stages.systems import error_generation, outputs_generations

        if bench.systems is None:
            return [], {}
        ctx = self._ctx(bench, o.get("data", ""))
        dataset = model_dataset(bench, self._dataset(bench, o["dataset"]), spec, model, "")
        questions = bench.systems.questions(ctx, dataset)
        if isinstance(spec, OutputsModel):
            plan.notes.append(f"{model}'s answers read from {spec.files[bench.name]}")
            return outputs_generations(bench, ctx, model, spec, questions, self.root), {}
        system = spec.system or model
        setting = bench.systems.setting(model, system)
        gens = [
            error_generation(bench.name, q, model, system, setting, "").model_copy(
                update={"status": "ok", "text": "", "error": None}
            )
            for q in questions
        ]
        plan.estimated = True
        plan.notes.append(
            f"estimated: {model} is your code; each of its {len(gens)} answers counted as"
            f" {SYSTEM_ANSWER_TOKENS} tokens"
        )
        return gens, {g.generation_id: SYSTEM_ANSWER_TOKENS for g in gens}

    def judge(self, cmd: StageCmd, benchmark: str, model: str, judge: str) -> StagePlan:
        spec = self.params.judges[judge]
        plan = StagePlan(cmd.name, "judge", benchmark, model, judge, provider=spec.provider)
        bench = self._bench(benchmark)
        if judge_kind(bench, judge, spec) != "llm":
            return plan
        assert isinstance(spec, OpenAIJudge)  # judge_kind says so
        why = not_judged(self.params, model, judge)
        if why is not None:
            plan.notes.append(f"not judged, by choice: {why}")
            return plan
        gens, extra = self._generations(cmd, plan)
        ctx = self._ctx(bench, cmd.options.get("data", ""))
        items = bench.items(self._dataset(bench, cmd.options["dataset"]))
        todo = [g for g in gens if g.status == "ok" and g.item_id in items]
        built = self._judge_requests(bench, ctx, judge, spec, items, todo, extra)
        out = self._path(f"judgements/{benchmark}/{model}/{judge}.jsonl")
        plan.notes.append("repairs of unusable answers not counted (at most one per answer)")
        return fill(
            plan,
            spec.endpoint(),
            built,
            self.root,
            judge_stage(benchmark, model, judge),
            measured(usage_path(out), self.root, cmd.name),
            self.spr(judge),
            unpriced(spec),
        )

    @staticmethod
    def _judge_requests(
        bench: AnyBenchmark,
        ctx: Context[Any],
        judge: str,
        spec: OpenAIJudge,
        items: Any,
        gens: Sequence[Generation],
        extra: dict[str, int],
    ) -> list[Built]:
        """The judge's requests, as its stage builds them (each with its stand-in's tokens)."""
        tasks = llm_capability(bench).tasks(ctx, spec, items, gens)
        out = []
        for t in tasks:
            gid = t.generation.generation_id
            standin = gid if gid in extra else None
            out += [Built(a.request, extra.get(gid, 0), standin) for a in t.asks]
        return out

    def agreement_plans(self, stage: str, benchmark: str, labels: str) -> list[StagePlan]:
        """One plan per LLM judge of the section: it scores the labelled outputs (the first N the
        benchmark's cap allows); the other judges call no model."""
        from pipeline.stages.agreement import capability, llm_labelled

        bench = self._bench(benchmark)
        ag = capability(bench)
        ctx = self._ctx(bench, "")
        labelled = ag.load(ctx, ctx.inputs.json(labels), labels)
        items, gens = ag.to_judge(labelled)
        llm_gens = llm_labelled(bench, ctx, gens)
        plans = []
        for name in ctx.section.judges:
            spec = self.params.judges[name]
            plan = StagePlan(stage, "agreement", benchmark, None, name, provider=spec.provider)
            kind = judge_kind(bench, name, spec)
            if kind == "llm":
                assert isinstance(spec, OpenAIJudge)  # judge_kind says so
                plan.notes.append(f"{len(llm_gens)} of {len(gens)} labelled outputs")
                built = self._judge_requests(bench, ctx, name, spec, items, llm_gens, {})
                stage_llm = agreement_stage(benchmark, name)
                fill(
                    plan,
                    spec.endpoint(),
                    built,
                    self.root,
                    stage_llm,
                    None,
                    self.spr(name),
                    unpriced(spec),
                )
            elif kind == "released":
                plan.notes.append("released predictions (no model)")
            plans.append(plan)
        return plans

    def stage_plans(self, cmd: StageCmd) -> list[StagePlan]:
        if cmd.kind == "agreement":
            return self.agreement_plans(cmd.name, cmd.options["benchmark"], cmd.options["labels"])
        return [self.plan(cmd)]


def fitted_note(spec: OpenAIModel, planned: Sequence[Any]) -> str | None:
    """What a benchmark did to fit the model's prompts into its declared context window (SummHay:
    smaller RAG contexts), from the planned generations' meta."""
    budgets = sorted({int(p.meta["context_budget"]) for p in planned if "context_budget" in p.meta})
    if not budgets:
        return None
    n = sum(1 for p in planned if "context_budget" in p.meta)
    span = f"{budgets[0]:,}" if len(budgets) == 1 else f"{budgets[0]:,}-{budgets[-1]:,}"
    return (
        f"{n} of {len(planned)} prompts have their documents packed to {span} tokens to fit the"
        f" context window ({spec.context_window:,} tokens with max_tokens {spec.max_tokens}):"
        " fewer documents than the benchmark's other models see"
    )


def context_fit(root: Path, params: Params) -> list[str]:
    """For `lfbench check`: for each generate stage of dvc.yaml whose model entry declares a
    `context_window`, whether its requests fit, counted as `lfbench plan` counts them (the
    benchmark's dataset must be built)."""
    from pipeline import dvc_internals as dvc

    wanted = {
        name
        for name, spec in params.models.items()
        if isinstance(spec, OpenAIModel) and spec.context_window is not None
    }
    if not wanted:
        return []
    with dvc.open_repo(root) as repo:
        cmds = [
            StageCmd.parse(getattr(st, "addressing", None) or st.name, st.cmd)
            for st in dvc.stages(repo)
            if st.cmd
        ]
    planner = Planner(root, params, [], None)
    lines = []
    for cmd in cmds:
        model = cmd.options.get("model", "")
        if cmd.kind != "generate" or model not in wanted or cmd.options.get("benchmark") is None:
            continue
        spec = params.models[model]
        assert isinstance(spec, OpenAIModel)
        dataset = cmd.options["dataset"]
        if not planner._path(dataset).exists():
            lines.append(
                f"{cmd.name}: context window not checked: {dataset} is not built yet (`dvc"
                f" repro {cmd.options['benchmark']}-construct`, no model call by default)"
            )
            continue
        bench = planner._bench(cmd.options["benchmark"])
        planned = planner._planned_generations(
            bench, model, spec, dataset, cmd.options.get("data", "")
        )
        sized = [(p.request, message_tokens(p.request)) for p in planned]
        over = over_window(spec.endpoint(), sized)
        said = (
            window_note(spec.endpoint(), over, len(sized))
            if over
            else f"all {len(sized)} requests fit the context window ({spec.context_window:,}"
            " tokens)"
        )
        fitted = fitted_note(spec, planned)
        lines.append(f"{cmd.name}: {said}" + (f"; {fitted}" if fitted else ""))
    return lines


# ---------------------------------------------------------------- DVC


def changed_stages(root: Path, targets: Sequence[str] = ()) -> list[StageCmd]:
    """The stages `dvc status` reports changed among the targets and the stages they depend on
    (what `dvc repro TARGETS` runs first), in dvc.yaml's order, with their commands."""
    from pipeline import dvc_internals as dvc
    from pipeline.core.live import running_repro

    # a running `lfbench repro` holds DVC's lock for its whole run: read without it then
    lock = running_repro(root) is None
    try:
        with dvc.open_repo(root) as repo:
            try:
                status = dvc.status(repo, targets, lock=lock)
            except dvc.UnknownTarget as e:
                raise DataError(unknown_target(repo, targets), file="dvc.yaml") from e
            out = []
            for stage in dvc.stages(repo):
                name = getattr(stage, "addressing", None) or stage.name
                if name in status and stage.cmd:
                    out.append(StageCmd.parse(name, stage.cmd))
    except dvc.ProjectLocked as e:
        raise LfbenchError(
            "another DVC command holds this project's lock (.dvc/tmp/lock), e.g. a running"
            " `dvc repro`: plan once it is done (a lock left by a killed DVC command goes by"
            " itself)"
        ) from e
    except dvc.DvcError as e:
        raise LfbenchError(f"dvc: {' '.join(str(e).split())}") from e
    return out


def unknown_target(repo: Any, targets: Sequence[str]) -> str:
    """What to say of a target that names no stage or output: the stages near it."""
    import difflib

    from pipeline import dvc_internals as dvc

    names = dvc.pipeline_stage_names(repo)
    groups = list(dict.fromkeys(n.split("@", 1)[0] for n in names))
    for target in targets:
        if target in names or (Path(repo.root_dir) / target).exists():
            continue
        group, at, item = target.partition("@")
        if at and group in groups:
            items = [n.split("@", 1)[1] for n in names if n.startswith(f"{group}@")]
            return f"stage {group} has no item {item!r} (its items: {', '.join(items)})"
        near = difflib.get_close_matches(target, names + groups, n=3)
        hint = (
            f"did you mean {', '.join(dict.fromkeys(near))}?"
            if near
            else f"its stages are {', '.join(groups)}"
        )
        return f"no stage or output named {target!r}; {hint} (`dvc stage list` lists them all)"
    return f"no stage or output named {', '.join(map(repr, targets))}"


@dataclass
class Plan:
    stages: list[str]
    rows: list[StagePlan]
    notes: list[str]

    def totals(self) -> dict[str, Any]:
        known = [r.time_s for r in self.rows if r.time_s is not None]
        est = [r for r in self.rows if r.requests]
        return {
            "requests": sum(r.requests for r in self.rows),
            "cache_hits": sum(r.cache_hits for r in self.rows),
            "prompt_tokens": sum(r.prompt_tokens for r in self.rows),
            "completion_tokens_max": sum(r.completion_tokens_max for r in self.rows),
            "cost_usd_max": None
            if any(r.cost_usd_max is None for r in self.rows)
            else round(sum(r.cost_usd_max or 0.0 for r in self.rows), 6),
            "over_context": sum(r.over_context for r in self.rows),
            # stages run one after another (DVC runs one stage at a time)
            "time_s": None if any(r.time_s is None for r in est) else round(sum(known), 1),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "stages": self.stages,
            "rows": [r.row() for r in self.rows],
            "totals": self.totals(),
            "notes": self.notes,
        }


def make_plan(
    root: Path,
    params: Params,
    stages: Iterable[StageCmd],
    seconds_per_request: float | None = None,
    rates: Mapping[str, float] | None = None,
) -> Plan:
    stages = list(stages)
    planner = Planner(root, params, [s.name for s in stages], seconds_per_request, rates)
    rows = [row for s in stages for row in planner.stage_plans(s)]
    notes = (
        [
            "dvc repro re-checks the stages downstream of each stage it runs: a remade dataset"
            " whose content changes also re-runs the generate stages of that benchmark"
        ]
        if any(s.kind == "construct" for s in stages)
        else []
    )
    return Plan([s.name for s in stages], rows, notes)


def plan_project(
    root: Path,
    params: Params,
    targets: Sequence[str] = (),
    seconds_per_request: float | None = None,
    rates: Mapping[str, float] | None = None,
) -> Plan:
    return make_plan(root, params, changed_stages(root, targets), seconds_per_request, rates)


# ---------------------------------------------------------------- output


def _num(x: float | None, fmt: str = "{:,}") -> str:
    return "?" if x is None else fmt.format(x)


def render(plan: Plan) -> str:
    """A plain table: one line per stage and judge, then the totals and notes."""
    head = (
        "stage",
        "model",
        "judge",
        "requests",
        "cached",
        "prompt tok",
        "compl. tok (max)",
        "compl. tok (est)",
        "$ (max)",
        "$ (est)",
        "time",
        "",
    )
    lines = [head]
    for r in plan.rows:
        lines.append(
            (
                r.stage,
                r.model or "-",
                r.judge or "-",
                f"{r.requests:,}",
                f"{r.cache_hits:,}",
                f"{r.prompt_tokens:,}",
                f"{r.completion_tokens_max:,}",
                "-" if not r.requests else _num(r.completion_tokens_est),
                _num(r.cost_usd_max, "{:.4f}"),
                "-" if not r.requests else _num(r.cost_usd_est, "{:.4f}"),
                _num(r.time_s, "{:.0f} s"),
                "estimated" if r.estimated else "",
            )
        )
    t = plan.totals()
    lines.append(
        (
            "total",
            "",
            "",
            f"{t['requests']:,}",
            f"{t['cache_hits']:,}",
            f"{t['prompt_tokens']:,}",
            f"{t['completion_tokens_max']:,}",
            "",
            _num(t["cost_usd_max"], "{:.4f}"),
            "",
            _num(t["time_s"], "{:.0f} s"),
            "",
        )
    )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = [
        "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in lines
    ]
    if not plan.rows:
        out = ["dvc status: every stage is up to date; dvc repro would run nothing"]
    for r in plan.rows:
        for n in r.notes:
            out.append(
                f"  {r.stage}{'/' + r.judge if r.kind == 'agreement' and r.judge else ''}: {n}"
            )
        if r.requests:
            who = f"{r.stage}/{r.judge}" if r.kind == "agreement" else r.stage
            known = r.time_s is not None
            out.append(f"  {who}: time {'from ' if known else ''}{r.time_basis}")
    out += [f"note: {n}" for n in plan.notes]
    out.append("nothing was sent; prompt tokens in cl100k_base (message contents)")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- dvc repro --dry


def dvc_dry_run(root: Path, targets: Sequence[str] = ()) -> list[str]:
    """`dvc repro --dry [TARGETS]` that works on a project whose stages have yet to make the
    inputs of others: its lines on stdout, the stages it would run returned. DVC's dry run
    looks each changed stage up in its run cache, which hashes every dependency and fails on
    one that does not exist yet (treeverse/dvc#9818, open): here a stage with a missing
    dependency is simply not looked up (it cannot be in the run cache), which is what DVC's own
    check does for dependencies it cannot hash."""
    import sys

    from pipeline import dvc_internals as dvc

    try:
        return dvc.dry_run(root, targets, sys.stdout)
    except dvc.DvcError as e:
        raise LfbenchError(f"dvc repro --dry: {' '.join(str(e).split())}") from e


# ---------------------------------------------------------------- --probe


def probe(root: Path, plan: Plan, skip: Iterable[str] = ()) -> dict[str, tuple[float, int]]:
    """`lfbench plan --probe`: for each model or judge entry of the plan that has no measured
    rate and is not in `skip`, its first stage's first `PROBE_REQUESTS` requests sent for real,
    through the response cache (the run then finds them there: never paid twice); entry ->
    (seconds per request at its concurrency, requests sent)."""
    import time

    import aiohttp  # noqa: F401 - the client's imports, out of the first probe's time
    import httpx2  # noqa: F401
    import openai  # noqa: F401

    from pipeline.llm.client import run_chat_sync

    out: dict[str, tuple[float, int]] = {}
    skipped = set(skip)
    for r in plan.rows:
        entry = r.model if r.kind == "generate" else r.judge
        if not entry or entry in out or entry in skipped or r.probe is None:
            continue
        if r.time_basis.startswith("measured"):
            continue
        endpoint, requests = r.probe
        cache_path, _ = llm_paths(root, r.stage)
        t0 = time.monotonic()
        _, report = run_chat_sync(
            endpoint, requests, cache_path=cache_path, journal_path=None,
            label=f"probe {entry}", progress=False,
        )  # fmt: skip
        wall = time.monotonic() - t0
        if report.requests_sent and report.errors < len(requests):
            waves = math.ceil(len(requests) / endpoint.max_concurrency)
            out[entry] = (wall / waves, report.requests_sent)
    return out
