"""How a benchmark runs a judge entry: the core judge providers it offers (`judge_providers`,
from the judging it declares, its extensions included) and the kind of judging an entry gets
(`judge_kind`, resolved once here for the stages and params validation)."""

from __future__ import annotations

from typing import Literal, TypeAlias

from pipeline.core.benchmark import AnyBenchmark, own_specs
from pipeline.core.config import JudgeSpec, LocalJudge, OpenAIJudge, OwnedJudge, PublishedJudge
from pipeline.core.errors import ConfigError
from pipeline.core.extensions import ReleasedJudgements

JudgeKind: TypeAlias = Literal["llm", "coverage", "no_model", "released"]


def judge_providers(bench: AnyBenchmark) -> frozenset[str]:
    """The core judge providers a benchmark offers: those of the judging it declares."""
    return frozenset(
        provider
        for provider, has in (
            ("openai", bench.llm_judge),
            ("local", bench.coverage),
            ("published", ReleasedJudgements.of(bench)),
        )
        if has is not None
    )


def judge_kind(bench: AnyBenchmark, judge: str, spec: JudgeSpec) -> JudgeKind:
    """How `bench` runs the judge entry `judge` (resolved once, here): a ConfigError when the
    benchmark declares no judging of that kind."""
    if isinstance(spec, OpenAIJudge):
        kind: JudgeKind | None = "llm" if bench.llm_judge is not None else None
    elif isinstance(spec, PublishedJudge):
        kind = "released" if ReleasedJudgements.of(bench) is not None else None
    elif isinstance(spec, LocalJudge):
        kind = "coverage" if bench.coverage is not None else None
    elif bench.coverage is not None and bench.coverage.judge(spec) is not None:
        kind = "coverage"
    elif bench.no_model_judge is not None and isinstance(spec, own_specs(bench, OwnedJudge)):
        kind = "no_model"
    else:
        kind = None
    if kind is None:
        raise ConfigError(
            f"judges.{judge}: {bench.name} cannot be judged by provider {spec.provider!r} (it"
            f" offers: {', '.join(sorted(judge_providers(bench))) or 'no core provider'} and"
            " its own providers)"
        )
    return kind
