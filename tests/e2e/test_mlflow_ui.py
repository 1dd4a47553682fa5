"""The MLflow UI as a user sees it: `lfbench ui` on a store made by `dvc repro`, opened in a real
headless Chromium (Debian's chromium + chromedriver, driven by Selenium).

Finds the benchmark's experiment from the home page, filters the current gpt-4o runs, opens the
oracle run and checks that its metrics, params and lineage tags are shown with the values of
metrics/summhay.json and the MLflow store, then opens its plot artifact and checks the image
rendered. Screenshots land in test-artifacts/ (printed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import (
    BIN,
    ROOT,
    run,
    share_dvc_cache,
    slice_crud_rag,
    slice_crux,
    tracked_files,
)

pytestmark = pytest.mark.slow

CHROMIUM = Path(os.environ.get("LFBENCH_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("LFBENCH_CHROMEDRIVER", "/usr/bin/chromedriver"))
ARTIFACTS = ROOT / "test-artifacts"
JUDGE = "published-gpt-4o"  # the released judge (the default params add the local judge)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=2560,1200",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, mirror: Path) -> Path:
    """A project copy (as the `project` fixture makes) after `dvc repro` of two released
    systems (20 runs keep the store small; the pipeline is the real one)."""
    project = tmp_path_factory.mktemp("ui") / "proj"
    for rel in tracked_files():
        src = ROOT / rel
        if not src.exists() or rel in ("dvc.lock", "metrics/summhay.json"):
            continue
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, project / rel)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["runtime"] = "local"
    params["models"]["published"]["systems"] = ["gpt-4o", "gemini-1.5-pro"]
    # SummHay whole (the compare test's 42 items); the rest as small as test_pipeline's slice
    params["summhay"]["lengths"]["haystacks"] = []
    # the released summaries replayed by their judge: no baselines, no local judge to run
    params["summhay"]["models"] = ["published"]
    params["summhay"]["judges"] = [JUDGE]
    params["judges"]["local"]["train"]["haystacks"] = ["news1"]
    params["long2rag"]["derived"]["haystacks"] = ["news1"]
    params["long2rag"]["derived"]["subtopics"] = 3
    params["long2rag"]["settings"] = ["long_context", "rag_512"]
    params["long2rag"]["models"] = ["l2r-lead"]
    params["long2rag"]["judges"] = ["l2r-overlap"]
    slice_crux(params)
    slice_crud_rag(params)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], project)
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], project)
    share_dvc_cache(project)  # the stages other tests' slices share are restored, not re-run
    run(["lfbench", "data", "fetch", "--mirror", str(mirror)], project)
    start = time.monotonic()
    run(["dvc", "repro"], project)
    print(f"dvc repro: {time.monotonic() - start:.1f} s")
    return project


@pytest.fixture(scope="module")
def ui_server(store: Path) -> Iterator[tuple[str, Path]]:
    """`lfbench ui` on the module's store, one server for its tests (a start is about 5
    CPU-s): it reads the store as it is when asked, so what a test adds is seen."""
    project = store
    port = _free_port()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = (project / "ui.log").open("w")
    proc = subprocess.Popen(
        ["lfbench", "ui", "--port", str(port)],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"lfbench ui did not come up:\n{(project / 'ui.log').read_text()}"
                )
            time.sleep(0.5)
        print(f"lfbench ui answered after {time.monotonic() - start:.1f} s")
        yield url, project
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(
            f"no {CHROMIUM} / {CHROMEDRIVER}: install Debian's chromium and chromium-driver "
            "(.ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="lfbench-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_mlflow_ui_shows_runs_metrics_lineage_and_plots(
    ui_server: tuple[str, Path], browser: Any
) -> None:
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, project = ui_server
    d = browser
    ARTIFACTS.mkdir(exist_ok=True)

    def body() -> str:
        return str(d.find_element(By.TAG_NAME, "body").text)

    def wait_text(text: str, timeout: float = 60) -> None:
        WebDriverWait(d, timeout).until(lambda _: text in body(), f"{text!r} never showed")

    def click(xpath: str, timeout: float = 30) -> None:
        WebDriverWait(d, timeout).until(lambda _: d.find_elements(By.XPATH, xpath), xpath)
        d.find_element(By.XPATH, xpath).click()

    # What the UI must show, from the pipeline's own outputs and the store.
    rows = json.loads((project / "metrics/summhay.json").read_text())["rows"]
    row = next(
        r for r in rows if (r["system"], r["setting"], r["judge"]) == ("gpt-4o", "oracle", JUDGE)
    )
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    mlrun = client.get_run(_run_id(project, "gpt-4o", "oracle"))
    tags = mlrun.data.tags

    # Home page -> the "Model training" view -> the benchmark's experiment -> its runs table.
    d.get(url + "/")
    wait_text("summhay")
    click("//*[normalize-space(text())='Model training']")
    click("//a[normalize-space(.)='summhay']")
    wait_text("gpt-4o / oracle")
    # Filter to the current gpt-4o runs, as the README tells a user to.
    box = d.find_element(By.CSS_SELECTOR, "input[placeholder*='metrics']")
    box.send_keys("tags.`lfbench.current` = 'true' and params.system = 'gpt-4o'" + Keys.ENTER)
    n_gpt4o = sum(1 for r in rows if r["system"] == "gpt-4o")
    wait_text(f"{n_gpt4o} matching runs")
    # The Dataset column: each run's dataset, as logged with log_inputs (name and digest)
    (ds,) = mlrun.inputs.dataset_inputs
    assert ds.dataset.name == "summhay/summhay.jsonl"
    assert ds.dataset.digest == tags["dataset.digest"][: len(ds.dataset.digest)]
    wait_text("Dataset")
    wait_text(ds.dataset.name)
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-runs.png"))

    # The run page: metrics with the values of metrics/summhay.json, params, lineage tags.
    click(f"//a[starts-with(normalize-space(.), 'gpt-4o / oracle / {JUDGE}')]")
    wait_text("dataset.digest")
    page = body()
    lines = page.splitlines()
    assert mlrun.info.run_id in page
    for metric in ("coverage", "citation", "joint"):
        shown = lines[lines.index(metric) + 1]
        assert float(shown) == pytest.approx(row[metric], abs=1e-6), (metric, shown)
    for key in ("dataset.digest", "data.digest", "judge.name", "git.commit", "dvc.stage_md5"):
        assert key in lines, key
        assert tags[key] in page, (key, tags[key])
    assert tags["dataset.digest"] != "unknown" and len(tags["git.commit"]) == 40
    shot = ARTIFACTS / "mlflow-ui.png"
    d.save_screenshot(str(shot))  # the run's overview: lineage tags
    heading = d.find_element(By.XPATH, "//*[starts-with(normalize-space(text()), 'Metrics (')]")
    d.execute_script("arguments[0].scrollIntoView()", heading)
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-metrics.png"))

    # The plots are run artifacts and render as images in the artifact viewer.
    click("//*[normalize-space(text())='Artifacts']")
    click("//*[normalize-space(text())='plots']")
    click("//*[normalize-space(text())='joint_by_setting.png']")

    def rendered(_: Any) -> bool:
        # the viewer fetches the artifact and shows it from a blob: URL; the PNG is 700 px wide
        return "plots/joint_by_setting.png" in body() and bool(
            d.execute_script(
                "return [...document.images].some(i => i.complete && i.naturalWidth === 700)"
            )
        )

    WebDriverWait(d, 60).until(rendered, "the plot image never rendered")
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-plot.png"))
    print(f"screenshots: {shot} and mlflow-ui-{{runs,metrics,plot}}.png beside it")


def test_lfbench_ui_links_each_benchmark_s_runs(ui_server: tuple[str, Path], browser: Any) -> None:
    """The link `lfbench ui` prints opens the benchmark's current runs in the "Model training"
    view, sorted by its main metric with its main metrics as columns, and its chart view on
    them (not MLflow's GenAI home page, nor charts starting at `citation`/`cost_usd`)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, project = ui_server
    d = browser
    printed = (project / "ui.log").read_text()
    link = next(
        line.split(": ", 1)[1] for line in printed.splitlines() if line.startswith("  summhay: ")
    )
    assert link.startswith(url + "/#/experiments/") and "viewStateShareKey=lfbench" in link
    rows = json.loads((project / "metrics/summhay.json").read_text())["rows"]
    best = max(rows, key=lambda r: r["joint"])

    def body() -> str:
        return str(d.find_element(By.TAG_NAME, "body").text)

    def wait_text(text: str, timeout: float = 60) -> None:
        WebDriverWait(d, timeout).until(lambda _: text in body(), f"{text!r} never showed")

    d.get(link)
    wait_text(f"{len(rows)} matching runs")  # the current runs: one per row
    wait_text("Sort: joint")
    page = body()
    for column in ("joint", "coverage", "citation", "joint_ci_low", "n_items", "cost_usd"):
        assert column in page.splitlines(), column
    names = [e.text for e in d.find_elements(By.XPATH, "//a[contains(@href, '/runs/')]")]
    first = next(n for n in names if " / " in n)
    assert first.startswith(f"{best['system']} / {best['setting']} / "), (first, best)
    assert "Welcome to MLflow" not in page and "Information about UI telemetry" not in page
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-lfbench-view.png"))

    d.get(link + "&compareRunsMode=CHART")
    wait_text("Main metrics (lfbench)")
    charts = body().split("Main metrics (lfbench)", 1)[1].splitlines()
    assert [c for c in charts if c in ("joint", "coverage", "citation", "cost_usd")][:3] == [
        "joint",
        "coverage",
        "citation",
    ]
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-lfbench-charts.png"))


def test_an_audit_sample_is_labelled_in_the_trace_view_and_scored_on_its_run(
    ui_server: tuple[str, Path], browser: Any
) -> None:
    """`lfbench audit sample` on a run; Chromium opens one sampled trace and shows what the
    judge saw (not its verdict: blind), the label scale and the Assessments panel where a
    person adds feedback; labels logged as a person would (HUMAN feedback) are read by
    `lfbench audit score`, and the run's page shows the new metrics."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, project = ui_server
    d = browser
    ARTIFACTS.mkdir(exist_ok=True)

    def body() -> str:
        return str(d.find_element(By.TAG_NAME, "body").text)

    def wait_text(text: str, timeout: float = 60) -> None:
        WebDriverWait(d, timeout).until(lambda _: text in body(), f"{text!r} never showed")

    run_id = _run_id(project, "gemini-1.5-pro", "oracle")
    made = run(
        ["lfbench", "audit", "sample", "--benchmark", "summhay", "--model", "gemini-1.5-pro",
         "--setting", "oracle", "--judge", JUDGE, "-n", "12", "--name", "ui-audit"],
        project,
    )  # fmt: skip
    assert "12 MLflow traces on the run" in made.stdout, made.stdout
    sample = json.loads((project / "audits/ui-audit.json").read_text())
    assert sample["run_id"] == run_id and len(sample["units"]) == 12
    csv_lines = (project / "audits/ui-audit.csv").read_text().splitlines()
    assert csv_lines[0].endswith(",scale,label")
    uri = f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("summhay").experiment_id
    before = client.get_run(run_id)

    # The trace view of one unit: the inputs the judge saw and the scale, blind: the output
    # says what to give, not what the judge gave.
    unit = sample["units"][0]
    d.get(f"{url}/#/experiments/{exp}/traces?selectedEvaluationId={unit['trace_id']}")
    wait_text(unit["inputs"]["insight"][:50])
    wait_text("label scale")
    wait_text("FULL_COVERAGE, PARTIAL_COVERAGE, NO_COVERAGE")
    wait_text("yours to give")
    assert "verdict" not in body()
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-audit-trace.png"))
    # The Assessments panel: where a person adds feedback named "coverage" (no judge's
    # assessment there to copy).
    WebDriverWait(d, 30).until(
        lambda _: [b for b in d.find_elements(By.TAG_NAME, "button") if b.text.startswith("Assess")]
    )
    next(b for b in d.find_elements(By.TAG_NAME, "button") if b.text.startswith("Assess")).click()
    wait_text("Assessments")
    wait_text("Add feedback")
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-audit-assessments.png"))

    # A person's labels, logged as the UI logs them: HUMAN feedback named "coverage". They
    # disagree with the judge on a third of the units (the scale's next label).
    mlflow.set_tracking_uri(uri)
    scale = sample["scale"]["labels"]
    human = {}
    for k, u in enumerate(sample["units"]):
        label = u["judge_label"]
        if k % 3 == 0:
            label = scale[(scale.index(label) + 1) % len(scale)]
        human[u["unit"]] = label
        mlflow.log_feedback(
            trace_id=u["trace_id"],
            name="coverage",
            value=label,
            source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="tester"),
        )
    scored = run(["lfbench", "audit", "score", "--sample", "ui-audit", "--json"], project)
    (result,) = json.loads(scored.stdout)
    assert result["run_id"] == run_id and result["audit.n"] == 12
    assert result["audit.exact_agreement"] == pytest.approx(8 / 12)
    after = client.get_run(run_id)
    for key in ("audit.kappa", "audit.n", "audit.coverage_ppi", "audit.coverage_ppi_ci_low"):
        assert after.data.metrics[key] == pytest.approx(result[key]), key
    # nothing of the row changed: same metrics and tags but the audit's
    assert {k: v for k, v in after.data.metrics.items() if not k.startswith("audit.")} == dict(
        before.data.metrics
    )

    # The run's page shows them.
    d.get(f"{url}/#/experiments/{exp}/runs/{run_id}")
    wait_text("audit.coverage_ppi")
    lines = body().splitlines()
    shown = lines[lines.index("audit.coverage_ppi") + 1]
    assert float(shown) == pytest.approx(result["audit.coverage_ppi"], abs=1e-3)
    d.save_screenshot(str(ARTIFACTS / "mlflow-ui-audit-run.png"))


def _run_id(project: Path, system: str, setting: str, judge: str = JUDGE) -> str:
    """The one current run of (system, setting) scored by `judge` (each judge has its own)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("summhay")
    (r,) = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`lfbench.current` = 'true' and params.system = '{system}' "
        f"and params.setting = '{setting}' and params.judge = '{judge}'",
    )
    return str(r.info.run_id)


