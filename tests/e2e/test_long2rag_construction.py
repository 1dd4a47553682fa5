"""Key-point construction against the test server (real HTTP) when aggregation keeps breaking the
exactly-one rule: one repair call, then the question fails (`error`) or keeps its points
unmerged (`unmerged`); and the response cache makes a second pass free."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.benchmarks.long2rag import construction
from pipeline.benchmarks.long2rag.params import Long2ragConstruct
from pipeline.benchmarks.long2rag.schema import L2Document, Question
from pipeline.core.config import OpenAIJudge
from pipeline.core.prompts import load_prompt
from pipeline.stages.construct import StageAsker
from pipeline.testing.server import TestServer
from tests.conftest import ROOT


def _prompts() -> construction.Prompts:
    return construction.Prompts(
        **{
            name: load_prompt(f"pipeline/benchmarks/long2rag/prompts/{name}.txt", ROOT)
            for name in ("decompose", "extract", "aggregate", "filter", "repair")
        }
    )


def _llm(spec: OpenAIJudge, root: Path) -> tuple[construction.Llm, StageAsker]:
    """The benchmark's side (Llm) over the stage layer's asker (cache and journal under root)."""
    asker = StageAsker("builder", spec, "long2rag-construct", root)
    return construction.Llm(asker, _prompts().repair, spec.json_mode), asker


def _question() -> Question:
    docs = [
        L2Document(
            doc_id=f"d{i}", text=f"Point A of doc {i}. Point B of doc {i}. Point C of doc {i}."
        )
        for i in range(1, 6)
    ]
    return Question(item_id="q1", question="What?", domain="x", category="y", documents=docs)


@pytest.mark.parametrize("mode", ["error", "unmerged"])
def test_check_failure_modes(tmp_path: Path, mode: str) -> None:
    cfg = Long2ragConstruct(rounds=1, filter=False, on_check_failure=mode)  # type: ignore[arg-type]
    with TestServer(
        responder="tests.e2e.long2rag_responder:bad_merger", log_path=tmp_path / "s.log", cwd=ROOT
    ) as srv:
        spec = OpenAIJudge(
            provider="openai", base_url=srv.base_url, model="builder", api_key_env=None
        )
        llm, _ = _llm(spec, tmp_path)
        out, failures = construction.construct_key_points([_question()], cfg, _prompts(), llm, "b")
        n_requests = len(srv.log())
        # a second pass is served from the response cache
        llm2, asker2 = _llm(spec, tmp_path)
        construction.construct_key_points([_question()], cfg, _prompts(), llm2, "b")
        assert len(srv.log()) == n_requests
    assert asker2.report is not None and asker2.report.requests_sent == 0
    # 5 extraction calls (2 points each), 1 aggregation, 1 repair
    assert n_requests == 5 + 1 + 1
    if mode == "error":
        assert out == [] and failures[0][0] == "q1"
        assert "[1] are in more than one merged point" in failures[0][1]
    else:
        assert failures == []
        (q,) = out
        assert len(q.key_points) == 10 and q.meta["merged_points"] == 10
        assert [k.doc_id for k in q.key_points[:3]] == ["d1", "d1", "d2"]
        assert q.key_points[0].text == "Point A of doc 1."
