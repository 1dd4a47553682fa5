"""`lfbench compare A B`: what differs between two MLflow runs of one benchmark.

A and B are run ids, or, with `--benchmark`, systems by name (a model entry, a system or a run
name, with `--setting`, `--judge` and the benchmark's group keys where the name alone is
ambiguous): the current run of each. Runs of two benchmarks are refused.

Params and lineage tags that differ; then both systems on the items both runs scored: every
metric a benchmark declares (`pipeline/core/results.py`) pooled over those shared items for A
and for B (from each run's `items.jsonl` artifact: a `mean` metric over item values, a `ratio`
metric as summed numerators over summed denominators; SummHay's runs of before the result
model: its `judgements.jsonl`), the delta B - A, and a 95% interval and p-value from a paired
bootstrap over them. With fewer than `MIN_PAIRED_ITEMS` shared items nothing is tested, and the
output says so; fewer than `MIN_RESAMPLES` resamples or a negative seed are refused. The whole
runs' metrics (counters, tokens, cost; the declared ones too when the item sets differ) are
shown apart; a row's own interval bounds are not compared.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.errors import DataError, LfbenchError
from pipeline.core.results import ItemScore, Metric, item_parts
from pipeline.metrics.bootstrap import paired_bootstrap

# Tags that say how a run was recorded rather than what it is.
_BOOKKEEPING = (
    "mlflow.",
    "lfbench.current",
    "lfbench.superseded_by",
    "lfbench.fingerprint",
    "lfbench.row_key",
    "lfbench.plots_sha",
    "audit.",  # a people's audit of the run (`lfbench audit`); its figures stay as metrics
)


def _insight_parts(rec: Mapping[str, Any], where: str) -> dict[str, tuple[float, float]]:
    """(numerator, denominator) contributions of one insight score to each pooled metric,
    on 0-100 (SummHay's `pool`: coverage and joint over valid insights, citation, precision and
    recall over covered ones)."""
    for f in ("status", "covered", "coverage"):
        if f not in rec:
            raise DataError("insight score without this field", file=where, field=f)
    if rec["status"] != "ok":
        return {}
    cov = float(rec["coverage"])
    f1 = float(rec.get("f1") or 0.0)
    parts = {"coverage": (100 * cov, 1.0), "joint": (100 * cov * f1, 1.0)}
    if rec["covered"]:
        parts["citation"] = (100 * f1, 1.0)
        parts["citation_precision"] = (100 * float(rec.get("precision") or 0.0), 1.0)
        parts["citation_recall"] = (100 * float(rec.get("recall") or 0.0), 1.0)
    else:
        for k in ("citation", "citation_precision", "citation_recall"):
            parts[k] = (0.0, 0.0)
    return parts


POOLED = ("coverage", "citation", "joint", "citation_precision", "citation_recall")
# Below this many paired items a bootstrap says nothing: no interval, nothing significant.
MIN_PAIRED_ITEMS = 10


def declared_sums(
    metrics: Sequence[Metric], records: Sequence[Mapping[str, Any]], where: str
) -> dict[str, dict[str, list[float]]]:
    """{item: {metric: [numerator, denominator]}} from a run's `items.jsonl` (item scores of
    the result model). An item is its id plus its row keys (e.g. a scoring mode)."""
    out: dict[str, dict[str, list[float]]] = {}
    for n, rec in enumerate(records, 1):
        if "item_id" not in rec:
            raise DataError("item score without an item id", file=where, item=str(n))
        key = str(rec["item_id"]) + "".join(f"|{v}" for v in (rec.get("keys") or {}).values())
        score = ItemScore(
            key,
            values=rec.get("values") or {},
            parts={k: (float(v[0]), float(v[1])) for k, v in (rec.get("parts") or {}).items()},
        )
        acc = out.setdefault(key, {})
        for m in metrics:
            got = item_parts(m, score)
            if got is not None:
                num, den = acc.setdefault(m.name, [0.0, 0.0]), got
                num[0] += m.scale * den[0]
                num[1] += den[1]
    return out


def bootstrap_declared(
    metrics: Sequence[Metric],
    a: Sequence[Mapping[str, Any]],
    b: Sequence[Mapping[str, Any]],
    resamples: int = 10_000,
    seed: int = 0,
    where: tuple[str, str] = ("A", "B"),
    min_items: int = MIN_PAIRED_ITEMS,
) -> tuple[dict[str, dict[str, Any]], int]:
    """Paired bootstrap of every declared metric over the items both runs scored (each metric
    over the items where both define it); fewer than `min_items`: nothing tested."""
    sa, sb = declared_sums(metrics, a, where[0]), declared_sums(metrics, b, where[1])
    shared = sorted(set(sa) & set(sb))
    out: dict[str, dict[str, Any]] = {}
    for m in metrics:
        both = [i for i in shared if m.name in sa[i] and m.name in sb[i]]
        if len(both) < max(2, min_items):
            continue
        cols = [[s[i][m.name][k] for i in both] for s in (sa, sb) for k in (0, 1)]
        try:
            r = paired_bootstrap(cols[0], cols[1], cols[2], cols[3], resamples, seed)
        except ValueError:
            continue
        out[m.name] = {
            "a": r.a, "b": r.b, "delta": r.delta, "ci_low": r.ci_low, "ci_high": r.ci_high,
            "p_value": r.p_value, "n_items": r.n_items, "resamples": r.resamples,
            "higher_is_better": m.higher_is_better,
        }  # fmt: skip
    return out, len(shared)


def item_sums(
    records: Sequence[Mapping[str, Any]], where: str
) -> dict[str, dict[str, list[float]]]:
    """{item_id: {metric: [numerator, denominator]}} from a run's insight-level scores."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: {m: [0.0, 0.0] for m in POOLED})
    for n, rec in enumerate(records, 1):
        if "item_id" not in rec:
            raise DataError("insight score without an item id", file=where, item=str(n))
        acc = out[str(rec["item_id"])]
        for metric, (num, den) in _insight_parts(rec, f"{where}:{n}").items():
            acc[metric][0] += num
            acc[metric][1] += den
    return dict(out)


