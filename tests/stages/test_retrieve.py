"""The retrieval stage (`<benchmark>-retrieve@<entry>`) with each provider, against the test
server over real HTTP: rankings, the response cache and journal, faults, the user's code and
run files, and the errors that name what is wrong."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import registry
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.params import validate_params
from pipeline.llm.retrieval import RetrievalEndpointError
from pipeline.stages.construct import construct
from pipeline.stages.retrieve import retrieve
from pipeline.testing.server import TestServer, text_vector

ROOT = Path(__file__).resolve().parents[2]
BENCH = registry.get("summhay")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, mirror: Path) -> Path:
    """SummHay's news1, its first 2 subtopics (the queries every test ranks)."""
    tmp = tmp_path_factory.mktemp("ds")
    out = tmp / "summhay.jsonl"
    construct(BENCH, _params({}, []), mirror / "summhay", out, ROOT)
    return out


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project of its own (the code linked in), with its own response cache."""
    (tmp_path / "pipeline").symlink_to(ROOT / "pipeline")
    (tmp_path / "inputs" / "retrievers").mkdir(parents=True)
    monkeypatch.setenv("LFBENCH_CACHE_URL", f"sqlite:///{tmp_path / 'cache.sqlite'}")
    return tmp_path


def _params(
    retrievers: dict[str, Any],
    listed: list[str],
    haystacks: tuple[str, ...] = ("news1",),
    subtopics: int = 2,
) -> Any:
    return validate_params(
        {
            "models": {"lead": {"provider": "baseline", "kind": "lead"}},
            "judges": {"local": {"provider": "local"}},
            "retrievers": retrievers,
            "summhay": {
                "haystacks": list(haystacks),
                "subtopics": subtopics,
                "lengths": {"haystacks": []},
                "models": ["lead"],
                "judges": ["local"],
                "retrievers": listed,
            },
        },
        benchmarks=["summhay"],
    )


Run = Callable[..., tuple[dict[str, list[list[Any]]], dict[str, Any]]]


@pytest.fixture
def run(root: Path, dataset: Path, mirror: Path) -> Run:
    def go(name: str, entry: dict[str, Any]) -> tuple[dict[str, list[list[Any]]], dict[str, Any]]:
        params = _params({name: entry}, [name])
        out = root / "retrievals" / "summhay" / f"{name}.jsonl"
        retrieve(BENCH, params, name, dataset, mirror / "summhay", out, root)
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        usage_file = root / "retrievals" / "usage" / "summhay" / f"{name}.json"
        usage = json.loads(usage_file.read_text(encoding="utf-8"))
        return {r["query_id"]: r["ranking"] for r in rows}, usage

    return go


def _queries(dataset: Path, params: Any = None) -> list[Any]:
    from pipeline.stages.common import context, read_dataset

    params = params or _params({}, [])
    assert BENCH.retrieval is not None
    ctx = context(BENCH, params, ROOT)
    return BENCH.retrieval.queries(ctx, read_dataset(BENCH, dataset), "x")


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _expected_embeddings(dataset: Path, window: int, params: Any = None) -> dict[str, list[str]]:
    """The ranking the test server's vectors give, computed here: each passage scores its best
    window of `window` cl100k tokens."""
    from pipeline.retrieval.windows import cut

    out = {}
    for q in _queries(dataset, params):
        qv = text_vector(q.text)
        scores = []
        for ws in cut([p.text for p in q.passages], window, "cl100k_base"):
            scores.append(
                max(sum(a * b for a, b in zip(qv, text_vector(w), strict=True)) for w in ws)
            )
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        out[q.id] = [q.passages[i].id for i in order]
    return out


def _emb_entry(base_url: str, model: str, **options: Any) -> dict[str, Any]:
    """An `embeddings` retriever entry on a test server (no key)."""
    return {
        "provider": "embeddings",
        "base_url": base_url,
        "model": model,
        "api_key_env": None,
        **options,
    }


def _served(srv: TestServer) -> list[dict[str, Any]]:
    return [r for r in srv.log() if r.get("served")]


def test_an_embeddings_retriever_ranks_by_cosine_and_sends_nothing_twice(
    run: Run, dataset: Path, root: Path
) -> None:
    with TestServer() as srv:
        entry = _emb_entry(srv.base_url, "emb-a", window_tokens=300, batch_size=16)
        rankings, usage = run("emb", entry)
        sent = len(srv.log())
    expected = _expected_embeddings(dataset, 300)
    assert {q: [p for p, _ in r] for q, r in rankings.items()} == expected
    assert usage["requests_sent"] == sent > 0
    assert usage["cache_misses"] == usage["items"] and usage["input_tokens"] > 0
    assert usage["retriever"]["provider"] == "embeddings"
    assert usage["retriever"]["model"] == "emb-a"
    # a second run, and another server of the same model: everything from the cache
    with TestServer() as other:
        again, usage2 = run("emb", {**entry, "base_url": other.base_url})
        assert other.log() == []
    assert again == rankings
    assert usage2["requests_sent"] == 0 and usage2["cache_hits"] == usage["items"]
    # the journal was cleared once the rankings were written
    assert not list((root / ".lfbench" / "journal").glob("*emb*"))


def test_two_haystacks_whose_passages_share_ids_are_each_ranked_over_their_own(
    root: Path, mirror: Path, tmp_path: Path
) -> None:
    """SummHay's passage ids are positions in each haystack ("0".."99" in news1 and in conv1):
    a conv1 query is ranked over conv1's documents, not over news1's with the same ids."""
    from pipeline.stages.retrieve import _embeddings

    params = _params({}, [], haystacks=("news1", "conv1"), subtopics=1)
    ds = tmp_path / "two.jsonl"
    construct(BENCH, params, mirror / "summhay", ds, ROOT)
    queries = _queries(ds, params)
    assert len(queries) == 2 and queries[0].passages[0].id == queries[1].passages[0].id
    assert queries[0].passages[0].text != queries[1].passages[0].text
    with TestServer() as srv:
        entry = _emb_entry(srv.base_url, "emb-a", window_tokens=300, batch_size=64)
        spec = _params({"emb": entry}, ["emb"]).retrievers["emb"]
        rankings, _ = _embeddings(spec, queries, root, "summhay-retrieve@emb")
    got = {q.id: [p for p, _ in r] for q, r in zip(queries, rankings, strict=True)}
    assert got == _expected_embeddings(ds, 300, params)


def test_faults_cost_retries_not_answers(run: Run, dataset: Path) -> None:
    """429s, 500s and malformed answers on 40% of requests: the same ranking, every text
    embedded in exactly one served request."""
    with TestServer(fault_rate=0.4, faults=("429", "500", "malformed"), retry_after=0.05) as srv:
        entry = _emb_entry(
            srv.base_url, "emb-faults", window_tokens=300, batch_size=8, max_retries=8
        )
        rankings, usage = run("embf", entry)
        log = srv.log()
    assert any(r["fault"] for r in log)
    served = [r for r in log if r["served"]]
    assert len({r["body_sha256"] for r in served}) == len(served) == usage["requests_sent"]
    assert {q: [p for p, _ in r] for q, r in rankings.items()} == _expected_embeddings(dataset, 300)


def test_an_unusable_embedding_answer_is_an_error_naming_the_endpoint(
    run: Run, root: Path, dataset: Path
) -> None:
    with TestServer() as srv:
        entry = _emb_entry(srv.base_url, "emb-bad", query_prefix="garbage-embedding ")
        with pytest.raises(
            RetrievalEndpointError, match=r"emb-bad at http://127\.0\.0\.1.*3 tries"
        ):
            run("embbad", entry)
    assert not (root / "retrievals" / "summhay" / "embbad.jsonl").exists()


def test_a_reranker_reorders_the_top_k_of_bm25_and_keeps_the_rest(run: Run, dataset: Path) -> None:
    from pipeline.retrieval.bm25 import bm25_scores

    with TestServer() as srv:
        entry = {
            "provider": "rerank",
            "base_url": srv.base_url,
            "model": "rr",
            "api_key_env": None,
            "over": "bm25",
            "top_k": 6,
            "price_per_1k_requests": 2.0,
        }
        rankings, usage = run("rr", entry)
    assert usage["requests_sent"] == 2 and usage["cost_usd"] == pytest.approx(0.004)
    for q in _queries(dataset):
        texts = [p.text for p in q.passages]
        s = bm25_scores(q.text, texts)
        base = sorted(range(len(texts)), key=lambda i: (-s[i], i))
        qv = text_vector(q.text)
        cos = {
            i: sum(a * b for a, b in zip(qv, text_vector(texts[i]), strict=True)) for i in base[:6]
        }
        head = sorted(base[:6], key=lambda i: (-cos[i], i))
        got = [p for p, _ in rankings[q.id]]
        assert got == [q.passages[i].id for i in head + base[6:]]
        assert all(score is None for _, score in rankings[q.id][6:])


def test_a_reranker_over_a_released_ranking_and_a_bad_answer(run: Run, tmp_path: Path) -> None:
    from pipeline.core.config import RerankRetriever
    from pipeline.llm.retrieval import RerankAsk, rerank

    with TestServer() as srv:
        entry = {
            "provider": "rerank",
            "base_url": srv.base_url,
            "model": "rr",
            "api_key_env": None,
            "over": "vector",
            "top_k": 3,
        }
        rankings, _ = run("rrv", entry)
        assert all(len(r) == 100 and r[3][1] is None for r in rankings.values())
        # an answer naming a document that was not sent: asked again twice, then an error
        spec = RerankRetriever.model_validate({**entry, "over": "bm25"})
        with pytest.raises(RetrievalEndpointError, match=r"3 tries: .*index 2 is not one of the 2"):
            rerank(
                spec,
                [RerankAsk("garbage-rerank please", ("a", "b"))],
                cache_path=tmp_path / "c.sqlite",
                journal_path=None,
                label="t",
            )
        assert sum(1 for r in srv.log() if "garbage" in r["prompt_head"]) == 3


def _write(root: Path, name: str, code: str) -> None:
    (root / "inputs" / "retrievers" / f"{name}.py").write_text(code, encoding="utf-8")


def test_a_python_retriever_scores_orders_or_pairs(run: Run, root: Path) -> None:
    _write(
        root,
        "mine",
        "def scores(query, passages, bonus=0.0):\n"
        "    return [len(p.text) % 7 + bonus for p in passages]\n"
        "def ids(query, passages):\n"
        "    return [p.id for p in passages][::-1][:5]\n"
        "def pairs(query, passages):\n"
        "    return [(p.id, 1.0 / (n + 1)) for n, p in enumerate(passages[:3])]\n",
    )
    by_score, usage = run(
        "py1", {"provider": "python", "entry": "mine:scores", "options": {"bonus": 1}}
    )
    ranking = next(iter(by_score.values()))
    values = [s for _, s in ranking]
    assert values == sorted(values, reverse=True) and all(1 <= v <= 7 for v in values)
    assert (
        usage["retriever"]["entry"] == "mine:scores" and len(usage["retriever"]["code_sha"]) == 16
    )
    by_ids, _ = run("py2", {"provider": "python", "entry": "mine:ids"})
    assert [len(r) for r in by_ids.values()] == [5, 5]
    assert all(s is None for r in by_ids.values() for _, s in r)
    by_pairs, _ = run("py3", {"provider": "python", "entry": "mine:pairs"})
    assert [s for _, s in next(iter(by_pairs.values()))] == [1.0, 0.5, 0.333333]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return [1.0, 2.0]", r"2 scores for \d+ passages"),
        ("return ['not-a-passage']", "not its passages"),
        ("return [passages[0].id, passages[0].id]", "returned twice"),
        ("return 'bm25'", "returned str"),
        ("return [float('nan')] * len(passages)", "not a finite number"),
        ("raise RuntimeError('index offline')", "RuntimeError: index offline"),
    ],
)
def test_a_python_retriever_that_answers_wrong_is_named_with_the_query(
    run: Run, root: Path, body: str, message: str
) -> None:
    _write(root, "wrong", f"def f(query, passages):\n    {body}\n")
    with pytest.raises(ConfigError, match=rf"retrievers\.pyw \(wrong:f\).*news1/.*{message}"):
        run("pyw", {"provider": "python", "entry": "wrong:f"})


def test_a_missing_module_or_package_says_what_to_do(run: Run, root: Path) -> None:
    with pytest.raises(ConfigError, match=r"no module 'absent'.*inputs/retrievers"):
        run("pym", {"provider": "python", "entry": "absent:f"})
    _write(root, "needs", "import lfbench_no_such_package_xyz\n\ndef f(q, p):\n    return []\n")
    with pytest.raises(
        ConfigError, match=r"imports 'lfbench_no_such_package_xyz'.*requirements-image\.in"
    ):
        run("pyn", {"provider": "python", "entry": "needs:f"})


def test_a_python_retriever_killed_mid_stage_resumes_from_its_journal(
    root: Path, dataset: Path, mirror: Path
) -> None:
    """The first query's ranking is journaled; a kill during the second loses it not: the
    re-run calls the retriever for the second query only."""
    calls = root / "calls.txt"
    _write(
        root,
        "slow",
        "import os, time\n"
        f"CALLS = {str(calls)!r}\n"
        "def f(query, passages):\n"
        "    with open(CALLS, 'a') as fh:\n"
        "        fh.write(query[:20] + '\\n')\n"
        "    if os.environ.get('SLOW') and sum(1 for _ in open(CALLS)) == 2:\n"
        "        time.sleep(60)\n"
        "    return [p.id for p in passages]\n",
    )
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.stages.test_retrieve import BENCH, _params\n"
        "from pipeline.stages.retrieve import retrieve\n"
        "params = _params({'slow': {'provider': 'python', 'entry': 'slow:f'}}, ['slow'])\n"
        "root = Path(sys.argv[1])\n"
        "retrieve(BENCH, params, 'slow', Path(sys.argv[2]), Path(sys.argv[3]),\n"
        "         root / 'retrievals' / 'summhay' / 'slow.jsonl', root)\n"
    )
    argv = [sys.executable, "-c", script, str(root), str(dataset), str(mirror / "summhay")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOW": "1"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        calls.exists() and len(calls.read_text().splitlines()) >= 2
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(calls.read_text().splitlines()) == 2
    env.pop("SLOW")
    subprocess.run(argv, cwd=ROOT, env=env, check=True)
    lines = calls.read_text().splitlines()
    assert len(lines) == 3 and lines[2] == lines[1]  # only the killed query was asked again


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


RUN = {"provider": "run", "files": {"summhay": "inputs/retrievers/mine.run"}}
RUN_LINES = """news1/{a} Q0 3 1 9.5 mine
news1/{a} Q0 1 2 9.5 mine
news1/{a} Q0 2 3 7 mine
news1/{b} Q0 5 1 1.25 mine
"""


def test_a_run_file_is_replayed_by_score_then_rank(run: Run, root: Path, dataset: Path) -> None:
    a, b = (q.id.split("/", 1)[1] for q in _queries(dataset))
    (root / "inputs" / "retrievers" / "mine.run").write_text(RUN_LINES.format(a=a, b=b))
    rankings, usage = run(
        "trec", {"provider": "run", "files": {"summhay": "inputs/retrievers/mine.run"}}
    )
    assert rankings[f"news1/{a}"] == [["3", 9.5], ["1", 9.5], ["2", 7.0]]
    assert rankings[f"news1/{b}"] == [["5", 1.25]]
    assert usage["retriever"]["file"] == "inputs/retrievers/mine.run"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s + "news1/{a} Q0 4 9\n", r"mine\.run:5.*expected 6 fields"),
        (lambda s: s + "news1/{a} Q0 4 x 1.0 mine\n", r"mine\.run:5.*is not a number"),
        (lambda s: s + "news9/zzz Q0 4 1 1.0 mine\n", r"mine\.run:5.*not one of this benchmark"),
        (lambda s: s + "news1/{a} Q0 999 4 1.0 mine\n", r"mine\.run:5.*'999' is not a passage"),
        (lambda s: s + "news1/{a} Q0 3 4 1.0 mine\n", r"mine\.run:5.*ranked twice"),
        (lambda s: s.split("news1/{b}")[0], r"mine\.run.*1 of the 2 queries have no line"),
    ],
)
def test_a_bad_run_file_is_refused_naming_file_and_line(
    run: Run, root: Path, dataset: Path, edit: Callable[[str], str], message: str
) -> None:
    a, b = (q.id.split("/", 1)[1] for q in _queries(dataset))
    (root / "inputs" / "retrievers" / "mine.run").write_text(edit(RUN_LINES).format(a=a, b=b))
    with pytest.raises(DataError, match=message):
        run("trecbad", RUN)


def test_scores_are_finite_and_rounded(run: Run, root: Path) -> None:
    _write(root, "tiny", "def f(q, ps):\n    return [1 / 3 + n * 1e-9 for n, _ in enumerate(ps)]\n")
    rankings, _ = run("pyr", {"provider": "python", "entry": "tiny:f"})
    scores = [s for r in rankings.values() for _, s in r]
    assert all(math.isfinite(s) and round(s, 6) == s for s in scores)


def test_ctrl_c_mid_embedding_keeps_what_was_answered_and_sends_it_never_again(
    root: Path, dataset: Path, mirror: Path
) -> None:
    """SIGINT while batches are on the wire: those in flight finish into the journal, the
    stage exits 130 having written nothing; the re-run sends only the batches never answered
    (no body is served twice) and ranks as an uninterrupted run does."""
    with TestServer(latency_ms=400) as srv:
        entry = _emb_entry(
            srv.base_url, "emb-int", window_tokens=300, batch_size=8, max_concurrency=2
        )
        script = (
            "import json, sys\n"
            "from pathlib import Path\n"
            "from pipeline.core.errors import Interrupted\n"
            "from pipeline.stages.retrieve import retrieve\n"
            "from tests.stages.test_retrieve import BENCH, _params\n"
            "root = Path(sys.argv[1])\n"
            "params = _params({'emb': json.loads(sys.argv[4])}, ['emb'])\n"
            "try:\n"
            "    retrieve(BENCH, params, 'emb', Path(sys.argv[2]), Path(sys.argv[3]),\n"
            "             root / 'retrievals' / 'summhay' / 'emb.jsonl', root)\n"
            "except Interrupted as e:\n"
            "    print(e)\n"
            "    sys.exit(130)\n"
        )
        argv = [
            sys.executable, "-c", script, str(root), str(dataset), str(mirror / "summhay"),
            json.dumps(entry),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LFBENCH_INTERRUPT_GRACE_S": "10"}
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_served(srv)) < 4:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
        assert "interrupted" in out
        first = _served(srv)
        assert 4 <= len(first) < 30  # stopped early, the batches in flight finished
        assert not (root / "retrievals" / "summhay" / "emb.jsonl").exists()
        subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        served = _served(srv)
    bodies = [r["body_sha256"] for r in served]
    assert len(bodies) == len(set(bodies))  # nothing answered was asked for again
    rows = (root / "retrievals" / "summhay" / "emb.jsonl").read_text().splitlines()
    got = {json.loads(r)["query_id"]: [p for p, _ in json.loads(r)["ranking"]] for r in rows}
    assert got == _expected_embeddings(dataset, 300)
