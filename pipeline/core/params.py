"""params.yaml loaded and validated: the core (`pipeline.core.config`), then each benchmark's
section with its package's own params model, the model and judge entries of the providers the
package defines, and the cross-references between a section and the entries (a judge the
benchmark cannot run is refused here, so `lfbench check` says so)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.core import registry
from pipeline.core.benchmark import AnyBenchmark, own_specs
from pipeline.core.config import (
    BUILTIN_RETRIEVERS,
    SYSTEM_PROVIDERS,
    BenchmarkParams,
    OutputsModel,
    OwnedJudge,
    OwnedModel,
    Params,
    PublishedModel,
    RerankRetriever,
    RunRetriever,
    invalid,
    load_yaml,
    owner_of,
    problem,
)
from pipeline.core.errors import ConfigError
from pipeline.core.judging import judge_kind, judge_providers


def validate_params(
    raw: Any, path: Path | str = "params.yaml", benchmarks: Iterable[str] | None = None
) -> Params:
    """Validate a parsed params document: the core, then the benchmark sections named in
    `benchmarks` (None: every section present), each with its package's own params model, the
    model and judge entries of the providers that package defines, and the cross-references
    between the section and the entries."""
    try:
        params = Params.model_validate(raw)
    except ValidationError as e:
        raise invalid(path, e) from e
    names = params.benchmarks() if benchmarks is None else list(benchmarks)
    models: dict[str, Any] = dict(params.models)
    judges: dict[str, Any] = dict(params.judges)
    sections: dict[str, BenchmarkParams] = {}
    for name in names:
        bench = registry.get(name)
        raw_section = params.raw_section(name)
        if raw_section is None:
            raise ConfigError(f"{path} has no {name} section (the {name} benchmark's params)")
        try:
            sections[name] = bench.params_model.model_validate(raw_section)
        except ValidationError as e:
            raise invalid(path, e, (name,)) from e
        for kind, entries, owned in (
            ("models", models, own_specs(bench, OwnedModel)),
            ("judges", judges, own_specs(bench, OwnedJudge)),
        ):
            by_provider = {_provider_of(cls): cls for cls in owned}
            for entry, spec in entries.items():
                if not isinstance(spec, OwnedModel | OwnedJudge) or owner_of(spec.provider) != name:
                    continue
                cls = by_provider.get(spec.provider)
                if cls is None:
                    raise problem(
                        path,
                        f"{kind}.{entry}.provider",
                        f"benchmark {name} defines no provider {spec.provider!r}"
                        f" (it defines: {', '.join(by_provider) or 'none'})",
                    )
                try:
                    entries[entry] = cls.model_validate(spec.model_dump())
                except ValidationError as e:
                    raise invalid(path, e, (kind, entry)) from e
    params = params.model_copy(update={"models": models, "judges": judges})
    for entry, spec in judges.items():
        for model in spec.models if isinstance(getattr(spec, "models", None), list) else ():
            if model not in models:
                raise problem(
                    path,
                    f"judges.{entry}.models",
                    f"names {model!r}, which is not defined under models",
                )
    for name, section in sections.items():
        _check_section(registry.get(name), section, params, path)
    if benchmarks is None:
        _check_slices(params, sections, path)
        _check_settings(params, sections, path)
    params._sections.update(sections)
    return params


def _check_slices(
    params: Params, sections: Mapping[str, BenchmarkParams], path: Path | str
) -> None:
    """A model's slice names benchmarks that run it."""
    for entry, spec in params.models.items():
        for bench in getattr(spec, "slice", {}) or {}:
            if bench not in sections:
                raise problem(
                    path, f"models.{entry}.slice.{bench}", f"no benchmark section {bench!r}"
                )
            if entry not in sections[bench].models:
                raise problem(
                    path,
                    f"models.{entry}.slice.{bench}",
                    f"{bench}.models does not list {entry!r}: the slice would never be used",
                )


def _check_settings(
    params: Params, sections: Mapping[str, BenchmarkParams], path: Path | str
) -> None:
    """A model's `settings` against the benchmarks' settings: a list names only settings one
    of the project's benchmarks has (one that runs the model takes them; the names of a
    benchmark that does not run it wait for it: the shipped baselines list SummHay's, and run
    where a project keeps them); a mapping names benchmarks that run it and have settings
    (each one's names are checked by `_check_model_settings`)."""
    every = {
        b: n for b in sections if (n := registry.get(b).setting_names(sections[b])) is not None
    }
    known = {n for ns in every.values() for n in ns}
    for entry, spec in params.models.items():
        settings = getattr(spec, "settings", None)
        if settings is None or isinstance(spec, PublishedModel):
            continue
        runs = {
            b: registry.get(b).setting_names(sections[b])
            for b in sections
            if entry in sections[b].models
        }
        if isinstance(settings, dict):
            for bench in settings:
                if runs.get(bench) is None:
                    why = f"{bench}.models does not list {entry!r}"
                    if bench not in sections:
                        why = f"no benchmark section {bench!r}"
                    elif bench in runs:
                        why = f"{bench} has no settings a model picks"
                    raise problem(
                        path,
                        f"models.{entry}.settings.{bench}",
                        f"{why} (benchmarks that run {entry!r} with settings:"
                        f" {', '.join(b for b, n in runs.items() if n is not None) or 'none'})",
                    )
            continue
        valid = {b: n for b, n in runs.items() if n is not None} or every
        unknown = [s for s in settings if s not in known]
        if unknown:
            hint = [f"{b}.retrievers" for b in valid if registry.get(b).retrieval is not None]
            raise problem(
                path,
                f"models.{entry}.settings",
                f"{_unknown(unknown)}: no benchmark has {'it' if len(unknown) == 1 else 'them'}"
                f" (those that run {entry!r}: "
                + "; ".join(f"{b}: {', '.join(n)}" for b, n in valid.items())
                + (
                    f"; a retrievers entry is a setting once listed in {', '.join(hint)}"
                    if hint
                    else ""
                )
                + ")",
            )


