"""Summary of a Haystack (Laban et al., EMNLP 2024): Coverage, Citation and Joint of long
summaries that cite their documents. See README.md in this folder; the code: benchmark.py."""

from pipeline.benchmarks.summhay.benchmark import SummHay
from pipeline.core.registry import register

register(SummHay())
