"""`lfbench compare A B`: what differs between two MLflow runs of the project store.

A and B are run ids, or, with `--benchmark`, systems by name (a model entry or a system, with
`--setting` and `--judge` where the name alone is ambiguous): the current run of each.

Params and lineage tags that differ, and for each metric the delta B - A. Every metric a
benchmark declares (`pipeline/core/results.py`) comes with a 95% interval and a p-value from a
paired bootstrap over the items both runs scored, read from each run's `items.jsonl` artifact: a
`mean` metric resamples item values, a `ratio` metric resamples summed numerators and
denominators (SummHay's runs of before the result model: its `judgements.jsonl`). With fewer
than `MIN_PAIRED_ITEMS` shared items nothing is tested, and the output says so.
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


def find_run(
    root: Path,
    benchmark: str,
    name: str,
    setting: str | None = None,
    judge: str | None = None,
) -> str:
    with _reading(root):
        return _find_run(root, benchmark, name, setting, judge)


def _find_run(
    root: Path,
    benchmark: str,
    name: str,
    setting: str | None = None,
    judge: str | None = None,
) -> str:
    """The id of the current run of `benchmark` whose model entry or system is `name`, or whose
    run name is `name` (and whose setting and judge are the given ones): an error listing the
    candidates' run names when none or several match."""
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
            name in (t.get("model.entry"), t.get("model.name"), r.info.run_name)
            and setting in (None, t.get("setting"))
            and judge in (None, t.get("judge.name"))
        )

    found = [r for r in runs if fits(r)]
    if len(found) == 1:
        return str(found[0].info.run_id)
    what = f"{benchmark} runs of {name!r}" + (f", setting {setting!r}" if setting else "")
    what += f", judge {judge!r}" if judge else ""
    if not found:
        raise LfbenchError(f"no current {what} in the MLflow store")
    names = sorted({r.info.run_name for r in found})[:12]
    raise LfbenchError(
        f"{len(found)} current {what}: narrow with --setting/--judge, or name one by its run"
        " name (e.g. " + "; ".join(names) + ")"
    )


def compare_runs(
    root: Path,
    run_a: str,
    run_b: str,
    resamples: int = 10_000,
    seed: int = 0,
    min_items: int = MIN_PAIRED_ITEMS,
) -> dict[str, Any]:
    with _reading(root):
        return _compare_runs(root, run_a, run_b, resamples, seed, min_items)


def _compare_runs(
    root: Path,
    run_a: str,
    run_b: str,
    resamples: int = 10_000,
    seed: int = 0,
    min_items: int = MIN_PAIRED_ITEMS,
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
    tags = [{k: v for k, v in r.data.tags.items() if not k.startswith(_BOOKKEEPING)} for r in runs]
    metrics: dict[str, dict[str, Any]] = {}
    ma, mb = ra.data.metrics, rb.data.metrics
    for k in sorted(set(ma) | set(mb)):
        a, b = ma.get(k), mb.get(k)
        metrics[k] = {"a": a, "b": b, "delta": None if a is None or b is None else b - a}
    declared = _declared(ra.data.tags.get("benchmark"))
    ia, ib = _artifact(client, run_a, "items.jsonl"), _artifact(client, run_b, "items.jsonl")
    n_shared = 0
    note = None
    tested: dict[str, dict[str, Any]] = {}
    ja: list[dict[str, Any]] | None
    jb: list[dict[str, Any]] | None
    if declared and ia is not None and ib is not None:
        ja, jb = ia, ib
        tested, n_shared = bootstrap_declared(
            declared, ia, ib, resamples, seed, (run_a, run_b), min_items
        )
    else:
        ja, jb = _judgements(client, run_a), _judgements(client, run_b)
        if ja is not None and jb is not None:
            tested, n_shared = bootstrap_metrics(ja, jb, resamples, seed, (run_a, run_b))
            if n_shared < max(2, min_items):
                tested = {}
    if ja is None or jb is None:
        note = "no item scores (items.jsonl) on both runs: no significance test"
    elif n_shared < max(2, min_items):
        note = (
            f"only {n_shared} shared items (fewer than {max(2, min_items)}): too few to say"
            " anything; no interval, nothing marked significant"
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
    return {
        "run_a": {"id": run_a, "name": ra.info.run_name},
        "run_b": {"id": run_b, "name": rb.info.run_name},
        "params": _diff(ra.data.params, rb.data.params),
        "tags": _diff(tags[0], tags[1]),
        "metrics": metrics,
        "n_shared_items": n_shared,
        "n_items": [len({r["item_id"] for r in j}) if j else 0 for j in (ja, jb)],
        "min_paired_items": max(2, min_items),
        "resamples": resamples,
        "seed": seed,
        "note": note,
    }


def _f(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def render_text(res: Mapping[str, Any]) -> str:
    lines = [
        f"A: {res['run_a']['id']}  {res['run_a']['name']}",
        f"B: {res['run_b']['id']}  {res['run_b']['name']}",
        "",
        "params that differ (A -> B):",
    ]
    lines += [f"  {k}: {_f(a)} -> {_f(b)}" for k, (a, b) in res["params"].items()] or ["  none"]
    lines.append("lineage tags that differ (A -> B):")
    lines += [f"  {k}: {_f(a)} -> {_f(b)}" for k, (a, b) in res["tags"].items()] or ["  none"]
    lines.append("")
    if res["note"]:
        lines.append(res["note"])
        if res["n_shared_items"]:
            lines.append(f"(A has {res['n_items'][0]} items, B {res['n_items'][1]})")
    else:
        lines.append(
            f"paired bootstrap over {res['n_shared_items']} shared items "
            f"(A has {res['n_items'][0]}, B {res['n_items'][1]}), {res['resamples']} resamples, "
            f"seed {res['seed']}; delta = B - A"
        )
    lines.append(f"  {'metric':<28}{'A':>10}{'B':>10}{'delta':>10}{'95% CI':>22}{'p':>8}")
    hidden = 0
    for k, m in res["metrics"].items():
        if "p_value" not in m and m.get("a") == m.get("b"):
            hidden += 1
            continue
        ci = f"[{m['ci_low']:.2f}, {m['ci_high']:.2f}]" if "ci_low" in m else ""
        p = f"{m['p_value']:.4f}" if "p_value" in m else ""
        star = " *" if m.get("significant") else ""
        lines.append(
            f"  {k:<28}{_f(m.get('a')):>10}{_f(m.get('b')):>10}{_f(m.get('delta')):>10}"
            f"{ci:>22}{p:>8}{star}"
        )
    lines.append(
        "* p < 0.05" + (f"; {hidden} other metrics are equal in both runs" if hidden else "")
    )
    return "\n".join(lines) + "\n"