def test_compare_two_real_runs(store: Path) -> None:
    rows = json.loads((store / "metrics/summhay.json").read_text())["rows"]
    cell = {(r["system"], r["setting"]): r for r in rows if r["judge"] == JUDGE}
    a, b = _run_id(store, "gpt-4o", "full"), _run_id(store, "gpt-4o", "oracle")
    res = json.loads(run(["lfbench", "compare", a, b, "--json"], store).stdout)
    assert res["params"] == {"setting": ["full", "oracle"]}
    assert res["tags"]["setting"] == ["full", "oracle"] and "dataset.digest" not in res["tags"]
    assert res["n_shared_items"] == 42 and res["resamples"] == 10_000
    for m in ("coverage", "citation", "joint"):
        got = res["metrics"][m]
        ra, rb = cell[("gpt-4o", "full")][m], cell[("gpt-4o", "oracle")][m]
        # all 42 subtopics are shared: the pooled scores are the rows' own numbers
        assert got["pooled_a"] == pytest.approx(ra, abs=1e-5)
        assert got["pooled_b"] == pytest.approx(rb, abs=1e-5)
        assert got["ci_low"] <= got["paired_delta"] <= got["ci_high"]
    # oracle context vs the whole haystack: Joint 16.3 -> 49.8, far outside resampling noise
    assert res["metrics"]["joint"]["p_value"] < 0.001 and res["metrics"]["joint"]["ci_low"] > 20
    # a run against itself: no difference, p = 1
    same = json.loads(run(["lfbench", "compare", a, a, "--json"], store).stdout)
    assert (
        same["metrics"]["joint"]["paired_delta"] == 0 and same["metrics"]["joint"]["p_value"] == 1
    )
    text = run(["lfbench", "compare", a, b], store).stdout
    assert "setting: full -> oracle" in text and "paired bootstrap over 42 shared items" in text
    bad = run(["lfbench", "compare", a, "0" * 32], store, check=False)
    assert bad.returncode == 2 and "not found" in bad.stderr
