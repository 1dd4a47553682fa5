"""CRUX (Ju et al., 2025): coverage, ranked coverage and density of a RAG pipeline's retrieval
context, and whether they predict the final answer. See README.md in this folder; the code:
benchmark.py."""

from pipeline.benchmarks.crux.benchmark import Crux
from pipeline.core.registry import register

register(Crux())
