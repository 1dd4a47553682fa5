"""Shared fixtures: the data mirror, a synthetic haystack, and project copies for pipeline runs."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

# Before any test module imports numpy: pipeline pins the float kernels (OpenBLAS Haswell, no
# AVX-512 dispatch) through environment variables that only act before numpy loads. Without this,
# on an AVX-512 machine the test process rounds differently from the stages and their workers.
import pipeline  # noqa: F401

# The tests write params.yaml as a person does, with no YAML anchors or aliases (lfbench refuses
# them: an alias bomb stalls DVC's parser). PyYAML writes `&id001` / `*id001` when one object
# appears twice in what it dumps (a test reusing an entry's dict): never here.
yaml.SafeDumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _find_mirror() -> Path | None:
    env = os.environ.get("LFBENCH_DATA_MIRROR")
    candidates = [Path(env)] if env else []
    candidates.append(ROOT.parent / "shared" / "data")
    for c in candidates:
        if (c / "summhay" / "topic_news1.json").exists():
            return c.resolve()
    return None


@pytest.fixture(scope="session")
def mirror() -> Path:
    found = _find_mirror()
    if found is None:
        pytest.skip("no data mirror: set LFBENCH_DATA_MIRROR (CI uses ../shared/data)")
    return found


def mini_haystack() -> dict[str, Any]:
    """A released-format haystack small enough to reason about by hand.

    3 documents; subtopic s1 has insights i1 (in docs 1, 2) and i2 (in doc 3); subtopic s2 has
    i3 (in doc 2). Retriever scores carry one stale id ("zz") from another haystack, as the real
    release does. One published system, "sysA" in the oracle setting, with its judgements.
    """
    docs = [
        {"document_id": "d1", "document_text": "Doc one.", "insights_included": ["i1"]},
        {"document_id": "d2", "document_text": "Doc two.", "insights_included": ["i1", "i3"]},
        {"document_id": "d3", "document_text": "Doc three.", "insights_included": ["i2"]},
    ]
    scores = {"d1": 2.0, "d2": 1.0, "d3": 0.0, "zz": 9.0}
    return {
        "topic_id": "t1",
        "topic": "A topic",
        "topic_metadata": {"participants": ["a", "b"]},
        "subtopics": [
            {
                "subtopic_id": "s1",
                "subtopic_name": "S one",
                "subtopic": "subtopic one",
                "query": "What about one?",
                "insights": [
                    {"insight_id": "i1", "insight_name": "I1", "insight": "Insight one."},
                    {"insight_id": "i2", "insight_name": "I2", "insight": "Insight two."},
                ],
                "retriever": {"oracle": dict(scores), "random": dict(scores)},
                "summaries": {
                    "summary_subtopic_oracle_sysA": ["Preamble:", "- one [1][2]", "- two [3, 1]"],
                },
                "eval_summaries": {
                    "summary_subtopic_oracle_sysA": [
                        {"insight_id": "i1", "coverage": "FULL_COVERAGE", "bullet_id": 2},
                        {"insight_id": "i2", "coverage": "PARTIAL_COVERAGE", "bullet_id": 3},
                    ],
                },
            },
            {
                "subtopic_id": "s2",
                "subtopic_name": "S two",
                "subtopic": "subtopic two",
                "query": "What about two?",
                "insights": [
                    {"insight_id": "i3", "insight_name": "I3", "insight": "Insight three."},
                ],
                "retriever": {"oracle": dict(scores), "random": dict(scores)},
                "summaries": {"summary_subtopic_oracle_sysA": ["- three [2]"]},
                "eval_summaries": {
                    "summary_subtopic_oracle_sysA": [
                        {"insight_id": "i3", "coverage": "NO_COVERAGE", "bullet_id": "NA"},
                    ],
                },
            },
        ],
        "documents": docs,
    }


@pytest.fixture
def haystack() -> dict[str, Any]:
    return copy.deepcopy(mini_haystack())


@pytest.fixture
def write_haystack(tmp_path: Path) -> Callable[[dict[str, Any], str], Path]:
    def write(data: dict[str, Any], name: str = "topic_news1.json") -> Path:
        path = tmp_path / "summhay" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data), encoding="utf-8")
        return path

    return write


# ---------------------------------------------------------------- project copies


def run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if cmd[:2] in (["dvc", "repro"], ["lfbench", "repro"], ["dvc", "exp"]):
        _list_entries_once(cwd)  # what `make repro` does first (`lfbench check`)
    proc = subprocess.run(cmd, cwd=cwd, env=run_env(env), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def dvc_workspace(path: Path, remote: Path | None = None) -> Path:
    """An empty git + DVC project at `path`, its default remote the folder `remote` if given."""
    path.mkdir(parents=True)
    run(["git", "init", "-q"], path)
    dvc_init(path)
    if remote is not None:
        dvc_remote_add(path, "team", remote)
    return path


# What `dvc init`, `dvc remote add -d` and `dvc cache dir --local` do (DVC's own `Repo.init` and
# `Config.edit`, as its commands call them), in the test's process: a project set up for a test
# is not what the test proves, and each CLI start costs about 0.5 CPU-s (some 60 in a run).


def dvc_init(path: Path) -> None:
    """`dvc init` in the git repository `path`."""
    from dvc.repo import Repo

    with Repo.init(str(path)):
        pass


def dvc_remote_add(path: Path, name: str, url: str | Path, level: str = "repo") -> None:
    """`dvc remote add -d [--local] NAME URL`: the project's default remote."""
    from dvc.config import Config

    with Config(dvc_dir=str(path / ".dvc"), validate=False).edit(level) as conf:
        conf["remote"][name] = {"url": str(url)}
        conf["core"]["remote"] = name


