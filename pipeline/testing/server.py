"""An OpenAI-compatible chat-completions server on 127.0.0.1, for tests and the LLM benchmark.

Runs in its own process (``python -m pipeline.testing.server``, or the :class:`TestServer` context
manager that starts that process), so that the server and the client under test use different
cores. Built on aiohttp.

- ``POST /v1/chat/completions`` answers with a completion whose content a *responder* decides:
  by default ``"echo: " + sha256(last user message)[:16]``; ``--script FILE`` (a JSON list of rules
  ``{"match": "<substring of the last user message>", "reply": "...", "status": 400,
  "faults": ["429", "hang"]}``, first match wins; ``status`` answers with that HTTP error,
  ``faults`` injects those faults on the first attempts of a matching body, ``finish_reason``
  answers with that reason, e.g. ``content_filter``, and ``"reply": null`` with no content) or
  ``--responder module:function`` (a callable ``(body: dict) -> str``). Token counts are
  ``max(1, chars // 4)`` unless ``--tokenizer`` says otherwise.
- ``POST /v1/embeddings`` and ``POST /v1/rerank`` (Cohere's form) answer with deterministic
  vectors and scores (``Server.embeddings``, ``Server.rerank``), with the same faults and log.
- ``GET /v1/models`` lists one model.
- ``--latency-ms``: sleep before answering.
- ``--tokenizer``: how usage counts tokens: `chars` (a quarter of the characters, the default) or
  `cl100k` (cl100k_base, as an OpenAI model counts the messages' contents).
- Faults: with probability ``--fault-rate`` (decided by a seeded hash of the body and the number of
  times that body was seen, so it does not depend on arrival order) one of ``--faults``
  (``429``, ``500``, ``hang``, ``malformed``, ``truncated``, ``drip``) is injected, at most
  ``--max-faults-per-request`` times per distinct body. ``drip`` sends a valid answer one byte
  every ``--drip-s`` seconds (default 1): a client that only times each read never gives up.
- ``--log FILE``: one JSON line per request (flushed), written just before the answer is sent
  (for a hang: when the hang starts): ``time``
  (arrival), ``body_sha256``, ``prompt_head`` (first 200 chars of the last user message), ``model``,
  ``attempt``, ``fault``, ``status``, ``served`` (a valid answer was returned), and for a served
  answer its ``prompt_tokens`` and ``completion_tokens`` (what its usage reports, when it has one),
  and ``in_flight`` / ``in_flight_model``: the chat requests being handled when it arrived
  (itself included), in all and of its model (``TestServer.max_in_flight()`` reads their most).
- ``--no-usage``: answers carry no ``usage`` object (as some servers send), so token counts and
  cost are unknown to the client.
- ``--port 0`` picks a free port; ``--port-file FILE`` receives it once the server listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from aiohttp import web

FAULTS = ("429", "500", "hang", "malformed", "truncated", "drip")

Responder = Callable[[dict[str, Any]], str]


class ScriptedStatus(Exception):
    """Raised by a responder to answer with an HTTP error status instead of a completion."""

    def __init__(self, status: int, message: str = "scripted error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def last_user_message(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user":
                return str(m.get("content", ""))
    return ""


def default_responder(body: dict[str, Any]) -> str:
    text = last_user_message(body)
    return "echo: " + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def script_responder(rules: list[dict[str, Any]]) -> Responder:
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or "match" not in rule:
            raise ValueError(f"script rule {i}: needs a 'match' field")

    def respond(body: dict[str, Any]) -> str:
        text = last_user_message(body)
        for rule in rules:
            if str(rule["match"]) in text:
                if rule.get("status"):
                    raise ScriptedStatus(int(rule["status"]), str(rule.get("reply", "")))
                if "reply" in rule:
                    return "" if rule["reply"] is None else str(rule["reply"])
                break
        return default_responder(body)

    return respond


def load_rules(script: Path) -> list[dict[str, Any]]:
    rules = json.loads(script.read_text(encoding="utf-8"))
    if not isinstance(rules, list):
        raise ValueError(f"{script}: a script is a JSON list of rules")
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or "match" not in rule:
            raise ValueError(f"{script}: rule {i} needs a 'match' field")
        bad = [f for f in rule.get("faults", []) if f and f not in FAULTS]
        if bad:
            raise ValueError(f"{script}: rule {i}: unknown fault(s) {bad}")
    return rules


def load_responder(spec: str | None, script: Path | None) -> Responder:
    if script is not None:
        return script_responder(load_rules(script))
    if spec:
        module_name, _, func = spec.partition(":")
        module = importlib.import_module(module_name)
        fn = getattr(module, func or "respond")
        if not callable(fn):
            raise ValueError(f"responder {spec} is not callable")
        return fn  # type: ignore[no-any-return]
    return default_responder


# How usage counts tokens: "chars" (a quarter of the characters) or "cl100k" (cl100k_base, as
# an OpenAI model counts; --tokenizer). One server process, one setting.
TOKENIZERS = ("chars", "cl100k")
_tokenizer = "chars"


def n_tokens(text: str) -> int:
    if _tokenizer == "cl100k":
        from pipeline.retrieval.tokens import count_tokens

        return max(1, count_tokens(text))
    return max(1, len(text) // 4)


def cut_to(text: str, limit: int) -> str:
    """The start of an answer that fills `limit` tokens."""
    if _tokenizer == "cl100k":
        from pipeline.retrieval.tokens import truncate_tokens

        return truncate_tokens(text, limit)
    return text[: 4 * limit]


EMBED_DIM = 64


def text_vector(text: str) -> list[float]:
    """The test server's embedding of a text: counts of its character bigrams (and the single
    character of a one-character text) hashed into EMBED_DIM dimensions, L2-normalised."""
    v = [0.0] * EMBED_DIM
    grams = [text[i : i + 2] for i in range(len(text) - 1)] or [text]
    for g in grams:
        v[int(hashlib.sha256(g.encode("utf-8")).hexdigest()[:8], 16) % EMBED_DIM] += 1.0
    norm = sum(x * x for x in v) ** 0.5 or 1.0
    return [x / norm for x in v]


def prompt_tokens(body: dict[str, Any]) -> int:
    """The tokens of the messages' contents (no chat template)."""
    messages = body.get("messages")
    contents = []
    if isinstance(messages, list):
        contents = [str(m.get("content", "")) for m in messages if isinstance(m, dict)]
    if _tokenizer == "cl100k":
        return max(1, sum(n_tokens(c) for c in contents if c))
    return max(1, sum(len(c) for c in contents) // 4)


class FaultPlan:
    """Which fault (if any) the n-th request with a given body gets: a pure function of
    (seed, body hash, n), capped at ``max_per_body`` faults per body."""

    def __init__(self, rate: float, faults: Sequence[str], seed: int, max_per_body: int) -> None:
        unknown = [f for f in faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
        self.rate = rate
        self.faults = list(faults)
        self.seed = seed
        self.max_per_body = max_per_body
        self.attempts: dict[str, int] = {}
        self.injected: dict[str, int] = {}

    def next(self, body_sha: str, scripted: Sequence[str] = ()) -> tuple[int, str | None]:
        """(attempt number of this body, 0-based; the fault to inject or None).

        `scripted`: the faults a script rule asks for, one per attempt, before any random one.
        """
        n = self.attempts.get(body_sha, 0)
        self.attempts[body_sha] = n + 1
        if n < len(scripted):
            return n, scripted[n] or None
        if not self.faults or self.rate <= 0 or self.injected.get(body_sha, 0) >= self.max_per_body:
            return n, None
        h = hashlib.sha256(f"{self.seed}:{body_sha}:{n}".encode()).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        if u >= self.rate:
            return n, None
        self.injected[body_sha] = self.injected.get(body_sha, 0) + 1
        return n, self.faults[int.from_bytes(h[8:12], "big") % len(self.faults)]


class Server:
    def __init__(
        self,
        *,
        responder: Responder,
        latency_ms: float,
        faults: FaultPlan,
        retry_after: float,
        hang_s: float,
        log: IO[str] | None,
        rules: list[dict[str, Any]] | None = None,
        usage: bool = True,
        drip_s: float = 1.0,
    ) -> None:
        self.drip_s = drip_s
        self.responder = responder
        self.usage = usage
        self.rules = rules or []
        self.latency = latency_ms / 1000.0
        self.faults = faults
        self.retry_after = retry_after
        self.hang_s = hang_s
        self.log = log
        self.counter = 0
        # chat requests being handled now (arrived, not yet answered), in all and per model
        self.in_flight = 0
        self.in_flight_by_model: dict[str, int] = {}

    def _rule(self, body: dict[str, Any]) -> dict[str, Any] | None:
        text = last_user_message(body)
        return next((r for r in self.rules if str(r["match"]) in text), None)

    def _scripted_faults(self, body: dict[str, Any]) -> list[str]:
        text = last_user_message(body)
        for rule in self.rules:
            if str(rule["match"]) in text:
                return [str(f) for f in rule.get("faults", [])]
        return []

    def _log(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.log.flush()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "test-model", "object": "model", "owned_by": "x"}]}
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        seen: dict[str, str] = {}
        try:
            return await self._chat(request, seen)
        finally:
            self.in_flight -= 1
            if "model" in seen:
                self.in_flight_by_model[seen["model"]] -= 1

    async def _chat(self, request: web.Request, seen: dict[str, str]) -> web.StreamResponse:
        arrived = time.time()
        in_flight = self.in_flight
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            bad = _error(400, "request body is not a JSON object")
            self._log(
                {
                    "time": arrived,
                    "body_sha256": hashlib.sha256(raw).hexdigest(),
                    "prompt_head": "",
                    "model": None,
                    "attempt": 0,
                    "fault": None,
                    "status": 400,
                    "served": False,
                }
            )
            await _send(request, bad)
            return bad
        body_sha = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
        ).hexdigest()
        attempt, fault = self.faults.next(body_sha, self._scripted_faults(body))
        model = seen["model"] = str(body.get("model"))
        self.in_flight_by_model[model] = self.in_flight_by_model.get(model, 0) + 1
        record: dict[str, Any] = {
            "time": arrived,
            "body_sha256": body_sha,
            "prompt_head": last_user_message(body)[:200],
            "model": body.get("model"),
            "attempt": attempt,
            "fault": fault,
            "status": 200,
            "served": False,
            # chat requests being handled when this one arrived (itself included), in all and
            # of its model: the largest is the most the server was asked at once
            "in_flight": in_flight,
            "in_flight_model": self.in_flight_by_model[model],
        }
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        resp: web.StreamResponse
        try:
            if fault == "hang":
                return await self._hang(request, record)
            injected = self._injected(fault)
            if injected is not None:
                resp = injected
            elif fault == "malformed":
                resp = web.Response(
                    status=200,
                    text='{"id": "chatcmpl-broken", "choices": [',
                    content_type=("application/json"),
                )
            elif not isinstance(body.get("messages"), list) or not body.get("model"):
                resp = _error(400, "'model' and 'messages' are required")
            else:
                rule = self._rule(body) or {}
                try:
                    content = self.responder(body)
                except ScriptedStatus as e:
                    resp = _error(e.status, e.message)
                else:
                    finish = str(rule.get("finish_reason", "stop"))
                    limit = body.get("max_tokens")
                    if isinstance(limit, int) and n_tokens(content) > limit:
                        # as a real server does: the answer ends at max_tokens
                        content, finish = cut_to(content, limit), "length"
                    if fault == "truncated":
                        content, finish = content[: len(content) // 2], "length"
                    answer = self._completion(body, content, finish)
                    if "reply" in rule and rule["reply"] is None:  # a message without content
                        answer["choices"][0]["message"]["content"] = None
                    resp = web.json_response(answer)
                    record["served"] = True
                    record["prompt_tokens"] = prompt_tokens(body)
                    record["completion_tokens"] = n_tokens(content)
                    if fault == "drip":
                        return await self._drip(request, record, resp)
        except asyncio.CancelledError:
            if fault != "hang":
                record["status"] = 499
                self._log(record)
            raise
        return await self._answer(request, record, resp)

    async def _hang(self, request: web.Request, record: dict[str, Any]) -> web.StreamResponse:
        """A hung request: logged now (the client will have given up long before the answer)."""
        record["status"] = 504
        self._log(record)
        await asyncio.sleep(self.hang_s)
        resp = _error(504, "hung")
        with contextlib.suppress(ConnectionError, RuntimeError, OSError):
            await _send(request, resp)
        return resp

    async def _drip(
        self, request: web.Request, record: dict[str, Any], resp: web.Response
    ) -> web.StreamResponse:
        """A valid answer sent one byte every `drip_s` seconds (logged when it starts)."""
        data = resp.body if isinstance(resp.body, bytes) else b""
        record["status"] = resp.status
        self._log(record)
        out = web.StreamResponse(status=resp.status, headers={"Content-Type": "application/json"})
        out.content_length = len(data)
        with contextlib.suppress(ConnectionError, RuntimeError, OSError):
            await out.prepare(request)
            for i in range(len(data)):
                await out.write(data[i : i + 1])
                await asyncio.sleep(self.drip_s)
            await out.write_eof()
        return out

    def _injected(self, fault: str | None) -> web.Response | None:
        """The error answer of an injected 429 or 500 (None for any other fault)."""
        if fault == "429":
            resp = _error(429, "rate limited")
            resp.headers["Retry-After"] = _fmt_seconds(self.retry_after)
            return resp
        if fault == "500":
            return _error(500, "injected server error")
        return None

    async def _answer(
        self, request: web.Request, record: dict[str, Any], resp: web.StreamResponse
    ) -> web.StreamResponse:
        record["status"] = resp.status
        # logged before the answer leaves, so that no client can hold an answer whose log line
        # is not written yet (a test reads the log right after its client returns)
        self._log(record)
        with contextlib.suppress(ConnectionError, RuntimeError, OSError):
            await _send(request, resp)  # the client may have gone away (timed out, killed)
        return resp

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """`/v1/embeddings`: a deterministic vector per input (character bigrams hashed into
        EMBED_DIM dimensions, so texts that share wording are close), with the same fault plan
        and log as chat (the log's `prompt_head` is the first input, `n_inputs` the count)."""
        arrived = time.time()
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            bad = _error(400, "request body is not a JSON object")
            await _send(request, bad)
            return bad
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        body_sha = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
        ).hexdigest()
        attempt, fault = self.faults.next(body_sha, [])
        record: dict[str, Any] = {
            "time": arrived,
            "body_sha256": body_sha,
            "prompt_head": str(inputs[0])[:200] if isinstance(inputs, list) and inputs else "",
            "n_inputs": len(inputs) if isinstance(inputs, list) else 0,
            "model": body.get("model"),
            "attempt": attempt,
            "fault": fault,
            "status": 200,
            "served": False,
        }
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        resp: web.StreamResponse
        if fault == "hang":
            return await self._hang(request, record)
        injected = self._injected("500" if fault == "truncated" else fault)
        if injected is not None:
            resp = injected
        elif fault == "malformed":
            resp = web.Response(status=200, text='{"data": [', content_type="application/json")
        elif (
            not isinstance(inputs, list)
            or not inputs
            or not all(isinstance(t, str) for t in inputs)
            or not body.get("model")
        ):
            resp = _error(400, "'model' and a non-empty 'input' list of strings are required")
        elif any("garbage-embedding" in t for t in inputs):
            resp = web.json_response({"object": "list", "data": [{"embedding": "nope"}]})
        else:
            data = [
                {"object": "embedding", "index": i, "embedding": text_vector(t)}
                for i, t in enumerate(inputs)
            ]
            pt = sum(n_tokens(t) for t in inputs)
            resp = web.json_response(
                {
                    "object": "list",
                    "data": data,
                    "model": str(body["model"]),
                    "usage": {"prompt_tokens": pt, "total_tokens": pt},
                }
            )
            record["served"] = True
            if fault == "drip":
                return await self._drip(request, record, resp)
        return await self._answer(request, record, resp)

    async def rerank(self, request: web.Request) -> web.StreamResponse:
        """`/v1/rerank` (Cohere's form, as Jina, vLLM, TEI and llama.cpp's server take it): the
        documents scored by the cosine of their `text_vector` with the query's, best first,
        `top_n` of them, with the same fault plan and log as chat (`prompt_head` is the query,
        `n_inputs` the number of documents). A query holding `garbage-rerank` gets an index
        out of range."""
        arrived = time.time()
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            bad = _error(400, "request body is not a JSON object")
            await _send(request, bad)
            return bad
        query, docs = body.get("query"), body.get("documents")
        body_sha = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
        ).hexdigest()
        attempt, fault = self.faults.next(body_sha, [])
        record: dict[str, Any] = {
            "time": arrived,
            "body_sha256": body_sha,
            "prompt_head": str(query)[:200],
            "n_inputs": len(docs) if isinstance(docs, list) else 0,
            "model": body.get("model"),
            "attempt": attempt,
            "fault": fault,
            "status": 200,
            "served": False,
        }
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        resp: web.StreamResponse
        if fault == "hang":
            return await self._hang(request, record)
        injected = self._injected("500" if fault == "truncated" else fault)
        if injected is not None:
            resp = injected
        elif fault == "malformed":
            resp = web.Response(status=200, text='{"results": [', content_type="application/json")
        elif (
            not isinstance(query, str)
            or not isinstance(docs, list)
            or not docs
            or not all(isinstance(d, str) for d in docs)
            or not body.get("model")
        ):
            resp = _error(400, "'model', a 'query' and a non-empty 'documents' list are required")
        elif "garbage-rerank" in query:
            resp = web.json_response({"results": [{"index": len(docs), "relevance_score": 1.0}]})
        else:
            q = text_vector(query)
            scores = [sum(a * b for a, b in zip(q, text_vector(d), strict=True)) for d in docs]
            order = sorted(range(len(docs)), key=lambda i: (-scores[i], i))
            top_n = body.get("top_n")
            if isinstance(top_n, int) and top_n > 0:
                order = order[:top_n]
            pt = n_tokens(query) * len(docs) + sum(n_tokens(d) for d in docs)
            resp = web.json_response(
                {
                    "model": str(body["model"]),
                    "results": [{"index": i, "relevance_score": scores[i]} for i in order],
                    "usage": {"prompt_tokens": pt, "total_tokens": pt},
                }
            )
            record["served"] = True
            if fault == "drip":
                return await self._drip(request, record, resp)
        return await self._answer(request, record, resp)

    def _completion(self, body: dict[str, Any], content: str, finish: str) -> dict[str, Any]:
        self.counter += 1
        pt, ct = prompt_tokens(body), n_tokens(content)
        return {
            "id": f"chatcmpl-test{self.counter}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model")),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ],
            **(
                {"usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}}
                if self.usage
                else {}
            ),
        }


