"""The benchmark contract and its registry, and the rules that keep benchmark packages pure and
shared code benchmark-free (checked on the source, so a new module cannot slip past)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core import registry
from pipeline.core.benchmark import Benchmark, judge_providers
from pipeline.core.config import BenchmarkParams, OwnedJudge, OwnedModel
from pipeline.core.errors import ConfigError

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
    from pipeline.core.benchmark import judge_kind
    from pipeline.core.config import LocalJudge, OpenAIJudge, PublishedJudge

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
