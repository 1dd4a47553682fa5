"""Long²RAG (Qi et al., 2024): Key Point Recall of long answers over retrieved documents. See
README.md in this folder; the code: benchmark.py."""

from pipeline.benchmarks.long2rag.benchmark import Long2Rag
from pipeline.core.registry import register

register(Long2Rag())
