"""_template: a small working benchmark to start a new one from (`lfbench new-benchmark NAME`
copies this folder, renaming `_template`). See README.md in this folder."""

from pipeline.benchmarks._template.benchmark import Template
from pipeline.core.registry import register

register(Template())
