"""The benchmark contract and its registry, and the rules that keep benchmark packages pure and
shared code benchmark-free (checked on the source, so a new module cannot slip past)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core import registry
from pipeline.core.benchmark import Benchmark
from pipeline.core.config import BenchmarkParams, OwnedJudge, OwnedModel
from pipeline.core.errors import ConfigError
from pipeline.core.judging import judge_providers

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
BENCHMARKS = PIPELINE / "benchmarks"
PACKAGES = sorted(p.name for p in BENCHMARKS.iterdir() if (p / "__init__.py").exists())

# What a benchmark package may not import: file, process and database access, the model client,
# MLflow, the stage layer and the shared judges (which do I/O).
FORBIDDEN_MODULES = (
    "os",
    "shutil",
    "subprocess",
    "sqlite3",
    "tempfile",
    "pathlib",
    "mlflow",
    "openai",
    "aiohttp",
    "httpx",
    "requests",
    "pipeline.core.io",
    "pipeline.llm.client",
    "pipeline.llm.cache",
    "pipeline.llm.journal",
    "pipeline.stages",
    "pipeline.local_judge",
    "pipeline.core.registry",  # only __init__.py registers
)
FORBIDDEN_CALLS = (
    "open",
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "mkdir",
    "unlink",
)


def modules(folder: Path) -> Iterator[Path]:
    """The package's modules (not the template's test snippet, which the scaffold writes to
    tests/)."""
    yield from sorted(
        p
        for p in folder.rglob("*.py")
        if "__pycache__" not in p.parts and not p.name.endswith(".snippet.py")
    )


def imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for a in node.names:
                yield node.lineno, f"{node.module}.{a.name}"


def test_registry_finds_every_package_and_loads_only_what_is_asked() -> None:
    assert set(registry.names()) == {p for p in PACKAGES if not p.startswith("_")}
    assert "_template" not in registry.names()
    known = ", ".join(sorted(p for p in PACKAGES if not p.startswith("_")))
    bench = registry.get("summhay")
    assert bench.name == "summhay" and isinstance(bench, Benchmark)
    with pytest.raises(ConfigError, match=f"unknown benchmark 'nope'; known: {known}$"):
        registry.get("nope")


def test_registry_refuses_a_duplicate_name() -> None:
    bench = registry.get("long2rag")
    with pytest.raises(ConfigError, match="benchmark 'long2rag' is registered twice"):
        registry.register(type(bench)())
    assert registry.get("long2rag") is bench


@pytest.mark.parametrize("name", [p for p in PACKAGES])
def test_each_package_fulfils_the_contract(name: str) -> None:
    import importlib

    importlib.import_module(f"pipeline.benchmarks.{name}")
    bench = registry.get(name) if not name.startswith("_") else registry._REGISTRY[name]
    assert bench.name == name
    assert issubclass(bench.params_model, BenchmarkParams)
    assert bench.model_providers <= {"openai", "published", "baseline"}
    assert judge_providers(bench) <= {"openai", "published", "local"}
    for spec in bench.providers:
        assert issubclass(spec, OwnedModel | OwnedJudge)
        provider = spec.model_fields["provider"].annotation.__args__[0]  # type: ignore[union-attr]
        assert provider.startswith(f"{name}-"), f"{spec.__name__}: own providers are {name}-<kind>"


# What the core contract may hold (issue 43: at most 20 members, the optional capabilities
# apart): a member is a name the body of `Benchmark` declares, an attribute or a method.
CAPABILITIES = {
    "llm_judge", "coverage", "no_model_judge", "agreement", "audit", "paper", "retrieval",
    "systems", "extensions",
}  # fmt: skip
ONE_PAPER = ("restrict", "scored_items", "released", "judge_training", "scorer", "failed_outcome")


def members(cls: type) -> list[str]:
    tree = ast.parse(Path(inspect.getsourcefile(cls) or "").read_text(encoding="utf-8"))
    (body,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    out = []
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
        elif isinstance(node, ast.Assign):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.FunctionDef):
            out.append(node.name)
    return out


def test_the_core_contract_is_small_and_holds_no_one_paper_hook() -> None:
    """At most 20 members beside the optional capabilities; the hooks one paper alone needs
    (SummHay: restrict, scored_items, released, judge_training; CRUD-RAG: scorer,
    failed_outcome) are extensions (pipeline/core/extensions.py), not members (it had 31,
    those six among them)."""
    declared = members(Benchmark)
    core = [m for m in declared if m not in CAPABILITIES]
    assert len(core) <= 20, core
    assert set(declared) >= CAPABILITIES
    assert [h for h in ONE_PAPER if hasattr(Benchmark, h)] == []
    for name in registry.names():  # and no benchmark keeps one as a member of its own
        assert [h for h in ONE_PAPER if hasattr(registry.get(name), h)] == [], name


def test_metrics_and_item_score_are_required() -> None:
    """A benchmark without them cannot be made (they had defaults: an empty tuple, a raise)."""
    from pipeline.benchmarks._template.benchmark import Template
    from pipeline.core.results import Metric

    class NoScore(Template):
        item_score = Benchmark.item_score  # type: ignore[assignment]

    class NoMetrics(Template):
        metrics = Benchmark.metrics  # type: ignore[assignment]

    for cls, missing in ((NoScore, "item_score"), (NoMetrics, "metrics")):
        with pytest.raises(TypeError, match=f"abstract method.*{missing}"):
            cls()

    class Empty(Template):
        name = "empty"
        metrics: tuple[Metric, ...] = ()

    with pytest.raises(ConfigError, match="benchmark 'empty' declares no metrics"):
        registry.register(Empty())
    assert "empty" not in registry._REGISTRY


def test_an_extension_is_found_by_its_kind_once() -> None:
    from pipeline.benchmarks._template.benchmark import Template
    from pipeline.core.extensions import JudgeTraining, ReleasedJudgements, Scorer, restrict

    summhay, crud = registry.get("summhay"), registry.get("crud_rag")
    assert JudgeTraining.of(summhay) is not None and ReleasedJudgements.of(summhay) is not None
    assert Scorer.of(crud) is not None and Scorer.of(summhay) is None
    assert JudgeTraining.of(Template()) is None

    class Twice(Template):
        extensions = (*crud.extensions, *crud.extensions)

    with pytest.raises(ConfigError, match="declares 2 extensions Scorer"):
        Scorer.of(Twice())
    # without ItemsInRecords, a record is an item: a slice keeps the records it names
    records = [type("R", (), {"item_id": i})() for i in ("a", "b")]
    assert restrict(Template(), records, {"b"}) == records[1:]


@pytest.mark.parametrize("name", PACKAGES)
def test_benchmark_packages_are_pure(name: str) -> None:
    """No file I/O, no model client, no MLflow, no stage layer, no other benchmark."""
    others = [f"pipeline.benchmarks.{p}" for p in PACKAGES if p != name]
    problems = []
    for path in modules(BENCHMARKS / name):
        rel = path.relative_to(ROOT)
        for line, mod in imports(path):
            bad = [m for m in (*FORBIDDEN_MODULES, *others) if mod == m or mod.startswith(m + ".")]
            if bad and not (
                path.name == "__init__.py" and mod.startswith("pipeline.core.registry")
            ):
                problems.append(f"{rel}:{line} imports {mod}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if called in FORBIDDEN_CALLS:
                    problems.append(f"{rel}:{node.lineno} calls {called}()")
    assert problems == []


@pytest.mark.parametrize("name", PACKAGES)
def test_a_package_init_only_registers(name: str) -> None:
    tree = ast.parse((BENCHMARKS / name / "__init__.py").read_text(encoding="utf-8"))
    body = [n for n in tree.body if not isinstance(n, ast.Expr | ast.Import | ast.ImportFrom)]
    calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    assert body == [] and len(calls) == 1
    call = calls[0].value
    assert isinstance(call, ast.Call) and getattr(call.func, "id", "") == "register"


def test_shared_code_names_no_benchmark() -> None:
    """Outside pipeline/benchmarks/, no module imports a particular benchmark package."""
    problems = []
    for path in modules(PIPELINE):
        if BENCHMARKS in path.parents:
            continue
        for line, mod in imports(path):
            parts = mod.split(".")
            if parts[:2] == ["pipeline", "benchmarks"] and len(parts) > 2:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert problems == []


def test_the_judges_a_benchmark_offers_follow_from_what_it_declares() -> None:
    """The core judge providers are derived from the declared capabilities; a judge kind the
    benchmark does not declare is refused by `judge_kind` (and so by `lfbench check`)."""
    from pipeline.benchmarks._template.benchmark import Template
    from pipeline.core.config import LocalJudge, OpenAIJudge, PublishedJudge
    from pipeline.core.judging import judge_kind

    assert judge_providers(registry.get("summhay")) == {"openai", "published", "local"}
    assert judge_providers(registry.get("crux")) == {"openai", "local"}
    assert judge_providers(registry.get("crud_rag")) == {"openai"}

    class LlmOnly(Template):
        coverage = None

    bench = LlmOnly()
    assert judge_providers(bench) == {"openai"}
    llm = OpenAIJudge(provider="openai", model="m", base_url="http://x/v1")
    assert judge_kind(bench, "llm", llm) == "llm"
    for spec in (LocalJudge(provider="local"), PublishedJudge(provider="published")):
        with pytest.raises(ConfigError, match="cannot be judged by provider"):
            judge_kind(bench, "j", spec)
    assert judge_kind(Template(), "local", LocalJudge(provider="local")) == "coverage"


def test_check_refuses_a_judge_the_benchmark_cannot_run() -> None:
    """CRUD-RAG has no coverage judging: a local judge in its section is a params error."""
    import yaml

    from pipeline.core.params import validate_params

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["crud_rag"]["judges"] = [*raw["crud_rag"]["judges"], "local"]
    with pytest.raises(ConfigError, match=r"crud_rag.judges.*'local' has provider local"):
        validate_params(raw, "params.yaml", ["crud_rag"])
