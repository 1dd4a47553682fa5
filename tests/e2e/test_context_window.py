"""The README's local model on a server with an 8,192-token context (issue 36, point 18).

SummHay's RAG prompt is some 15,200 tokens: a server started with `--n_ctx 8192` refused the
README example's first request (HTTP 400). A model entry now declares `context_window`: SummHay
packs that model's RAG contexts to fit it, `lfbench check` and `lfbench plan` name the prompts
that still cannot fit (the whole haystack, `full`) before any request, and the example runs.
The test server stands in for llama.cpp: it refuses, as llama.cpp's server does, a request
whose prompt (cl100k_base) and max_tokens exceed 8,192 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import ScriptedStatus, last_user_message
from tests.conftest import ROOT, run

pytestmark = pytest.mark.slow


@pytest.fixture
def project(shared_project: Path) -> Path:
    """This module's projects share the session's DVC cache (`conftest.share_dvc_cache`): the
    stages every sliced DAG holds run once, not in each test."""
    return shared_project


N_CTX = 8192


def llama_8192(body: dict[str, Any]) -> str:
    """A server whose context holds 8,192 tokens, prompt and answer together."""
    from pipeline.retrieval.tokens import count_tokens

    need = count_tokens(last_user_message(body)) + int(body.get("max_tokens") or 0)
    if need > N_CTX:
        raise ScriptedStatus(400, f"Requested tokens ({need}) exceed context window of {N_CTX}")
    return "- The documents agree on the main point. [1]"


def _local(proj: Path, base_url: str, **entry: Any) -> None:
    """The README's `local` model entry (llama.cpp example), on one subtopic."""
    path = proj / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    params["runtime"] = "local"
    params["models"]["local"] = {
        "provider": "openai",
        "base_url": base_url,
        "model": "local",
        "api_key_env": None,
        "settings": ["oracle", "bm25"],
        "max_tokens": 512,
        "max_concurrency": 1,
        "timeout_s": 900,
        "slice": {"summhay": {"items": ["news1"], "first": 1}},
        **entry,
    }
    if "local" not in params["summhay"]["models"]:
        params["summhay"]["models"].append("local")
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def test_the_readme_example_fits_an_8192_token_server(project: Path, tmp_path: Path) -> None:
    from pipeline.testing.server import TestServer

    log = tmp_path / "server.log"
    with TestServer(responder="tests.e2e.test_context_window:llama_8192", log_path=log,
                    cwd=ROOT, tokenizer="cl100k") as srv:  # fmt: skip
        # the whole haystack cannot fit: check and plan say so before any request
        _local(project, srv.base_url, context_window=N_CTX, settings=["oracle", "bm25", "full"])
        run(["dvc", "repro", "summhay-construct"], project)
        check = run(["lfbench", "check"], project).stdout
        line = next(x for x in check.splitlines() if x.startswith("summhay-generate@local:"))
        assert "1 of 3 requests will not fit the context window (8,192 tokens" in line, check
        assert "news1/" in line and "|full|local|0" in line
        assert "2 of 3 prompts have their documents packed to" in line
        plan = json.loads(run(["lfbench", "plan", "--json"], project).stdout)
        gen = next(r for r in plan["rows"] if r["stage"] == "summhay-generate@local")
        assert gen["requests"] == 3 and gen["over_context"] == 1
        assert plan["totals"]["over_context"] == 1
        assert srv.log() == []  # nothing was sent

        # the example as the README writes it: oracle and bm25, context_window 8192
        _local(project, srv.base_url, context_window=N_CTX)
        assert "all 2 requests fit" in run(["lfbench", "check"], project).stdout
        run(["dvc", "repro", "summhay-generate@local"], project)
        served = srv.log()
        assert [r["status"] for r in served] == [200, 200], served
        gens = [json.loads(x) for x in (project / "generations/summhay/local.jsonl").open()]
        assert all(g["status"] == "ok" for g in gens)
        budgets = {g["meta"]["context_budget"] for g in gens}
        assert len(budgets) == 1 and 1000 < budgets.pop() < 7000
        assert all(r["prompt_tokens"] + 512 <= N_CTX for r in served)

        # without the declaration, the same server refuses the first request (what the
        # README's example met before)
        _local(project, srv.base_url)
        failed = run(["dvc", "repro", "summhay-generate@local"], project, check=False)
        assert failed.returncode != 0
        refused = [r for r in srv.log()[len(served) :] if r["status"] == 400]
        assert refused, srv.log()