def bootstrap_metrics(
    a: Sequence[Mapping[str, Any]],
    b: Sequence[Mapping[str, Any]],
    resamples: int = 10_000,
    seed: int = 0,
    where: tuple[str, str] = ("A", "B"),
) -> tuple[dict[str, dict[str, Any]], int]:
    """Paired bootstrap of every pooled metric over the items both runs scored."""
    sa, sb = item_sums(a, where[0]), item_sums(b, where[1])
    shared = sorted(set(sa) & set(sb))
    if not shared:
        raise LfbenchError(
            f"runs {where[0]} and {where[1]} share no scored item: nothing to pair "
            "(different datasets or subtopics?)"
        )
    out: dict[str, dict[str, Any]] = {}
    for m in POOLED:
        cols = [[s[i][m][k] for i in shared] for s in (sa, sb) for k in (0, 1)]
        if sum(cols[1]) == 0 or sum(cols[3]) == 0:
            continue
        try:
            r = paired_bootstrap(cols[0], cols[1], cols[2], cols[3], resamples, seed)
        except ValueError:
            continue
        out[m] = {
            "a": r.a,
            "b": r.b,
            "delta": r.delta,
            "ci_low": r.ci_low,
            "ci_high": r.ci_high,
            "p_value": r.p_value,
            "n_items": r.n_items,
            "resamples": r.resamples,
        }
    return out, len(shared)


def _diff(a: Mapping[str, str], b: Mapping[str, str]) -> dict[str, list[str | None]]:
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _artifact(client: Any, run_id: str, name: str) -> list[dict[str, Any]] | None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    names = {f.path for f in client.list_artifacts(run_id)}
    if name not in names:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(client.download_artifacts(run_id, name, tmp))
        return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _judgements(client: Any, run_id: str) -> list[dict[str, Any]] | None:
    return _artifact(client, run_id, "judgements.jsonl")


