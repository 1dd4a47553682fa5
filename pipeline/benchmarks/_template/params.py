"""The `_template:` section of params.yaml."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.config import BenchmarkParams, PromptFiles

PROMPTS = "pipeline/benchmarks/_template/prompts"


class TemplatePrompts(PromptFiles):
    generate: str = f"{PROMPTS}/generate.txt"
    judge: str = f"{PROMPTS}/judge.txt"
    repair: str = f"{PROMPTS}/repair.txt"


class TemplateParams(BenchmarkParams):
    source: str | None = Field(
        default=None,
        description="a JSONL file of items (schema.Item), relative to the project; null = the"
        " built-in examples",
    )
    max_words: int = Field(default=80, ge=1, description="answer length of no-model baselines")
    prompts: TemplatePrompts = TemplatePrompts()