def _check_model_settings(
    bench: AnyBenchmark, section: BenchmarkParams, params: Params, path: Path | str
) -> None:
    """The settings a mapping gives this benchmark for a model it runs: its own names."""
    names = bench.setting_names(section)
    for entry in section.models:
        spec = params.models[entry]
        settings = getattr(spec, "settings", None)
        if isinstance(spec, PublishedModel) or not isinstance(settings, dict):
            continue
        if bench.name not in settings:
            continue
        if names is None:
            raise problem(
                path,
                f"models.{entry}.settings.{bench.name}",
                f"{bench.name} has no settings a model picks",
            )
        unknown = [s for s in settings[bench.name] if s not in names]
        if unknown:
            raise problem(
                path,
                f"models.{entry}.settings.{bench.name}",
                f"{_unknown(unknown)} ({bench.name} has: {', '.join(names)})",
            )


def _unknown(names: list[str]) -> str:
    return f"unknown setting{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"


def _provider_of(cls: type[BaseModel]) -> str:
    field = cls.model_fields["provider"]
    args: tuple[Any, ...] = getattr(field.annotation, "__args__", ())
    if len(args) != 1 or not isinstance(args[0], str):
        raise TypeError(f"{cls.__name__}.provider must be a Literal of one provider name")
    return str(args[0])


def _check_section(
    bench: AnyBenchmark, section: BenchmarkParams, params: Params, path: Path | str
) -> None:
    """The section's model and judge lists against the entries: defined, and runnable here."""
    name = bench.name
    runs = bench.model_providers | (SYSTEM_PROVIDERS if bench.systems is not None else set())
    for kind, listed, entries, core in (
        ("models", section.models, params.models, runs),
        ("judges", section.judges, params.judges, judge_providers(bench)),
    ):
        for entry in listed:
            if entry not in entries:
                raise problem(
                    path, f"{name}.{kind}", f"names {entry!r}, which is not defined under {kind}"
                )
            spec = entries[entry]
            provider = spec.provider
            if owner_of(provider) is not None:
                if owner_of(provider) != name:
                    raise problem(
                        path,
                        f"{name}.{kind}",
                        f"{entry!r} has provider {provider}, which belongs to benchmark"
                        f" {owner_of(provider)}",
                    )
            elif provider not in core:
                raise problem(
                    path,
                    f"{name}.{kind}",
                    f"{entry!r} has provider {provider}, which {name} cannot run"
                    f" (it runs: {', '.join(sorted(core))} and its own providers)",
                )
            if kind == "judges":  # a judge of its own providers the benchmark cannot run
                try:
                    judge_kind(bench, entry, params.judges[entry])
                except ConfigError as e:
                    raise problem(path, f"{name}.{kind}", str(e)) from e
            replayed = getattr(spec, "benchmark", None)
            if provider == "published" and replayed not in (None, name):
                raise problem(
                    path,
                    f"{name}.{kind}",
                    f"{entry!r} replays {replayed} outputs, not {name}'s",
                )
    for entry in section.models:
        spec = params.models[entry]
        if isinstance(spec, OutputsModel) and name not in spec.files:
            raise problem(
                path,
                f"models.{entry}.files",
                f"names no file for {name}, which lists {entry!r} in its models",
            )
    _check_retrievers(bench, section, params, path)
    _check_model_settings(bench, section, params, path)
    try:
        bench.check_params(section, params)
    except ValueError as e:
        raise problem(path, name, str(e)) from e


def _check_retrievers(
    bench: AnyBenchmark, section: BenchmarkParams, params: Params, path: Path | str
) -> None:
    """The retrievers a section runs: defined, runnable by the benchmark, named apart from its
    own settings, with what each needs for this benchmark."""
    name = bench.name
    if section.retrievers and bench.retrieval is None:
        raise problem(path, f"{name}.retrievers", f"{name} takes no retrievers of yours")
    reserved = bench.retrieval.reserved if bench.retrieval is not None else ()
    for entry in section.retrievers:
        spec = params.retrievers.get(entry)
        if spec is None:
            raise problem(
                path,
                f"{name}.retrievers",
                f"names {entry!r}, which is not defined under retrievers",
            )
        if entry in reserved:
            raise problem(
                path,
                f"retrievers.{entry}",
                f"{entry!r} is the name of one of {name}'s own settings or rankings; give the"
                " entry another name",
            )
        if isinstance(spec, RunRetriever) and name not in spec.files:
            raise problem(
                path,
                f"retrievers.{entry}.files",
                f"names no run file for {name}, which lists {entry!r} in its retrievers",
            )
        if isinstance(spec, RerankRetriever) and spec.over not in (*BUILTIN_RETRIEVERS, *reserved):
            raise problem(
                path,
                f"retrievers.{entry}.over",
                f"{spec.over!r} is not a ranking {name} has: use"
                f" {', '.join([*BUILTIN_RETRIEVERS, *reserved])}",
            )


def load_params(
    path: Path = Path("params.yaml"), benchmarks: Iterable[str] | None = None
) -> Params:
    """params.yaml, validated: the core and the named benchmark sections (None: all)."""
    return validate_params(load_yaml(path), path, benchmarks)
