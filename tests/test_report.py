"""`lfbench report`: every benchmark's section from its metrics file, agreement, lineage."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.benchmarks.summhay.aggregate import ROW_KEYS
from pipeline.core.errors import DataError
from pipeline.core.markdown import table
from pipeline.results.report import build_report, md_to_html


def row(system: str, setting: str, joint: float, **kw: Any) -> dict[str, Any]:
    return {
        **dict.fromkeys(ROW_KEYS, 0),
        "words_per_bullet": 20.0,
        "coverage_macro": None,
        "citation_macro": None,
        "joint_macro": None,
        "benchmark": "summhay",
        "domain": "news",
        "system": system,
        "setting": setting,
        "judge": "j",
        "mode": "paper",
        "model": "published",
        "coverage": 60.0,
        "citation": 40.0,
        "joint": joint,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_usd": 0.25,
        **kw,
    }


# GPT-4o and Gemini-1.5-pro in the paper's Table 3 (Top, Bottom, Random), plus a system
# without the orderings.
ROWS = [
    row("gpt-4o", "full-sort", 13.8),
    row("gpt-4o", "full-rev-sort", 24.1),
    row("gpt-4o", "full", 11.4),
    row("gpt-4o", "oracle", 50.0),
    row("gemini-1.5-pro", "full-sort", 47.1),
    row("gemini-1.5-pro", "full-rev-sort", 38.9),
    row("gemini-1.5-pro", "full-middle", 40.0),
    row("gemini-1.5-pro", "full", 37.9),
    row("other", "full", 10.0),
    row("other", "full-sort", 12.0),  # no Bottom: no sensitivity
]


L2R = [
    {
        "benchmark": "long2rag",
        "system": "m1",
        "setting": "default",
        "judge": "j",
        "kpr": 0.5,
        "kpr_by_domain": {"AI": 0.6, "Law": 0.4},
        "kpr_by_category": {"Comparative": {"kpr": 0.7}, "Factual": {"kpr": 0.3}},
    },
    {
        "benchmark": "long2rag",
        "system": "m2",
        "setting": "default",
        "judge": "j",
        "kpr": 0.4,
        "breakdowns": {"domain": {"AI": 0.5}, "category": {"Factual": 0.2}},
    },
]


def _write(root: Path, name: str, rows: list[dict[str, Any]]) -> None:
    (root / "metrics").mkdir(exist_ok=True)
    (root / "metrics" / name).write_text(json.dumps({"rows": rows}))


def test_report_reads_whatever_metrics_exist(tmp_path: Path) -> None:
    _write(tmp_path, "summhay.json", ROWS)
    html_path, md_path = build_report(tmp_path, Path("out"))
    md = md_path.read_text()
    assert "## SummHay" in md and "## Judge agreement" not in md and "Long²RAG" not in md
    assert "| gpt-4o | 13.8 | 24.1 | - | 11.4 | 12.7 |" in md  # Table 3 layout
    assert "| published | j | 100 | 50 | 2.5000 |" in md  # cost: 10 rows x 0.25 USD
    assert "## Lineage" in md and "git commit" in md
    page = html_path.read_text()
    assert page.count("data:image/png;base64,") == 2  # position + joint-by-setting, inlined
    assert "<td>gpt-4o</td>" in page and 'src="report-fig' not in page

    _write(
        tmp_path,
        "agreement.json",
        [
            {
                "judge": "local",
                "reference": "human",
                "n": 100,
                "pearson": 0.71,
                "pearson_ci_low": 0.6,
                "pearson_ci_high": 0.8,
                "cohen_kappa": 0.5,
            }
        ],
    )
    _write(tmp_path, "long2rag.json", L2R)
    _, md_path = build_report(tmp_path, Path("out"))
    md = md_path.read_text()
    assert "| local | human | 100 | 0.710 [0.600, 0.800] |" in md
    assert "| m1 | default | j | 0.500 |" in md
    assert "Long²RAG KPR by domain and category" in md


def test_report_errors_name_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no results of any benchmark"):
        build_report(tmp_path, Path("out"))
    _write(tmp_path, "summhay.json", [{"system": "x"}])
    with pytest.raises(DataError, match="row 1, field benchmark"):
        build_report(tmp_path, Path("out"))
    (tmp_path / "metrics" / "summhay.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        build_report(tmp_path, Path("out"))


def test_md_to_html_tables_and_escaping() -> None:
    out = md_to_html("# T\n\n| a | b |\n|---|---|\n| <x> | `c` |\n\ntext **b**")
    assert "<h1>T</h1>" in out and "<th>a</th>" in out
    assert "<td>&lt;x&gt;</td><td><code>c</code></td>" in out and "<b>b</b>" in out


# ------------------------------------------------ the report of the committed metrics files

ROOT = Path(__file__).resolve().parents[1]
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _tables(md: str) -> list[list[str]]:
    """Every pipe table of a markdown text, as its lines."""
    blocks: list[list[str]] = []
    prev = False
    for line in md.splitlines():
        if line.startswith("|"):
            if not prev:
                blocks.append([])
            blocks[-1].append(line)
        prev = line.startswith("|")
    return blocks


FIFTH = "_template"  # a fifth benchmark: the template, as `lfbench new-benchmark` copies it


def _fifth_metrics() -> dict[str, Any]:
    """The template's metrics file, made as its stages make it: its examples answered by the
    lead baseline, judged by its own no-model judge, aggregated."""
    import yaml

    from pipeline.core import aggregation, registry
    from pipeline.core.benchmark import Run
    from pipeline.core.params import validate_params
    from pipeline.stages.common import context

    template = ROOT / "pipeline" / "benchmarks" / FIFTH
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params |= yaml.safe_load((template / "params.snippet.yaml").read_text(encoding="utf-8"))
    params["judges"] |= yaml.safe_load((template / "judges.snippet.yaml").read_text("utf-8"))
    bench = registry.get(FIFTH)
    ctx = context(bench, validate_params(params, "params.yaml", [FIFTH]), ROOT)
    dataset = bench.construct(ctx, None).records
    gens = bench.offline_generations(ctx, "lead", ctx.params.models["lead"], dataset)
    judge = f"{FIFTH}-match"
    assert bench.no_model_judge is not None
    js = bench.no_model_judge.judgements(
        ctx, judge, ctx.params.judges[judge], bench.items(dataset), gens
    )
    return aggregation.aggregate(bench, ctx, dataset, [Run("lead", judge, gens, js)]).metrics


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The report of the committed metrics files and a fifth benchmark's (issue 43: the
    sections were listed here by hand, so a fifth benchmark's metrics file failed the test),
    one Long²RAG system renamed `a|b`."""
    from pipeline.core import registry

    root = tmp_path_factory.mktemp("committed")
    (root / "metrics").mkdir()
    for src in sorted((ROOT / "metrics").glob("*.json")):
        (root / "metrics" / src.name).write_bytes(src.read_bytes())
    doc = json.loads((root / "metrics" / "long2rag.json").read_text())
    for r in doc["rows"]:
        if r["system"] == "extractive":
            r["system"] = "a|b"
    (root / "metrics" / "long2rag.json").write_text(json.dumps(doc))
    from pipeline.core import packages

    names = packages.names()
    with pytest.MonkeyPatch.context() as mp:  # the template is found as a benchmark package
        for module in (packages, registry):
            mp.setattr(module, "names", lambda: tuple(sorted((*names, FIFTH))))
        (root / "metrics" / f"{FIFTH}.json").write_text(json.dumps(_fifth_metrics()))
        html_path, md_path = build_report(root, Path("out"))
        sections = [
            f"## {b.title or b.name}"
            for b in registry.load_all()
            if (root / "metrics" / f"{b.name}.json").exists()
        ]
    return root, md_path.read_text(), html_path.read_text(), sections


