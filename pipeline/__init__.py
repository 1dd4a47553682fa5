"""lfbench: a reproducible, containerized runner for long-form RAG benchmarks."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lfbench")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"