def _fmt_seconds(s: float) -> str:
    return str(int(s)) if float(s).is_integer() else f"{s:g}"


def _error(status: int, message: str) -> web.Response:
    kind = "rate_limit_error" if status == 429 else "server_error" if status >= 500 else "invalid"
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


async def _send(request: web.Request, resp: web.StreamResponse) -> None:
    """Send the response now, inside the handler (errors of a vanished client stay here)."""
    await resp.prepare(request)
    await resp.write_eof()


async def serve(args: argparse.Namespace) -> None:
    global _tokenizer
    _tokenizer = args.tokenizer
    log = Path(args.log).open("a", encoding="utf-8") if args.log else None  # noqa: SIM115
    script = Path(args.script) if args.script else None
    responder = load_responder(args.responder, script)
    rules = load_rules(script) if script is not None else []
    faults = [f.strip() for f in args.faults.split(",") if f.strip()] if args.faults else []
    plan = FaultPlan(args.fault_rate, faults, args.seed, args.max_faults_per_request)
    server = Server(
        responder=responder,
        latency_ms=args.latency_ms,
        faults=plan,
        retry_after=args.retry_after,
        hang_s=args.hang_s,
        log=log,
        rules=rules,
        usage=not args.no_usage,
        drip_s=args.drip_s,
    )
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/embeddings", server.embeddings)
    app.router.add_post("/v1/rerank", server.rerank)
    app.router.add_get("/v1/models", server.models)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    if args.port_file:
        pf = Path(args.port_file)
        tmp = pf.with_name(pf.name + ".tmp")
        tmp.write_text(str(port), encoding="utf-8")
        tmp.replace(pf)
    print(f"test server listening on http://{args.host}:{port}/v1", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    if log is not None:
        log.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.testing.server",
        description="OpenAI-compatible chat-completions test server (127.0.0.1).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--port-file", help="write the port here once listening")
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--responder", help="module:function, a callable (body: dict) -> str")
    p.add_argument("--script", help="JSON list of rules {match[, reply][, status][, faults]}")
    p.add_argument("--fault-rate", type=float, default=0.0)
    p.add_argument("--faults", default="", help=f"comma-separated subset of {','.join(FAULTS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of a 429 (s)")
    p.add_argument("--hang-s", type=float, default=30.0)
    p.add_argument("--drip-s", type=float, default=1.0, help="seconds between a drip's bytes")
    p.add_argument("--max-faults-per-request", type=int, default=2)
    p.add_argument("--log", help="append one JSON line per request to this file")
    p.add_argument("--no-usage", action="store_true", help="answers without a usage object")
    p.add_argument(
        "--tokenizer", choices=TOKENIZERS, default="chars", help="how usage counts tokens"
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    asyncio.run(serve(args))


class TestServer:
    """Start the test server in a subprocess for the duration of a ``with`` block.

    >>> with TestServer(latency_ms=5) as srv:  # doctest: +SKIP
    ...     srv.base_url  # 'http://127.0.0.1:PORT/v1'
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        latency_ms: float = 0.0,
        responder: str | None = None,
        script: Path | list[dict[str, Any]] | None = None,
        fault_rate: float = 0.0,
        faults: Sequence[str] = (),
        seed: int = 0,
        retry_after: float = 1.0,
        hang_s: float = 30.0,
        max_faults_per_request: int = 2,
        log_path: Path | None = None,
        cwd: Path | None = None,
        startup_timeout_s: float = 30.0,
        usage: bool = True,
        tokenizer: str = "chars",
        drip_s: float = 1.0,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="lfbench-testserver-")
        tmp = Path(self._tmp.name)
        self.log_path = Path(log_path) if log_path is not None else tmp / "requests.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        self._port_file = tmp / "port"
        args = [
            sys.executable,
            "-m",
            "pipeline.testing.server",
            "--port",
            "0",
            "--port-file",
            str(self._port_file),
            "--latency-ms",
            str(latency_ms),
            "--fault-rate",
            str(fault_rate),
            "--faults",
            ",".join(faults),
            "--seed",
            str(seed),
            "--retry-after",
            str(retry_after),
            "--hang-s",
            str(hang_s),
            "--drip-s",
            str(drip_s),
            "--max-faults-per-request",
            str(max_faults_per_request),
            "--log",
            str(self.log_path),
            "--tokenizer",
            tokenizer,
        ]
        if not usage:
            args.append("--no-usage")
        if responder:
            args += ["--responder", responder]
        if script is not None:
            if not isinstance(script, Path):
                spath = tmp / "script.json"
                spath.write_text(json.dumps(script), encoding="utf-8")
                script = spath
            args += ["--script", str(script)]
        self._args = args
        self._cwd = cwd
        self._startup_timeout = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> TestServer:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(self._cwd) if self._cwd else "", root, env.get("PYTHONPATH", "")] if p
        )
        self._stderr = Path(self._tmp.name) / "stderr.txt"
        with self._stderr.open("wb") as err:
            self._proc = subprocess.Popen(
                self._args, cwd=self._cwd, env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + self._startup_timeout
        while not self._port_file.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"test server exited ({self._proc.returncode}):\n"
                    + self._stderr.read_text(errors="replace")
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("test server did not start in time")
            time.sleep(0.02)
        self.port = int(self._port_file.read_text(encoding="utf-8"))
        return self

    def log(self) -> list[dict[str, Any]]:
        """The request log so far (a torn last line is left out)."""
        out: list[dict[str, Any]] = []
        if not self.log_path.exists():
            return out
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
        return out

    def max_in_flight(self, since: int = 0, model: str | None = None) -> int:
        """The most chat requests the server was handling at once (of `model` only, if given),
        from its log's `since`-th line on."""
        field = "in_flight" if model is None else "in_flight_model"
        return max(
            (
                int(r.get(field) or 0)
                for r in self.log()[since:]
                if model is None or r.get("model") == model
            ),
            default=0,
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    # Run as the importable module, not as __main__: a responder module that raises
    # `pipeline.testing.server.ScriptedStatus` must raise the class this server catches.
    from pipeline.testing.server import main as _main

    _main()
