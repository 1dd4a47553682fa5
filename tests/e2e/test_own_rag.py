"""Your own RAG pipeline end to end, as the README walks through it (real DVC, real HTTP to the
test server, real MLflow): retrievers of yours (an embeddings endpoint, a reranker over bm25, the
README's Python retriever) in all four benchmarks, and the README's RAG system as a model of
SummHay, Long²RAG and CRUX; then its answers replayed as an `outputs` model give the same
metrics, two retrievers are compared by name, a forced re-run of a retrieval stage sends
nothing, and the MLflow runs and the report name the retrievers. The DAG (four benchmarks, 57
stages) runs side by side (`lfbench repro`: what `dvc repro` writes, test_parallel_pipeline.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.testing.server import TestServer
from tests.conftest import ROOT, keep_builtin_entries, make_project, run, slice_summhay

pytestmark = pytest.mark.slow


def readme_code(after: str) -> str:
    """The first ```python block of the README after the line holding `after`."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(after)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, after
    return m.group(1)


def _configure(proj: Path, base_url: str) -> dict[str, Any]:
    (proj / "inputs" / "retrievers" / "tfidf.py").write_text(
        readme_code("`inputs/retrievers/tfidf.py`"), encoding="utf-8"
    )
    system = readme_code("`inputs/systems/my_rag.py`")
    assert len(system.splitlines()) <= 30
    (proj / "inputs" / "systems" / "my_rag.py").write_text(system, encoding="utf-8")
    p = yaml.safe_load((proj / "params.yaml").read_text(encoding="utf-8"))
    p["runtime"] = "local"
    models, judges = keep_builtin_entries(p)
    slice_summhay(p)
    models["published"], judges["published-gpt-4o"] = (
        p["models"]["published"],
        p["judges"]["published-gpt-4o"],
    )
    endpoint = {"base_url": base_url, "api_key_env": None}
    p["retrievers"] = {
        "emb": {"provider": "embeddings", "model": "emb", "window_tokens": 200, **endpoint},
        "rr": {"provider": "rerank", "model": "rr", "over": "bm25", "top_k": 8, **endpoint},
        "tfidf": {"provider": "python", "entry": "tfidf:score", "options": {"ngram_max": 2}},
    }
    models["lead"] = dict(p["models"]["lead"], settings=["bm25", "emb", "rr", "tfidf"])
    models["my-rag"] = {
        "provider": "python",
        "entry": "my_rag:answer",
        "options": {"k": 3, "base_url": base_url, "model": "test"},
    }
    s = p["summhay"]
    s.update(models=["published", "lead", "my-rag"], judges=["published-gpt-4o", "local"])
    judges["local"]["train"]["haystacks"] = ["news1"]  # a small training run, as elsewhere
    s["retrievers"] = ["emb", "rr", "tfidf"]
    l2 = p["long2rag"]
    l2.update(settings=["rag_512", "rag_512@emb", "rag_512@tfidf"], retrievers=["emb", "tfidf"])
    l2.update(models=["lead", "my-rag"], judges=["l2r-overlap"])
    cx = p["crux"]
    cx.update(retrievers=["emb", "rr", "tfidf"], models=["crux-contexts", "my-rag"])
    models["crux-contexts"] = dict(
        models["crux-contexts"], retrievers=["zstar", "bm25", "emb", "rr", "tfidf"]
    )
    p["crud_rag"]["retrievers"] = ["emb"]
    p["crud_rag"]["grid"]["retriever"] = ["bm25", "emb"]
    p["models"], p["judges"] = models, judges
    return p


def _write(proj: Path, p: dict[str, Any]) -> None:
    (proj / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False), encoding="utf-8")


def _rows(proj: Path, bench: str, model: str) -> list[dict[str, Any]]:
    rows = json.loads((proj / "metrics" / f"{bench}.json").read_text())["rows"]
    return [r for r in rows if r["model"] == model]


def _same(a: dict[str, Any]) -> str:
    """A row as text, the replaying entry's name written as the system's."""
    return json.dumps(a, sort_keys=True).replace("my-rag-out", "my-rag")


def test_your_retrievers_and_rag_system_through_every_benchmark(
    tmp_path: Path, mirror: Path
) -> None:
    proj = make_project(tmp_path / "proj", mirror, shared_cache=True)
    with TestServer() as srv:
        p = _configure(proj, srv.base_url)
        _write(proj, p)
        run(["lfbench", "check"], proj)
        run(["lfbench", "repro", "--jobs", "2"], proj)

        # every benchmark has rows made from your retrievers and your system
        assert {r["setting"] for r in _rows(proj, "summhay", "lead")} == {
            "bm25",
            "emb",
            "rr",
            "tfidf",
        }
        assert [r["setting"] for r in _rows(proj, "summhay", "my-rag")] == ["own"]
        assert {r["setting"] for r in _rows(proj, "long2rag", "lead")} == {
            "rag_512", "rag_512@emb", "rag_512@tfidf"
        }  # fmt: skip
        crux = {r["retriever"] for r in _rows(proj, "crux", "crux-contexts")}
        assert {"emb", "rr", "tfidf"} <= crux
        assert {r["retriever"] for r in _rows(proj, "crux", "my-rag")} == {"my-rag"}
        assert any(r["setting"].startswith("emb-c") for r in _rows(proj, "crud_rag", "lead"))

        # the system's answers replayed from an outputs file: the same metrics
        files = {}
        for bench in ("summhay", "long2rag", "crux"):
            out = f"inputs/systems/my-rag.{bench}.jsonl"
            run(["lfbench", "export", "outputs", "--benchmark", bench, "--model", "my-rag",
                 "--out", out], proj)  # fmt: skip
            files[bench] = out
        p["models"]["my-rag-out"] = {"provider": "outputs", "files": files}
        for bench in ("summhay", "long2rag", "crux"):
            p[bench]["models"].append("my-rag-out")
        _write(proj, p)
        chat_requests = sum(1 for r in srv.log() if r.get("n_inputs") is None)
        run(["lfbench", "repro", "--jobs", "2"], proj)
        assert sum(1 for r in srv.log() if r.get("n_inputs") is None) == chat_requests
        for bench in ("summhay", "long2rag", "crux"):
            a = [_same(r | {"model": "x"}) for r in _rows(proj, bench, "my-rag")]
            b = [_same(r | {"model": "x"}) for r in _rows(proj, bench, "my-rag-out")]
            assert a and a == b, bench

        # a forced re-run of a retrieval stage sends nothing
        before = len(srv.log())
        run(["dvc", "repro", "-f", "summhay-retrieve@emb"], proj)
        assert len(srv.log()) == before
        usage = json.loads((proj / "retrievals/usage/summhay/emb.json").read_text())
        assert usage["requests_sent"] == 0 and usage["cache_hits"] == usage["items"] > 0

    # two retrievers compared by name (paired over the queries both contexts cover)
    cmp = run(
        ["lfbench", "compare", "--benchmark", "crux", "tfidf", "emb", "--cutoff", "10",
         "--judge", "crux-labels", "--min-items", "2", "--json"], proj,
    )  # fmt: skip
    res = json.loads(cmp.stdout)
    assert "coverage" in json.dumps(res)

    # the MLflow runs name the retriever and the system's code
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{proj / 'mlruns' / 'mlflow.db'}")

    def current(bench: str) -> list[Any]:
        exp = client.get_experiment_by_name(bench)
        assert exp is not None, bench
        where = "tags.`lfbench.current` = 'true'"
        return list(client.search_runs([exp.experiment_id], where, max_results=500))

    emb = [r for r in current("summhay") if r.data.tags.get("retriever.name") == "emb"]
    assert len(emb) == 1, [r.data.tags.get("setting") for r in current("summhay")]
    tags = emb[0].data.tags
    assert tags["retriever.provider"] == "embeddings" and tags["retriever.model"] == "emb"
    rag = [r for r in current("long2rag") if r.data.tags.get("model.entry") == "my-rag"]
    assert rag and all(r.data.tags["model.entry_point"] == "my_rag:answer" for r in rag)
    assert all(len(r.data.tags["model.code_sha"]) == 16 for r in rag)

    # the report sets the retrievers side by side
    run(["lfbench", "report"], proj)
    report = (proj / "reports" / "report.md").read_text()
    part = report.split("## Retrievers side by side", 1)[1].split("\n## ", 1)[0]
    for name in ("emb", "tfidf", "rr", "my-rag"):
        assert f"| {name} | CRUX |" in part
    assert "| emb | SummHay |" in part and "| my-rag | Long²RAG |" in part

    # nothing left to do
    status = run(["lfbench", "plan"], proj).stdout
    assert "every stage is up to date" in status
