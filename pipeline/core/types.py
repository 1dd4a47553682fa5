"""The model layer's records: an endpoint, a request, its result and a stage's usage report.

Benchmark packages build `ChatRequest`s and read `ChatResult`s; only the stage layer sends them
(through `pipeline.llm.client`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The offline fallback of embedding similarities (pipeline.llm.embeddings.embed_local).
LOCAL_EMBEDDING_MODEL = (
    "sentence-transformers/all-MiniLM-L6-v2 (local fallback, not the paper's model)"
)


class EndpointConfig(BaseModel):
    """One OpenAI-compatible endpoint and model, with its sampling and client settings."""

    # allow_inf_nan: a `.nan` temperature or price must not reach the wire or the cost; strict:
    # `max_tokens: "512"` or `seed: true` is an error, not a conversion (see config.Strict).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float = 0.0
    top_p: float | None = None
    max_tokens: int = Field(default=1024, ge=1)
    # The tokens the served model can hold, prompt and answer together (its trained context,
    # or less if the server is started with less: llama.cpp's --n_ctx, vLLM's --max-model-len,
    # Ollama's OLLAMA_CONTEXT_LENGTH). lfbench check and plan name the prompts that do not fit;
    # a benchmark that can (SummHay's RAG contexts) packs this model's contexts to fit.
    context_window: int | None = Field(default=None, ge=256)
    seed: int | None = 0
    max_concurrency: int = Field(default=8, ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=6, ge=0)
    price_input_per_1m: float = Field(default=0.0, ge=0)
    price_output_per_1m: float = Field(default=0.0, ge=0)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        check_base_url(url)
        return url


def shown_url(url: str) -> str:
    """A URL as a message may show it: never its query or fragment (`?key=...`, `#...`, where
    people put tokens), and nothing at all when it has an `@` (a user name and password, or a
    token, may be on either side of it)."""
    text = url.strip()
    if "@" in text:
        return "(not shown: it has an @)"
    cut = min((i for i in (text.find("?"), text.find("#")) if i >= 0), default=len(text))
    if cut == len(text):
        return repr(text)
    return f"{text[:cut]!r} (its query and fragment not shown)"


def check_base_url(url: str) -> None:
    """Refuse a base_url the client cannot send to as meant: not an http(s) URL with a host
    (`127.0.0.1:8000/v1`, `''`, `ftp://...`), a bad port, a query or fragment (the client appends
    `/chat/completions`), or a user name or password (never sent: the key comes from the variable
    `api_key_env` names). The message never repeats the URL's credentials, query or fragment
    (`shown_url`)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url.strip())
    shown = shown_url(url)
    if parts.scheme.lower() not in ("http", "https") or "//" not in url:
        raise ValueError(f"not an http(s) URL: {shown} (e.g. http://127.0.0.1:8000/v1)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "has a user name or password (user:password@host): the client sends no credentials"
            " from a URL; remove them and put the key in the environment variable that"
            " api_key_env names"
        )
    if not parts.hostname:
        raise ValueError(f"no host in {shown}; e.g. http://127.0.0.1:8000/v1")
    try:
        parts.port  # noqa: B018 - raises on a port that is not 0-65535
    except ValueError:
        raise ValueError(f"not a valid port in {shown}") from None
    if parts.query or parts.fragment:
        raise ValueError(
            f"has a query or fragment ({shown}): the client appends /chat/completions to"
            " base_url, so they would not reach the server as written; a key goes in the"
            " environment variable that api_key_env names"
        )


@dataclass(frozen=True)
class ChatRequest:
    key: str
    messages: list[dict[str, str]]
    prompt_sha: str
    sample: int = 0
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None


class ChatResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    cache_key: str
    status: Literal["ok", "error"]
    text: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    retries: int = 0
    source: Literal["api", "cache", "journal"] = "api"
    cost_usd: float | None = 0.0  # None: the server sent no usage (unknown, not $0)
    usage_missing: bool = False


class UsageReport(BaseModel):
    label: str
    items: int
    ok: int
    errors: int
    requests_sent: int
    retries: int
    cache_hits: int
    cache_misses: int
    journal_hits: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: unknown (answers without usage, `usage_missing`), not $0
    wall_s: float
    truncated: int = 0  # answers the server cut (finish_reason: length, or content_filter)
    cache_corrupt: int = 0  # cache entries that failed their checksum (refused, fetched again)
    waited: int = 0  # answers another worker was fetching (its claim): waited for, not sent
    journal_corrupt: int = 0  # journal lines that failed their checksum (refused, fetched again)
    usage_missing: int = 0  # answers sent without token usage: their tokens and cost are unknown

    def cost_text(self) -> str:
        """The cost for a log line: dollars, or why it is unknown."""
        if self.cost_usd is None:
            return f"cost unknown ({self.usage_missing} answers without usage)"
        return f"${self.cost_usd:.4f}"

    def merged(self, other: UsageReport) -> UsageReport:
        """The sum of two reports (wall_s summed too); keeps this report's label."""
        summed: dict[str, Any] = {"label": self.label}
        for name in type(self).model_fields:
            if name == "cost_usd":
                a, b = self.cost_usd, other.cost_usd
                summed[name] = None if a is None or b is None else a + b
            elif name != "label":
                summed[name] = getattr(self, name) + getattr(other, name)
        return UsageReport(**summed)