def test_every_table_well_formed_whatever_its_labels_hold(committed: Any) -> None:
    _, md, page, _ = committed
    tables = _tables(md)
    assert len(tables) > 20
    for block in tables:
        widths = {len(UNESCAPED_PIPE.findall(line)) for line in block}
        assert len(widths) == 1, block[:3]  # every row as many cells as the header
    # CRUX's header: `|Z*|` in a label is text, not a column boundary
    crux = next(b for b in tables if b[0].startswith("| domain | judge | retriever |"))
    assert crux[0].count("\\|") == 6 and len(UNESCAPED_PIPE.findall(crux[0])) == 9
    # the system named `a|b`, in the markdown and in the HTML
    assert "| a\\|b | long_context | l2r-overlap | 0.086 | 88 | 465 |" in md
    assert "<tr><td>a|b</td><td>long_context</td><td>l2r-overlap</td><td>0.086</td>" in page
    assert "<th>Cov@|Z*|</th><th>alpha-nDCG@10</th><th>Den@|Z*|</th><th>mean |Z*|</th>" in page
    for table_html in re.findall(r"<table>(.*?)</table>", page, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", table_html)
        assert len({r.count("<td>") + r.count("<th>") for r in rows}) == 1


def test_headline_first_then_details_agreement_and_lineage_last(committed: Any) -> None:
    _, md, _, sections = committed
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    last = ["## Judge agreement", "## Judge cards", "## Lineage"]
    assert heads[0] == "## Headline" and heads[-3:] == last
    # one section per benchmark with a metrics file, in the registry's order
    assert heads[1:-3] == sections
    assert {"## CRUD-RAG", "## CRUX", "## Long²RAG", "## SummHay", f"## {FIFTH}"} <= set(sections)
    head = md[md.index("\n## Headline\n") : md.index(f"\n{heads[1]}\n")]
    # Long²RAG: per judge, the rows ranked by KPR (its main metric), best first
    rows = json.loads((ROOT / "metrics" / "long2rag.json").read_text())["rows"]
    for judge in ("l2r-overlap", "local"):
        ranked = sorted((r for r in rows if r["judge"] == judge), key=lambda r: -r["kpr"])
        system = lambda r: "a|b" if r["system"] == "extractive" else r["system"]  # noqa: E731
        cells = [
            f"{system(r)} / {r['setting']}: **{r['kpr']:.3f}**"
            f" [{r['kpr_ci_low']:.3f}, {r['kpr_ci_high']:.3f}]"  # its 95% interval over questions
            for r in ranked[:3]
        ]
        assert f"| {judge} | - | " + " | ".join(c.replace("|", "\\|") for c in cells) in head
    # SummHay's judges named with their kappa against people (metrics/agreement.json)
    agreement = json.loads((ROOT / "metrics" / "agreement.json").read_text())["rows"]
    for name in ("local", "published-gpt-4o"):
        (a,) = [r for r in agreement if r["judge"] == name and r["reference"] == "human"]
        lo, hi = a["cohen_kappa_ci_low"], a["cohen_kappa_ci_high"]
        kappa = f"{a['cohen_kappa']:.2f} [{lo:.2f}, {hi:.2f}]"
        assert f"| news | released | {name} | {kappa} | " in head
    assert "### CRUX: `coverage`" in head and "### CRUD-RAG: `rouge_l`" in head


def test_long2rag_breakdown_drawn_from_the_committed_rows() -> None:
    from pipeline.benchmarks.long2rag.report import report_section

    where = "metrics/long2rag.json"
    rows = json.loads((ROOT / where).read_text())["rows"]
    assert all("by_domain" in r and "kpr_by_domain" not in r for r in rows)
    section = report_section(rows, where)
    assert [c for c, _ in section.figures] == [
        "Long²RAG KPR by domain and category, judge l2r-overlap",
        "Long²RAG KPR by domain and category, judge local",
    ]
    assert all(png.startswith(b"\x89PNG") for _, png in section.figures)
    assert not any("no breakdown plot" in line for line in section.lines)


def test_headline_does_not_depend_on_the_rows_order() -> None:
    """Ties (CRUX has many rows at 100.0) broken by label, groups sorted: the same headline
    whatever order the metrics file lists its rows in."""
    from pipeline.core import registry
    from pipeline.results.report import headline

    for bench in registry.load_all():  # every benchmark with committed results
        name, metric = bench.name, bench.metrics[0].name
        if not (ROOT / "metrics" / f"{name}.json").exists():
            continue
        rows = json.loads((ROOT / "metrics" / f"{name}.json").read_text())["rows"]
        first = headline(name, name, rows, metric, {}, name)
        for seed in range(3):
            shuffled = list(rows)
            random.Random(seed).shuffle(shuffled)
            assert headline(name, name, shuffled, metric, {}, name) == first


def test_headline_intervals_and_unranked_rows() -> None:
    from pipeline.results.report import headline

    rows = [
        {"system": "x", "setting": "s", "judge": "j", "m": 0.5, "m_ci_low": 0.4, "m_ci_high": 0.6},
        {"system": "y", "setting": "s", "judge": "j", "m": 0.7},
        {"system": "z", "setting": "s", "judge": "j", "m": None},
    ]
    out = "\n".join(headline("b", "B", rows, "m", {("b", "j"): "0.50"}, "metrics/b.json"))
    assert "| j | 0.50 | y: **0.700** | x: **0.500** [0.400, 0.600] |  | 2 |" in out
    assert "Not ranked, without a `m` value: 1 row." in out
    with pytest.raises(DataError, match="row 2, field m"):
        headline("b", "B", [rows[0], {"system": "y", "judge": "j"}], "m", {}, "metrics/b.json")


def test_md_to_html_splits_cells_on_unescaped_pipes_only() -> None:
    md = "\n".join(table(["name", "a|b"], [["x|y\nz", "`c|d`"]]))
    assert md.splitlines()[0] == "| name | a\\|b |" and "| x\\|y z | `c\\|d` |" in md
    out = md_to_html(md)
    assert "<tr><th>name</th><th>a|b</th></tr>" in out
    assert "<tr><td>x|y z</td><td><code>c|d</code></td></tr>" in out


def test_a_benchmark_without_a_main_metric_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.core import registry
    from pipeline.results.report import build_markdown

    monkeypatch.setattr(type(registry.get("long2rag")), "metrics", ())
    _write(tmp_path, "long2rag.json", L2R)
    md, _ = build_markdown(tmp_path)
    head = md[md.index("\n## Headline\n") : md.index("\n## Long²RAG\n")]
    assert "### Long²RAG\n\nNo main metric declared: see its section below." in head


def test_the_declared_main_metric_ranks_its_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.core import registry
    from pipeline.core.results import Metric
    from pipeline.results.report import build_markdown

    bench = type(registry.get("long2rag"))
    monkeypatch.setattr(bench, "metrics", (Metric("kpr", higher_is_better=False),))
    _write(tmp_path, "long2rag.json", L2R)
    md, _ = build_markdown(tmp_path)
    assert "Ranked by `kpr` (lower is better)" in md
    assert "| j | - | m2: **0.400** | m1: **0.500** | " in md


def _card(judge: str, **kw: Any) -> dict[str, Any]:
    from pipeline.core.cards import card

    c = card(
        judge=judge,
        reference=kw.pop("reference", "human"),
        unit="insight verdict",
        judge_labels=["y"] * 4 + ["n"] * 4 + ["y", "n"],
        reference_labels=["y"] * 4 + ["n"] * 4 + ["n", "y"],
        categories=["n", "y"],
        kappa_kind="Cohen",
        pearson=0.6,
        n_resamples=0,
        seed=0,
        cost=kw.pop("cost"),
        throughput_stage=kw.pop("stage", None),
        linking=kw.pop("linking", None),
    )
    return c.model_dump()


def test_report_draws_the_judge_cards(tmp_path: Path) -> None:
    """One "Judge cards" table: every card of metrics/agreement.json and of a benchmark's
    agreement list, with the throughput a stage of this clone recorded (run state)."""
    from pipeline.core.cards import cost_per_1000
    from pipeline.results.report import _cards
    from pipeline.stages.timing import throughput, write_throughput

    _write(tmp_path, "summhay.json", ROWS)
    local = _card("local", cost=cost_per_1000(0.0, 10, free=True), stage="summhay-agreement",
                  linking=(50.0, 2))  # fmt: skip
    released = _card("gpt", cost=cost_per_1000(None, 0, note="replayed from the release"))
    rows = [
        {"benchmark": "summhay", "judge": "local", "reference": "human", "card": local},
        {"benchmark": "summhay", "judge": "gpt", "reference": "human", "card": released},
        {"benchmark": "summhay", "judge": "local", "reference": "gpt"},  # judge vs judge: none
    ]
    _write(tmp_path, "agreement.json", rows)
    write_throughput(
        tmp_path,
        "summhay-agreement",
        [throughput("local", "summhay-agreement", 300, 12.0, "loading and judging")],
    )
    md = build_report(tmp_path, Path("out"))[1].read_text()
    assert "## Judge cards" in md
    assert (
        "| summhay | local | human | insight verdict | 10 | 0.600 | 0.600 | 50.0 | $0.0000 | 25.0 |"
        in md
    )
    assert (
        "| summhay | gpt | human | insight verdict | 10 | 0.600 | 0.600 | - |"
        " unknown (replayed from the release) | - |" in md
    )
    assert "- summhay / local: 300 judgements in 12.0 s (summhay-agreement): loading and" in md
    # a benchmark's own agreement list (CRUX): timed by its judge stage
    paid = _card("llm", reference="labels", cost=cost_per_1000(0.03, 1500))
    write_throughput(
        tmp_path,
        "crux-judge@ctx-llm",
        [throughput("llm", "crux-judge@ctx-llm", 50, 10.0, "calls")],
    )
    lines = _cards(tmp_path, [("crux.json", "crux", [{"model": "ctx", "card": paid}])])
    assert (
        "| crux | llm | labels on ctx | insight verdict | 10 | 0.600 | 0.600 | - | $0.0200 | 5.0 |"
        in lines
    )
    bad = {**paid, "kappa": "high"}
    with pytest.raises(DataError, match=r"file crux.json, item row 1, field card.kappa"):
        _cards(tmp_path, [("crux.json", "crux", [{"model": "ctx", "card": bad}])])


def test_report_shows_each_audited_run_beside_the_judges_global_kappa(tmp_path: Path) -> None:
    """`lfbench audit score` results (audits/*.score.json) in one table, with the judge's kappa
    against people from metrics/agreement.json beside each run's own."""
    _write(tmp_path, "summhay.json", ROWS)
    _write(
        tmp_path,
        "agreement.json",
        [
            {
                "benchmark": "summhay",
                "judge": "j",
                "reference": "human",
                "cohen_kappa": 0.49,
                "cohen_kappa_ci_low": 0.45,
                "cohen_kappa_ci_high": 0.53,
            }
        ],
    )
    md = build_report(tmp_path, Path("out"))[1].read_text()
    assert "Audits by people" not in md  # nothing audited: no section
    audits = tmp_path / "audits"
    audits.mkdir()
    result = {
        "sample": "s1", "benchmark": "summhay", "run_id": "abc", "run_name": "gpt-4o / oracle",
        "judge": "j", "metric": "coverage", "labels": "50 of 50 units labelled (mlflow 50)",
        "audit.n": 50.0, "audit.kappa": 0.31, "audit.kappa_ci_low": 0.12,
        "audit.kappa_ci_high": 0.5, "audit.judge_mean": 61.0, "audit.coverage_ppi": 55.25,
        "audit.coverage_ppi_ci_low": 50.0, "audit.coverage_ppi_ci_high": 60.5,
        "audit.human_mean": 54.0, "audit.human_mean_ci_low": 47.0,
        "audit.human_mean_ci_high": 61.0,
    }  # fmt: skip
    (audits / "s1.score.json").write_text(json.dumps(result))
    md = build_report(tmp_path, Path("out"))[1].read_text()
    assert "## Audits by people, per run" in md
    assert (
        "| summhay | gpt-4o / oracle | j | 50 | 0.31 [0.12, 0.50] | 0.49 [0.45, 0.53] | coverage"
        " | 61.0 | 55.2 [50.0, 60.5] | 54.0 [47.0, 61.0] | 50 of 50 units labelled (mlflow 50) |"
        in md
    )


def test_report_leaves_out_the_audits_of_a_model_no_longer_in_params(tmp_path: Path) -> None:
    """A model taken out of params.yaml: its rows leave the metrics files (`lfbench repro`
    prunes them), and its audits leave the report's table too (the bug: still listed), with a
    line saying so; a result written before audits named their model is matched through its
    sample file (audits/<sample>.json)."""
    _write(tmp_path, "summhay.json", ROWS)
    (tmp_path / "params.yaml").write_text("models:\n  gpt-4o: {provider: openai}\n")
    audits = tmp_path / "audits"
    audits.mkdir()
    base = {
        "benchmark": "summhay", "run_id": "abc", "judge": "j", "metric": "coverage",
        "labels": "50 of 50 units labelled (mlflow 50)", "audit.n": 50.0, "audit.kappa": 0.31,
    }  # fmt: skip
    kept = {**base, "sample": "s1", "run_name": "gpt-4o / oracle", "model": "gpt-4o"}
    removed = {**base, "sample": "s2", "run_name": "old / oracle", "model": "old"}
    older = {**base, "sample": "s3", "run_name": "older / oracle"}  # no "model": its sample's
    for r in (kept, removed, older):
        (audits / f"{r['sample']}.score.json").write_text(json.dumps(r))
    (audits / "s3.json").write_text(json.dumps({"sample": "s3", "model": "older"}))
    md = build_report(tmp_path, Path("out"))[1].read_text()
    assert "| summhay | gpt-4o / oracle | j | 50 |" in md
    assert "old / oracle" not in md and "older / oracle" not in md
    assert "Not listed: the audits of old, older, no longer in params.yaml's models" in md