def _declared(benchmark: str | None) -> tuple[Metric, ...]:
    from pipeline.core import registry

    if not benchmark or benchmark not in registry.names():
        return ()
    return tuple(registry.get(benchmark).metrics)


def _reading(root: Path) -> Any:
    """A failure of the store while reading runs: one line, its password masked."""
    from pipeline.stages.mlflow_store import store_errors
    from pipeline.stages.tracking import tracking_uri

    return store_errors(tracking_uri(root), "reading its runs")


def group_keys(benchmark: str) -> tuple[str, ...]:
    """The keys besides model, setting and judge that tell a benchmark's rows apart (its result
    model's `group_keys`: SummHay's domain, collection and mode; CRUX's domain, ...)."""
    from pipeline.core import registry

    if benchmark not in registry.names():
        return ()
    results = registry.get(benchmark).results
    # and the run tags the benchmark declares (CRUX's retriever and cut-off)
    tags = tuple(t for t in results.runs.tags if t not in results.group_keys and "." not in t)
    return (*results.group_keys, *tags)


def find_run(
    root: Path,
    benchmark: str,
    name: str,
    setting: str | None = None,
    judge: str | None = None,
    keys: Mapping[str, str] | None = None,
) -> str:
    """The id of the current run of `benchmark` whose model entry or system is `name`, whose
    run name is `name`, or whose context came from the retriever `name` (an entry of yours, or
    a benchmark's own, e.g. CRUX's bm25), with the given setting, judge and values of the
    benchmark's group keys and run tags (`keys`, e.g. {"domain": "news"}): an error saying what
    tells the candidates apart (and their run names) when none or several match."""
    keys = dict(keys or {})
    known = group_keys(benchmark)
    for k in keys:
        if k not in known:
            have = ", ".join(f"--{g}" for g in known) or "none"
            raise LfbenchError(f"--{k}: not a group key of {benchmark} (its keys: {have})")
    with _reading(root):
        return _find_run(root, benchmark, name, setting, judge, keys, known)


