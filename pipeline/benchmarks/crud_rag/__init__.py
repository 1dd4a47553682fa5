"""CRUD-RAG (Lyu et al., 2024): Chinese RAG on Create, Read, Update and Delete tasks, scored
against references (BLEU, ROUGE-L, RAGQuestEval), with its study of the retrieval knobs. See
README.md in this folder; the code: benchmark.py."""

from pipeline.benchmarks.crud_rag.benchmark import CrudRag
from pipeline.core.registry import register

register(CrudRag())