def run_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `run` gives a command (the venv's programs first, no MLflow URI from
    outside, the shared embedding cache), with `env` on top."""
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    # Project copies share this checkout's MiniLM vectors (content-addressed, quantised: the
    # same numbers as computing them), so the local judge's training stage does not re-embed
    # 27,000 texts in every copy.
    full_env.setdefault(
        "LFBENCH_EMBEDDING_CACHE", str(ROOT / ".lfbench" / "cache" / "embeddings.sqlite")
    )
    if env:
        full_env.update(env)
    return full_env


def encoder_beside(cache: Path) -> Path:
    """`cache` (an embedding cache's path), with the int8 encoder already in its folder's
    `onnx/`, where `Embedder(cache)` would build it (4 CPU-seconds, most of them writing 59
    MB): a hard link to the one this checkout's shared cache holds, built there once. The
    file is a pure function of the installed packages (test_two_builds_write_the_same_bytes),
    so the link is the file a build would write. For tests whose subject is not the build."""
    from pipeline.local_judge import encoder_onnx

    src = encoder_onnx.model_path(ROOT / ".lfbench" / "cache" / "onnx")
    dest = cache.parent / "onnx" / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        link_or_copy(src, dest)
    return cache


def link_or_copy(src: Path, dest: Path) -> None:
    """`dest` the file `src` (a hard link; a whole copy across file systems), unless another
    process made it first: for files never written in place (cache objects, the encoder)."""
    try:
        os.link(src, dest)
    except FileExistsError:
        pass
    except OSError:  # another file system: whole or not at all
        part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
        shutil.copy2(src, part)
        part.replace(dest)


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line]


@pytest.fixture
def project(tmp_path: Path, mirror: Path) -> Path:
    """A copy of the working tree's tracked files as a fresh git repository with data/ fetched.

    Uses the files as they are on disk (so tests see uncommitted edits), without dvc.lock and
    the committed metrics, so every stage runs.
    """
    return make_project(tmp_path / "proj", mirror)


@pytest.fixture
def shared_project(tmp_path: Path, mirror: Path) -> Path:
    """`project`, its DVC cache the session's shared one (`share_dvc_cache`): a stage another
    test already ran with the same command, dependencies and params is restored, not re-run."""
    return make_project(tmp_path / "proj", mirror, shared_cache=True)


# ---------------------------------------------------------------- one DVC cache for the session

_SHARED_CACHE: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def _shared_dvc_cache_dir(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> None:
    """Where `share_dvc_cache` points: one folder for every pytest-xdist worker of this run
    (the workers' base temp folders share a parent), removed with pytest's old temp folders.
    A worker is known by the input xdist gives it (what xdist's own `worker_id` fixture reads),
    so a plain `pytest tests/benchmarks/<name>` runs without the plugin too (`-p no:xdist`),
    and a pytest that a worker's test starts is not taken for a worker by its environment."""
    base = tmp_path_factory.getbasetemp()
    worker = hasattr(pytestconfig, "workerinput")
    _SHARED_CACHE["dir"] = (base.parent if worker else base) / "shared-dvc-cache"


def share_dvc_cache(proj: Path) -> None:
    """Point `proj`'s DVC cache (objects and run cache) at the session's shared folder.

    The deterministic stages that every sliced DAG holds (the image recipe, the local judge's
    training, the no-model baselines and their judges, the constructions) then run once per
    session, in the first test that needs them; another test with the same command,
    dependencies and params gets DVC's run-cache restore, byte for byte the same outputs. A
    stage that talks to a test server never matches another test's (its params hold the
    server's own port). Only for tests that do not assert which stages ran, nor remove or
    corrupt the cache: a test that must see every stage run passes `--no-run-cache` (DVC
    still saves what it ran, so the others can restore it).

    What the project's own cache already holds (its data, when it was fetched before) is carried
    over, so the test does not depend on another test having put the same data there first.
    """
    cache = _SHARED_CACHE.get("dir")
    assert cache is not None, "share_dvc_cache needs the session fixture _shared_dvc_cache_dir"
    cache.mkdir(parents=True, exist_ok=True)
    own = proj / ".dvc" / "cache"
    for src in own.rglob("*") if own.is_dir() else ():
        dest = cache / src.relative_to(own)
        if src.is_dir() or dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(src, dest)
    from dvc.config import Config

    with Config(dvc_dir=str(proj / ".dvc"), validate=False).edit("local") as conf:
        conf["cache"]["dir"] = str(cache)  # `dvc cache dir --local`


def make_project(dest: Path, mirror: Path, shared_cache: bool = False) -> Path:
    """The `project` fixture's work, for fixtures of a wider scope (`shared_cache`: its DVC
    cache is the session's shared one, see `share_dvc_cache`)."""
    for rel in tracked_files():
        src = ROOT / rel
        if not src.exists() or rel in ("dvc.lock", "metrics/summhay.json"):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    run(["git", "init", "-q"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], dest)
    if shared_cache:
        share_dvc_cache(dest)
    fetch_data(dest, mirror)
    return dest


def fetch_data(proj: Path, mirror: Path) -> None:
    """`lfbench data fetch --mirror MIRROR` in `proj` (the command's own two steps: data/ filled
    and verified, then checked against data.dvc and put in the DVC cache), in this process:
    the command itself has its tests (tests/data), and a CLI start per test project costs
    about 0.5 CPU-s."""
    from pipeline.data.fetch import dvc_commit_data, fetch

    fetch(proj / "data", proj / "data.sources.yaml", mirror=mirror, log=lambda _: None)
    dvc_commit_data(proj / "data.dvc")


_LISTED: dict[Path, tuple[int, int]] = {}


def _list_entries_once(proj: Path) -> None:
    """`list_entries` before a repro in a test project whose params.yaml or dvc.yaml changed
    since the last one (a test's own params.yaml may name other judges than the shipped one);
    params a test made invalid on purpose are left for the command to refuse."""
    from pipeline.core.errors import LfbenchError

    files = (proj / "params.yaml", proj / "dvc.yaml")
    if not all(f.exists() for f in files):
        return
    stamp = (files[0].stat().st_mtime_ns, files[1].stat().st_mtime_ns)
    if _LISTED.get(proj) == stamp:
        return
    try:
        list_entries(proj)
    except (LfbenchError, ValueError, KeyError):
        return
    _LISTED[proj] = (files[0].stat().st_mtime_ns, files[1].stat().st_mtime_ns)


def list_entries(proj: Path) -> None:
    """`lfbench check --fix` in a test project, changing no line it need not: its dvc.yaml's
    agreement and construct stages list the judges entries its params.yaml makes them read, and
    none params.yaml lacks (DVC refuses those); a listed entry it still has stays."""
    from pipeline.core import registry
    from pipeline.core.errors import LfbenchError
    from pipeline.core.params import load_params
    from pipeline.stages.entries import relist

    for bench in registry.names():  # each section as its stages load it (alone)
        try:
            params = load_params(proj / "params.yaml", [bench])
        except (LfbenchError, ValueError, KeyError):
            continue  # a section the test left invalid: its stages refuse it themselves
        relist(params, proj / "dvc.yaml", exact=False, only=bench)


def slice_crux(
    params: dict[str, Any],
    haystacks: tuple[str, ...] = ("news1",),
    subtopics: int = 2,
    judges: tuple[str, ...] = ("crux-labels",),
    answers: list[str] | None = None,
) -> None:
    """Shrink CRUX to a few queries judged by its no-model labels, and keep the entries it needs
    (`answers`: the SummHay judgements files its contexts are compared with; None: none)."""
    builtin = yaml_default()
    params["models"].setdefault("crux-contexts", builtin["models"]["crux-contexts"])
    params["judges"].setdefault("crux-labels", builtin["judges"]["crux-labels"])
    crux = params["crux"]
    crux["derived"].update(haystacks=list(haystacks), subtopics=subtopics)
    crux["models"] = ["crux-contexts"]
    crux["judges"] = list(judges)
    crux["scoring"]["bootstrap_resamples"] = 50
    if answers is None:
        crux["answers"]["generations"] = None
    else:
        crux["answers"]["judgements"] = answers


def slice_summhay(params: dict[str, Any]) -> None:
    """Shrink SummHay to what another benchmark's stages read from it: the released summaries of
    one system on one subtopic of news1, replayed by the released GPT-4o judge (no model, no
    length study, no local judge scoring). CRUX's aggregate depends on SummHay's outputs in the
    DAG, so a CRUX-only test still builds them: this keeps that to seconds."""
    builtin = yaml_default()
    params["models"].setdefault("published", builtin["models"]["published"])
    params["judges"].setdefault("published-gpt-4o", builtin["judges"]["published-gpt-4o"])
    params["models"]["published"].update(systems=["gpt-4o"], settings=["oracle"])
    s = params["summhay"]
    s.update(haystacks=["news1"], subtopics=1, models=["published"], judges=["published-gpt-4o"])
    s["lengths"]["haystacks"] = []
    s["agreement"].update(bootstrap_resamples=20, max_samples=4)


# The stages a SummHay-only test reproduces (`dvc repro *SUMMHAY_TARGETS`): everything SummHay
# needs, not the other three benchmarks.
SUMMHAY_TARGETS = ("summhay-aggregate", "summhay-agreement")


def slice_crud_rag(params: dict[str, Any], records: int = 3) -> None:
    """Shrink CRUD-RAG to a few records, the base setting, one more chunking and the oracle,
    made by the lead baseline and scored by its no-model text judge."""
    builtin = yaml_default()
    params["models"].setdefault("lead", builtin["models"]["lead"])
    params["judges"].setdefault("crud-text", builtin["judges"]["crud-text"])
    crud = params["crud_rag"]
    crud["records"] = records
    crud["grid"].update(chunk=[[128, 8], [256, 4]], chunk_overlap=[0], top_k=[8])
    crud["models"] = ["lead"]
    crud["judges"] = ["crud-text"]


def yaml_default() -> dict[str, Any]:
    """The shipped params.yaml."""
    import yaml

    loaded: dict[str, Any] = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    return loaded


def keep_builtin_entries(
    params: dict[str, Any], haystack: str = "news1"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The no-model entries every default DAG needs when a test replaces `models`/`judges`.

    The Long2RAG stages score the models and judges that long2rag.models/judges name (by default
    the no-model baselines, the local and the overlap judge), and the local judge's training stage
    is always in the DAG. This keeps those entries, shrinks Long2RAG to one subtopic of one
    haystack, CRUX to two queries judged by its labels, CRUD-RAG to three records, and the local
    judge's training to that haystack. Returns (models, judges) to merge into the test's own.
    """
    models = {k: params["models"][k] for k in params["long2rag"]["models"]}
    judges = {k: params["judges"][k] for k in params["long2rag"]["judges"]}
    local = copy.deepcopy(params["judges"]["local"])
    local["train"]["haystacks"] = [haystack]
    judges["local"] = local
    params["long2rag"]["derived"].update(haystacks=[haystack], subtopics=1)
    slice_crux(params, (haystack,))
    models["crux-contexts"] = params["models"]["crux-contexts"]
    judges["crux-labels"] = params["judges"]["crux-labels"]
    slice_crud_rag(params)
    models["lead"] = params["models"]["lead"]
    judges["crud-text"] = params["judges"]["crud-text"]
    return models, judges


@pytest.fixture(scope="session")
def postgres() -> Any:
    """One PostgreSQL server on 127.0.0.1 for the session (Debian's postgresql, as `lfbench team
    up` starts it); each test makes its own database with `postgres.create_database(name)`."""
    import socket
    import tempfile

    from pipeline.env.team import Postgres

    root = Path(tempfile.mkdtemp(prefix="lfbench-pg-"))
    root.chmod(0o755)  # the server runs as `postgres` when the tests run as root
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    pg = Postgres(root / "data", port).start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- live report for CI logs

SLOW_TEST_S = 30.0  # a test slower than this prints its time as it ends


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure as it happens, and the time of each slow test: a CI run stopped by its
    time limit never reaches pytest's summary, and its log should still say what failed and
    where the time went."""
    reporter = _REPORTER.get("tr")
    if reporter is None:
        return
    if report.failed and report.when in ("setup", "call", "teardown"):
        text = str(report.longrepr)
        if len(text) > 6000:
            text = text[:1500] + "\n[...]\n" + text[-4500:]
        reporter.write_line("")
        reporter.write_line(f"FAILED ({report.when}) {report.nodeid}:\n{text}", red=True)
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown" and _DURATIONS[report.nodeid] > SLOW_TEST_S:
        reporter.write(f" [{_DURATIONS[report.nodeid]:.0f} s {report.nodeid.split('::')[-1]}] ")


_REPORTER: dict[str, Any] = {}
_DURATIONS: dict[str, float] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _REPORTER["tr"] = session.config.pluginmanager.get_plugin("terminalreporter")


# ---------------------------------------------------------------- order, for `pytest -n`

# The test files in order of their wall time, longest first (seconds in a whole run on 2 cores,
# perf/test_cpu.py): `make test` runs files on every core (pytest-xdist, --dist loadfile, no
# reordering), and the longest first leaves short files for the end, so no core runs the last long
# file alone. Two exceptions:
# - The first four are the long files whose stages no other test runs (the default grid, the
#   image, the real model's, the own RAG's). The sliced DAGs (test_pipeline, test_parallel_pipeline,
#   ...) come after them, so that each finds in the shared run cache (`share_dvc_cache`) the stages
#   an earlier one ran: started together with them, the first one run (ci-65) took 199 s of setup
#   instead of 83 s and the second 143 s instead of 103 s.
# - xdist gives a worker its next file as soon as at most 2 of its tests are pending, so the worker
#   of a one-test file takes the next file at once, to run after it: the fifth goes behind the
#   longest (14 min), so it is a short one.
# perf/test_order.py simulates the scheduler over a run's times, each varied by up to 18%: this
# order ends the median run at 1,356 s, the order before these two at 1,417 s.
HEAVY_FIRST = (
    "tests/e2e/test_fresh_clone.py",
    "tests/e2e/test_docker.py",
    "tests/e2e/test_real_model.py",
    "tests/e2e/test_own_rag.py",
    "tests/test_mlflow_store.py",
    "tests/e2e/test_real_embeddings.py",
    "tests/e2e/test_pipeline.py",
    "tests/e2e/test_parallel_pipeline.py",
    "tests/e2e/test_mlflow_ui.py",
    "tests/e2e/test_team.py",
    "tests/e2e/test_llm_pipeline.py",
    "tests/test_parallel.py",
    "tests/test_cluster.py",
    "tests/test_dvc_internals.py",
    "tests/e2e/test_new_benchmark.py",
    "tests/test_endpoint_limit.py",
    "tests/e2e/test_image_commands.py",
    "tests/stages/test_tracking.py",
    "tests/e2e/test_crux_pipeline.py",
    "tests/e2e/test_long2rag_pipeline.py",
    "tests/e2e/test_plan.py",
    "tests/e2e/test_summhay_synthesis.py",
    "tests/judging/test_encoder_isa.py",
    "tests/judging/test_encoder_onnx.py",
    "tests/e2e/test_crud_rag_pipeline.py",
    "tests/stages/test_interrupt.py",
    "tests/e2e/test_context_window.py",
    "tests/llm/test_cache.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::")[0], len(rank))

    items.sort(key=key)  # stable: each file keeps its own order