def _find_run(
    root: Path,
    benchmark: str,
    name: str,
    setting: str | None,
    judge: str | None,
    keys: Mapping[str, str],
    known: Sequence[str],
) -> str:
    from pipeline.stages.tracking import CURRENT, _client

    client = _client(root)
    exp = client.get_experiment_by_name(benchmark)
    if exp is None:
        raise LfbenchError(f"no MLflow experiment {benchmark!r}: run `dvc repro` first")
    runs = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{CURRENT}` = 'true'", max_results=5000
    )

    def fits(r: Any) -> bool:
        t = r.data.tags
        return (
            name
            in (
                t.get("model.entry"),
                t.get("model.name"),
                r.info.run_name,
                t.get("retriever.name"),
                t.get("retriever"),
            )
            and setting in (None, t.get("setting"))
            and judge in (None, t.get("judge.name"))
            and all(t.get(k) == v for k, v in keys.items())
        )

    found = [r for r in runs if fits(r)]
    if len(found) == 1:
        return str(found[0].info.run_id)
    what = f"{benchmark} runs of {name!r}" + (f", setting {setting!r}" if setting else "")
    what += f", judge {judge!r}" if judge else ""
    what += "".join(f", {k} {v!r}" for k, v in keys.items())
    if not found:
        raise LfbenchError(f"no current {what} in the MLflow store")
    selectors = [("--setting", "setting"), ("--judge", "judge.name")]
    selectors += [(f"--{k}", k) for k in known]
    differ = []
    for flag, tag in selectors:
        values = sorted({str(r.data.tags.get(tag, "-")) for r in found})
        if len(values) > 1:
            differ.append(f"{flag} ({', '.join(values)})")
    names = sorted({r.info.run_name for r in found})[:12]
    narrow = (
        f"they differ in {', '.join(differ)}: narrow with those (one value for both runs, or"
        " two: A's then B's), or"
        if differ
        else "nothing tells them apart but their run names:"
    )
    raise LfbenchError(
        f"{len(found)} current {what}: {narrow} name one by its run name (e.g. "
        + "; ".join(names)
        + ")"
    )


# The smallest bootstrap that can give a sound answer: with R resamples a p-value moves in
# steps of 2/R and the interval's 2.5 and 97.5 percentiles rest on 0.025 * R resamples each.
MIN_RESAMPLES = 1000


def check_bootstrap(resamples: int, seed: int) -> None:
    """Refuse a bootstrap that cannot give a sound answer (rather than claim one)."""
    if resamples < MIN_RESAMPLES:
        raise LfbenchError(
            f"{resamples} resamples: a paired bootstrap needs at least {MIN_RESAMPLES} resamples"
            f" (with R of them a p-value moves in steps of 2/R, and each end of the 95% interval"
            f" rests on 2.5% of them)"
        )
    if seed < 0:
        raise LfbenchError(f"seed {seed}: a bootstrap seed is a whole number, 0 or more")


def _sums(
    declared: Sequence[Metric], records: Sequence[Mapping[str, Any]], where: str
) -> dict[str, dict[str, list[float]]]:
    return declared_sums(declared, records, where) if declared else item_sums(records, where)


def paired_points(
    sa: Mapping[str, Mapping[str, Sequence[float]]],
    sb: Mapping[str, Mapping[str, Sequence[float]]],
    names: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """Each metric of both systems on the items both scored (and both define it for): the
    pooled values (sum of numerators over sum of denominators), their difference, and how many
    items. What compare shows as A and B: the same items for both."""
    shared = sorted(set(sa) & set(sb))
    out: dict[str, dict[str, Any]] = {}
    for m in names:
        both = [i for i in shared if m in sa[i] and m in sb[i]]
        den_a = sum(sa[i][m][1] for i in both)
        den_b = sum(sb[i][m][1] for i in both)
        if not both or den_a == 0 or den_b == 0:
            continue
        a = sum(sa[i][m][0] for i in both) / den_a
        b = sum(sb[i][m][0] for i in both) / den_b
        out[m] = {"a": a, "b": b, "delta": b - a, "n_items": len(both)}
    return out


def _experiment(client: Any, run: Any) -> str:
    tag = run.data.tags.get("benchmark")
    if tag:
        return str(tag)
    exp = client.get_experiment(run.info.experiment_id)
    return str(exp.name if exp is not None else run.info.experiment_id)


def compare_named(
    root: Path,
    benchmark: str | None,
    run_a: str,
    run_b: str,
    named: Sequence[tuple[str, str | None, str | None, Mapping[str, str]]] | None,
    resamples: int,
    seed: int,
    min_items: int,
) -> dict[str, Any]:
    """`compare_runs` of run ids A and B, or, with `named`, of the current runs `find_run`
    gives for (name, setting, judge, keys) of A and of B in `benchmark`."""
    if named is not None:
        assert benchmark is not None
        run_a, run_b = (find_run(root, benchmark, *side) for side in named)
    return compare_runs(root, run_a, run_b, resamples=resamples, seed=seed, min_items=min_items)


def compare_runs(
    root: Path,
    run_a: str,
    run_b: str,
    resamples: int = 10_000,
    seed: int = 0,
    min_items: int = MIN_PAIRED_ITEMS,
) -> dict[str, Any]:
    check_bootstrap(resamples, seed)
    with _reading(root):
        return _compare_runs(root, run_a, run_b, resamples, seed, min_items)


def _compare_runs(
    root: Path,
    run_a: str,
    run_b: str,
    resamples: int,
    seed: int,
    min_items: int,
) -> dict[str, Any]:
    from mlflow.exceptions import MlflowException

    from pipeline.stages.tracking import _client

    client = _client(root)
    runs = []
    for rid in (run_a, run_b):
        try:
            runs.append(client.get_run(rid))
        except MlflowException as e:
            if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise  # the store failed: said in one line by `_reading`
            raise LfbenchError(f"MLflow run {rid!r}: not found in the store ({e})") from e
    ra, rb = runs
    bench_a, bench_b = _experiment(client, ra), _experiment(client, rb)
    if bench_a != bench_b or ra.info.experiment_id != rb.info.experiment_id:
        raise LfbenchError(
            f"run A is a {bench_a} run, run B a {bench_b} run: two benchmarks: {bench_a} and"
            f" {bench_b}; their metrics measure different things on different items (compare"
            " two runs of one benchmark)"
        )
    tags = [{k: v for k, v in r.data.tags.items() if not k.startswith(_BOOKKEEPING)} for r in runs]
    ma, mb = ra.data.metrics, rb.data.metrics
    metrics: dict[str, dict[str, Any]] = {}
    for k in sorted(set(ma) | set(mb)):
        if k.endswith(INTERVAL_BOUNDS):
            continue  # a row's own interval, not a metric of the system
        a, b = ma.get(k), mb.get(k)
        metrics[k] = {"a": a, "b": b, "delta": None if a is None or b is None else b - a}
    declared = main_first = _declared(ra.data.tags.get("benchmark"))
    ja, jb = _artifact(client, run_a, "items.jsonl"), _artifact(client, run_b, "items.jsonl")
    if not (declared and ja is not None and jb is not None):
        declared = ()
        ja, jb = _judgements(client, run_a), _judgements(client, run_b)
    n_shared = 0
    note = None
    points: dict[str, dict[str, Any]] = {}
    tested: dict[str, dict[str, Any]] = {}
    if ja is None or jb is None:
        note = "no item scores (items.jsonl) on both runs: no paired comparison, no test"
    else:
        sa, sb = _sums(declared, ja, run_a), _sums(declared, jb, run_b)
        names = [m.name for m in declared] if declared else list(POOLED)
        points = paired_points(sa, sb, names)
        n_shared = len(set(sa) & set(sb))
        if n_shared == 0:
            note = "the runs share no scored item: nothing to pair (different datasets or slices?)"
        elif n_shared < max(2, min_items):
            note = (
                f"only {n_shared} shared item{'s' if n_shared != 1 else ''} (fewer than"
                f" {max(2, min_items)}): too few to say anything; no interval, nothing marked"
                " significant"
            )
        elif declared:
            tested, _ = bootstrap_declared(
                declared, ja, jb, resamples, seed, (run_a, run_b), min_items
            )
        else:
            tested, _ = bootstrap_metrics(ja, jb, resamples, seed, (run_a, run_b))
    for k, pt in points.items():
        entry = metrics.setdefault(k, {"a": None, "b": None, "delta": None})
        entry.update(
            {
                "run_a": entry["a"],
                "run_b": entry["b"],
                "pooled_a": pt["a"],
                "pooled_b": pt["b"],
                "paired_delta": pt["delta"],
                "n_items": pt["n_items"],
            }
        )
    for k, res in tested.items():
        metrics.setdefault(k, {}).update(
            {
                "pooled_a": res["a"],
                "pooled_b": res["b"],
                "paired_delta": res["delta"],
                "ci_low": res["ci_low"],
                "ci_high": res["ci_high"],
                "p_value": res["p_value"],
                "n_items": res["n_items"],
                # a zero interval (e.g. a run against itself) is never significant
                "significant": res["p_value"] < 0.05 and res["ci_low"] != res["ci_high"],
            }
        )
    # the benchmark's metrics in their declared order, its main one first; then the others
    order = [m.name for m in main_first if m.name in metrics]
    order += sorted(k for k in metrics if k not in order)
    metrics = {k: metrics[k] for k in order}
    return {
        "run_a": {"id": run_a, "name": ra.info.run_name, "flags": _flags(ra)},
        "run_b": {"id": run_b, "name": rb.info.run_name, "flags": _flags(rb)},
        "benchmark": bench_a,
        "params": _diff(ra.data.params, rb.data.params),
        "tags": _diff(tags[0], tags[1]),
        "metrics": metrics,
        "n_shared_items": n_shared,
        "n_items": [len({r["item_id"] for r in j}) if j else 0 for j in (ja, jb)],
        "min_paired_items": max(2, min_items),
        "resamples": resamples,
        # the smallest p-value above 0 that R resamples can give: 0 means p < this
        "p_resolution": 2 / resamples,
        "seed": seed,
        "note": note,
    }


def _flags(run: Any) -> list[str]:
    """Why a run's numbers should not be read as they stand (its row's flags: copied answers,
    prompts past the context window, cut answers), from its tag `lfbench.flags`."""
    tag = run.data.tags.get("lfbench.flags")
    return [f for f in str(tag).split("; ") if f] if tag else []


INTERVAL_BOUNDS = ("_ci_low", "_ci_high")


def _f(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart (the first left-aligned)."""
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    return [
        "  "
        + "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in (head, *rows)
    ]


def _items(n: int) -> str:
    return f"{n} item{'' if n == 1 else 's'}"


def _p(m: Mapping[str, Any], resolution: float) -> str:
    if "p_value" not in m:
        return ""
    if m["p_value"] == 0:
        return f"<{resolution:.4f}"  # no resample crossed zero: p is below what R can resolve
    return f"{m['p_value']:.4f}"


def render_text(res: Mapping[str, Any]) -> str:
    lines = [
        f"A: {res['run_a']['id']}  {res['run_a']['name']}",
        f"B: {res['run_b']['id']}  {res['run_b']['name']}",
    ]
    for side in ("a", "b"):
        lines += [f"  {side.upper()} flagged: {f}" for f in res[f"run_{side}"].get("flags", [])]
    lines += ["", "params that differ (A -> B):"]
    lines += [f"  {k}: {_f(a)} -> {_f(b)}" for k, (a, b) in res["params"].items()] or ["  none"]
    lines.append("lineage tags that differ (A -> B):")
    lines += [f"  {k}: {_f(a)} -> {_f(b)}" for k, (a, b) in res["tags"].items()] or ["  none"]
    lines.append("")
    n, (n_a, n_b) = res["n_shared_items"], res["n_items"]
    paired = {k: m for k, m in res["metrics"].items() if "pooled_a" in m}
    if res["note"]:
        lines.append(res["note"])
    else:
        lines.append(
            f"paired bootstrap over {n} shared items, {res['resamples']} resamples, seed"
            f" {res['seed']}; delta = B - A"
        )
    if paired:
        lines.append(
            f"A and B: both systems on the {n} shared item{'' if n == 1 else 's'}"
            + (f" (A's run has {_items(n_a)}, B's {_items(n_b)})" if (n_a, n_b) != (n, n) else "")
        )
        rows = []
        for k, m in paired.items():
            ci = f"[{_f(m['ci_low'])}, {_f(m['ci_high'])}]" if "ci_low" in m else ""
            star = "*" if m.get("significant") else ""
            rows.append(
                [
                    k,
                    _f(m["pooled_a"]),
                    _f(m["pooled_b"]),
                    _f(m["paired_delta"]),
                    ci,
                    _p(m, res["p_resolution"]),
                    star,
                ]
            )
        lines += _table(["metric", "A", "B", "delta", "95% CI", "p", ""], rows)
    whole_differs = (n_a, n_b) != (n, n)
    others = {
        k: m
        for k, m in res["metrics"].items()
        if (k not in paired or whole_differs) and m.get("a") != m.get("b")
    }
    hidden = sum(1 for k, m in res["metrics"].items() if k not in paired and k not in others)
    if others:
        lines.append("the whole runs (each on its own items; not paired):")
        rows = [[k, _f(m.get("a")), _f(m.get("b")), _f(m.get("delta"))] for k, m in others.items()]
        lines += _table(["metric", "A", "B", "delta"], rows)
    foot = []
    if any("p_value" in m for m in paired.values()):
        foot.append(
            f"* p < 0.05 (p resolves to {res['p_resolution']:.4f} with {res['resamples']}"
            " resamples)"
        )
    if hidden:
        foot.append(f"{hidden} other metrics are equal in both runs")
    if foot:
        lines.append("; ".join(foot))
    return "\n".join(lines) + "\n"
