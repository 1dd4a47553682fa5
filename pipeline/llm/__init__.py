"""LLM access for the pipeline: an OpenAI-compatible client with cache, journal and retries."""

from pipeline.llm.client import (
    ChatRequest,
    ChatResult,
    EndpointConfig,
    UsageReport,
    cache_key,
    clear_journal,
    resolve_api_key,
    run_chat,
    run_chat_sync,
    write_usage,
)

__all__ = [
    "ChatRequest",
    "ChatResult",
    "EndpointConfig",
    "UsageReport",
    "cache_key",
    "clear_journal",
    "resolve_api_key",
    "run_chat",
    "run_chat_sync",
    "write_usage",
]
