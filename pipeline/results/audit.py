"""`lfbench audit`: people audit a judge on one run's own outputs.

`lfbench audit sample` draws n of the verdicts a judge gave on one result row (one MLflow run:
a model, a setting, a judge; SummHay: an insight against a summary; Long²RAG: a key point
against an answer), seeded and stratified (`pipeline.metrics.audit.systematic_sample`), and
puts each where a person can label it:

- an MLflow trace linked to the row's run: its inputs are what the judge saw (the benchmark's
  `Audit.view`) and the label scale; blind: nothing on it says what the judge decided (its
  output says what to give); a person adds a feedback assessment named after the scale (source
  HUMAN) in the UI's trace view, read back by the output and target ids the trace carries;
- a CSV file (`audits/<sample>.csv`) to fill in a spreadsheet: one line per unit, the inputs,
  an empty `label` column (blind too; a cell a spreadsheet would run as a formula starts
  with ').

Units are numbered in a seeded random order, so the first k a person labels are a random
subset of the draw. The sample itself is `audits/<sample>.json`: the run, the judge's prompt
hash, and per unit the generation id with a hash of its text, the reference unit and the
judge's label (`audit score` takes the judge's labels from the run's judgements). Nothing about
it changes the run's metrics or identity: the run gets an `audit.samples` tag, and `audit.*`
tags and metrics are left out of what the MLflow sync compares (`tracking.stored_fingerprint`).

`lfbench audit score` reads the labels (HUMAN assessments on the sample's traces, and a CSV
given with `--labels`, which wins where both label a unit), checks that they still apply (the
row's judge has the sample's prompt hash and every sampled output its text hash: labels made for
another judge version or another output are refused, by name), and computes, on the current
run of the row: the judge's Cohen's kappa against the person with a bootstrap interval and n;
the power-tuned prediction-powered estimate of the metric the verdicts make
(`Audit.scale().metric`) with its 95% interval (`pipeline.metrics.audit.ppi_mean`), the interval
of the human labels alone, the judge-by-person confusion matrix and the units where they
disagree. It logs the figures on the run (`audit.kappa`, `audit.n`, `audit.<metric>_ppi` with
`_ci_low/_ci_high`, ...) and writes `audits/<sample>.score.json`, which `lfbench report` shows.
Re-running it after more labels updates the same run.

`lfbench audit score --released` takes the labels people already made on a benchmark's
released outputs (`Audit.released`: SummHay's 1,419 annotated verdicts): each row of a released
system with at least `--min-labels` labels of its system, setting and domain gets its own kappa
and corrected score.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from pipeline.core.benchmark import AnyBenchmark, Audit, AuditScale, Context, PriorLabel
from pipeline.core.config import Params
from pipeline.core.errors import ConfigError, DataError, LfbenchError
from pipeline.core.io import from_spreadsheet, read_jsonl, to_spreadsheet, write_json
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.metrics.audit import (
    Estimate,
    audit_kappa,
    ppi_mean,
    systematic_sample,
)

log = logging.getLogger(__name__)

AUDITS = Path("audits")
SAMPLE_TAG = "lfbench.audit.sample"
UNIT_TAG = "lfbench.audit.unit"
# the verdict a trace shows (what its labels are matched on): the output, its text hash, the target
TRACE_OUTPUT, TRACE_SHA, TRACE_TARGET = "generation.id", "generation.sha", "target.id"
RUN_SAMPLES = "audit.samples"  # the run's tag: the samples made of it
PENDING = "audit.pending"  # tracking.AUDIT_PENDING: a new run of an audited row
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Scale(_Strict):
    name: str
    labels: tuple[str, ...]
    values: dict[str, float]
    metric: str | None
    meaning: str
    per_item: bool = False

    @classmethod
    def of(cls, s: AuditScale) -> Scale:
        return cls(
            name=s.name,
            labels=s.labels,
            values=dict(s.values),
            metric=s.metric,
            meaning=s.meaning,
            per_item=s.per_item,
        )

    def describe(self) -> str:
        return f"{self.name}: {' | '.join(self.labels)}"


class Unit(_Strict):
    unit: str
    item_id: str
    generation_id: str
    generation_sha: str
    target_id: str
    judge_label: str
    inputs: dict[str, str]
    trace_id: str | None = None


class Sample(_Strict):
    version: Literal[1] = 1
    sample: str
    benchmark: str
    run_id: str
    run_name: str
    row_key: str
    model: str
    system: str
    setting: str
    judge: str
    judge_prompt_sha: str
    scale: Scale
    seed: int
    n_units: int  # the row's verdicts it was drawn from
    units: list[Unit]


def text_sha(text: str | None) -> str:
    return hashlib.sha256((text or "").encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- a row's verdicts


@dataclass(frozen=True)
class RowVerdict:
    generation: Generation
    judgement: Judgement
    verdict: Verdict


def capability(bench: AnyBenchmark) -> Audit[Any, Any]:
    if bench.audit is None:
        raise ConfigError(f"benchmark {bench.name} has no audit (its verdicts cannot be shown)")
    return bench.audit


def _client(root: Path) -> Any:
    from pipeline.stages.tracking import _client as client

    return client(root)


def _experiment_id(client: Any, benchmark: str) -> str:
    exp = client.get_experiment_by_name(benchmark)
    if exp is None:
        raise LfbenchError(f"no MLflow experiment {benchmark!r}: run `dvc repro` first")
    return str(exp.experiment_id)


def get_run(client: Any, run_id: str, benchmark: str) -> Any:
    """The run `--run` names, or one line saying why not: no such run in the store (an unknown
    or malformed id), or a run of another benchmark's experiment."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise LfbenchError(
            f"--run {run_id!r}: no MLflow run with this id in the project's store (copy the id"
            f" from the run's page in `lfbench ui`, or name the run with --model)"
        ) from None
    exp_id = _experiment_id(client, benchmark)
    if run.info.experiment_id != exp_id:
        exp = client.get_experiment(run.info.experiment_id)
        raise LfbenchError(
            f"--run {run_id!r}: a run of experiment {exp.name!r}, not of {benchmark!r}"
        )
    return run


def current_run(client: Any, benchmark: str, row_key: str) -> Any:
    """The current run of a result row (by its `lfbench.row_key`)."""
    from pipeline.stages.tracking import CURRENT, ROW_KEY

    exp_id = _experiment_id(client, benchmark)
    quoted = row_key.replace("'", "\\'")
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{ROW_KEY}` = '{quoted}' and tags.`{CURRENT}` = 'true'",
        max_results=10,
    )
    if not runs:
        raise LfbenchError(f"{benchmark}: no current MLflow run of row {row_key!r}")
    return max(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def row_items(client: Any, run: Any) -> set[str]:
    """The item ids the run's row scored (its `items.jsonl` artifact)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = Path(client.download_artifacts(run.info.run_id, "items.jsonl", tmp))
        except Exception as e:
            raise LfbenchError(
                f"run {run.info.run_id} ({run.info.run_name}): no items.jsonl artifact ({e})"
            ) from e
        return {
            str(json.loads(line)["item_id"])
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        }


def row_verdicts(
    bench: AnyBenchmark,
    ctx: Context[Any],
    scale: Scale,
    root: Path,
    run: Any,
    items: set[str],
    dataset: Mapping[str, Any],
) -> list[RowVerdict]:
    """The judge's usable verdicts on the row's outputs: from the pipeline's generations and
    judgements of the run's model entry and judge, for its system and items, those the
    benchmark counts in the row's setting (`Audit.in_row`)."""
    audit = capability(bench)
    p = run.data.params
    for key in ("model", "judge", "system", "setting"):
        if key not in p:
            raise LfbenchError(f"run {run.info.run_id}: no param {key!r}: not a result row")
    model, judge, system, setting = p["model"], p["judge"], p["system"], p["setting"]
    gpath = root / "generations" / bench.name / f"{model}.jsonl"
    jpath = root / "judgements" / bench.name / model / f"{judge}.jsonl"
    for path in (gpath, jpath):
        if not path.exists():
            raise DataError("not found: `dvc repro` (or `dvc pull`) makes it", file=str(path))
    gens = {g.generation_id: g for g in read_jsonl(gpath, Generation)}
    out = []
    for j in read_jsonl(jpath, Judgement):
        if j.system != system or j.item_id not in items or j.item_id not in dataset:
            continue
        if j.status == "error" or j.generation_id not in gens:
            continue
        g, item = gens[j.generation_id], dataset[j.item_id]
        for v in j.verdicts:
            if v.status != "ok" or v.label not in scale.labels:
                continue
            if audit.in_row(ctx, setting, item, g, v.target_id):
                out.append(RowVerdict(g, j, v))
    if not out:
        raise LfbenchError(
            f"run {run.info.run_name}: no usable verdicts of judge {judge} in {jpath}"
        )
    return out


def _context(bench: AnyBenchmark, params: Params, root: Path) -> Context[Any]:
    """The benchmark's section and read access (an audit needs no prompt file)."""
    from pipeline.stages.common import FileInputs

    return Context(params, params.section(bench.name, bench.params_model), {}, FileInputs(root), "")


def _items(bench: AnyBenchmark, root: Path) -> Mapping[str, Any]:
    from pipeline.stages.common import read_dataset

    return bench.items(read_dataset(bench, root / "datasets" / f"{bench.name}.jsonl"))


# ---------------------------------------------------------------- sample


def sample_path(root: Path, name: str) -> Path:
    return root / AUDITS / f"{name}.json"


def load_sample(root: Path, name: str) -> Sample:
    path = sample_path(root, name)
    if not path.exists():
        raise DataError(
            f"no audit sample {name!r}: `lfbench audit sample` makes it", file=str(path)
        )
    raw = path.read_bytes()
    try:
        sample = Sample.model_validate_json(raw)
    except ValueError as e:
        raise DataError(f"not an audit sample: {e}", file=str(path)) from e
    _check_units(sample, raw.decode("utf-8", errors="replace"), path)
    return sample


def _check_units(sample: Sample, text: str, path: Path) -> None:
    """A hand-edited sample with one unit name twice, or one verdict under two names, is
    refused (it would count one label twice), naming the units and their lines."""
    first: dict[str, Unit] = {}
    verdicts: dict[tuple[str, str], Unit] = {}
    for u in sample.units:
        if u.unit in first:
            at = [
                str(n)
                for n, line in enumerate(text.splitlines(), 1)
                if re.search(rf'"unit"\s*:\s*{re.escape(json.dumps(u.unit))}', line)
            ]
            where = f"lines {' and '.join(at)}" if len(at) > 1 else "twice"
            raise DataError(
                f"unit {u.unit} is in the sample twice ({where}): each unit is one verdict;"
                " rename or remove one (or make a new sample)",
                file=str(path),
                field="units",
            )
        first[u.unit] = u
        key = (u.generation_id, u.target_id)
        if key in verdicts:
            raise DataError(
                f"units {verdicts[key].unit} and {u.unit}: the same verdict ({u.target_id} of"
                f" output {u.generation_id}) twice: remove one (or make a new sample)",
                file=str(path),
                field="units",
            )
        verdicts[key] = u


def make_sample(
    root: Path,
    params: Params,
    bench: AnyBenchmark,
    run_id: str,
    n: int,
    seed: int,
    name: str | None = None,
    *,
    traces: bool = True,
) -> tuple[Sample, Path]:
    """Draw n of the run's verdicts, write the sample and its CSV, log one trace per unit."""
    audit = capability(bench)
    ctx = _context(bench, params, root)
    scale = Scale.of(audit.scale(ctx))
    client = _client(root)
    run = get_run(client, run_id, bench.name)
    from pipeline.stages.tracking import CURRENT, ROW_KEY

    if run.data.tags.get(CURRENT) != "true":
        raise LfbenchError(
            f"run {run_id} ({run.info.run_name}) is not current: audit the current one"
        )
    items = _items(bench, root)
    population = row_verdicts(bench, ctx, scale, root, run, row_items(client, run), items)
    if n > len(population):
        raise LfbenchError(
            f"run {run.info.run_name}: {n} asked, but its judge gave {len(population)} verdicts"
        )
    shas = sorted({v.judgement.judge_prompt_sha for v in population})
    if len(shas) != 1:
        raise LfbenchError(
            f"run {run.info.run_name}: its verdicts come from several judge versions ({shas})"
        )
    strata = [v.verdict.label for v in population]
    picked = systematic_sample(strata, [v.generation.generation_id for v in population], n, seed)
    p = run.data.params
    name = name or f"{bench.name}-{_slug(run.info.run_name)}-n{n}-s{seed}"
    if not _NAME.match(name):
        raise LfbenchError(f"sample name {name!r}: letters, digits, '.', '_' and '-' only")
    width = len(str(n))
    units = []
    # numbered in a seeded random order, not in file order: the first k units a person labels
    # (u01, u02, ...) are then a random subset of the drawn ones, not the first outputs' verdicts
    order = [picked[int(j)] for j in np.random.default_rng([seed, 1]).permutation(len(picked))]
    for k, i in enumerate(order, 1):
        v = population[i]
        g = v.generation
        units.append(
            Unit(
                unit=f"u{k:0{width}d}",
                item_id=g.item_id,
                generation_id=g.generation_id,
                generation_sha=text_sha(g.text),
                target_id=v.verdict.target_id,
                judge_label=v.verdict.label,
                inputs=audit.view(ctx, items[g.item_id], g, v.verdict.target_id),
            )
        )
    sample = Sample(
        sample=name,
        benchmark=bench.name,
        run_id=run_id,
        run_name=run.info.run_name,
        row_key=run.data.tags.get(ROW_KEY, ""),
        model=p["model"],
        system=p["system"],
        setting=p["setting"],
        judge=p["judge"],
        judge_prompt_sha=shas[0],
        scale=scale,
        seed=seed,
        n_units=len(population),
        units=units,
    )
    path = sample_path(root, name)
    if path.exists():
        old = load_sample(root, name)
        if _plain(old) != _plain(sample):
            raise LfbenchError(
                f"audit sample {name!r} exists ({path}) and was drawn differently: give --name"
            )
        sample = old  # the same draw: finish what a stopped run left (traces not yet logged)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, sample.model_dump(mode="json"))
    write_csv(root / AUDITS / f"{name}.csv", sample)
    if traces:
        sample = log_traces(client, sample)
        write_json(path, sample.model_dump(mode="json"))
    return sample, path


def _plain(s: Sample) -> dict[str, Any]:
    """A sample as a draw: its verdicts, whatever their numbers and traces."""
    d = s.model_dump(mode="json")
    for u in d["units"]:
        u.pop("trace_id")
        u.pop("unit")
    d["units"].sort(key=lambda u: (u["generation_id"], u["target_id"]))
    return d


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:60]


CSV_FIXED = ("sample", "unit", "item_id", "target_id")


def write_csv(path: Path, sample: Sample) -> None:
    """One line per unit: the inputs the judge saw, the scale, an empty `label` to fill in. A
    cell a spreadsheet would run as a formula gets a leading ' (`to_spreadsheet`)."""
    names = list(dict.fromkeys(k for u in sample.units for k in u.inputs))
    buf = io.StringIO()
    w = csv.writer(buf)
    rows = [[*CSV_FIXED, *names, "scale", "label"]]
    for u in sample.units:
        rows.append(
            [sample.sample, u.unit, u.item_id, u.target_id]
            + [u.inputs.get(k, "") for k in names]
            + [" | ".join(sample.scale.labels), ""]
        )
    # every cell: a model's answer (or an id) starting with = + - @ is not run as a formula
    w.writerows([[to_spreadsheet(c) for c in r] for r in rows])
    from pipeline.core.io import atomic_write_text

    atomic_write_text(path, buf.getvalue())


def log_traces(client: Any, sample: Sample) -> Sample:
    """One trace per unit not traced yet, linked to the sample's run: the inputs the judge saw
    and the scale. Blind: nothing on the trace says what the judge decided (its output is what
    to do, not the verdict; no judge assessment); `audit score` takes the judge's labels from
    the run's judgements, and the sample file keeps them."""
    import mlflow

    exp_id = _experiment_id(client, sample.benchmark)
    scale = sample.scale
    how = (
        f"Add a feedback assessment named {scale.name!r} with one of: "
        f"{', '.join(scale.labels)} ({scale.meaning})"
    )
    todo = f"yours to give: add feedback named {scale.name!r} (the label scale is an input)"
    done = []
    for u in sample.units:
        if u.trace_id is not None:
            done.append(u)
            continue
        span = client.start_trace(
            f"audit {u.unit}: {sample.judge} on {u.item_id}",
            inputs={**u.inputs, "label scale": how},
            tags={
                SAMPLE_TAG: sample.sample,
                UNIT_TAG: u.unit,
                "lfbench.audit.scale": scale.describe(),
                "judge.name": sample.judge,
                "judge.prompt_sha": sample.judge_prompt_sha,
                TRACE_OUTPUT: u.generation_id,
                TRACE_SHA: u.generation_sha,
                TRACE_TARGET: u.target_id,
            },
            experiment_id=exp_id,
            run_id=sample.run_id,
        )
        client.end_trace(span.trace_id, outputs={"label": todo})
        done.append(u.model_copy(update={"trace_id": span.trace_id}))
    mlflow.flush_trace_async_logging()
    run = client.get_run(sample.run_id)
    names = {x for x in run.data.tags.get(RUN_SAMPLES, "").split(",") if x}
    if sample.sample not in names:
        client.set_tag(sample.run_id, RUN_SAMPLES, ",".join(sorted(names | {sample.sample})))
    return sample.model_copy(update={"units": done})


# ---------------------------------------------------------------- labels


@dataclass(frozen=True)
class HumanLabel:
    label: str
    source: str  # "mlflow:<user>" or "<csv file>:<line>"


def _on_scale(value: Any, scale: Scale) -> str | None:
    text = str(value).strip()
    for label in scale.labels:
        if text.lower() == label.lower():
            return label
    return None


_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip
_DELIMITERS = (",", ";", "\t", "|")
_SHOWN = {"\t": "tab"}


def _sheet_text(path: Path) -> str:
    """A filled-in sheet's text: UTF-8, or UTF-8 / UTF-16 as its byte-order mark says; other
    bytes are an error naming the file and line (never a UnicodeDecodeError traceback)."""
    from pipeline.core.io import read_text

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError("not found", file=str(path)) from None
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", file=str(path)) from None
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding).lstrip("\ufeff")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"starts with a {encoding} byte-order mark but is not {encoding} text"
                    f" ({e.reason} at byte {e.start}): save it again as 'CSV UTF-8'",
                    file=str(path),
                ) from None
    try:
        return read_text(path)
    except DataError as e:
        raise DataError(
            f"{e.reason}: save the sheet as 'CSV UTF-8' (or 'Unicode Text', UTF-16)",
            file=e.file,
            line=e.line,
        ) from None


def _delimiter(text: str, path: Path) -> str:
    """The delimiter of a sheet: the first of , ; tab | that makes a header with the `unit`
    and `label` columns (spreadsheets save with semicolons where the decimal mark is a comma,
    with tabs as "Unicode Text"). None does: an error naming the columns it found."""
    first = text.split("\n", 1)[0]
    for d in _DELIMITERS:
        header = next(csv.reader([first], delimiter=d), [])
        names = [from_spreadsheet(h).strip() for h in header]
        if "unit" in names and "label" in names:
            return d
    # the most frequent candidate shows what the header is made of
    d = max(_DELIMITERS, key=first.count)
    header = [h.strip() for h in next(csv.reader([first], delimiter=d), [])]
    missing = "unit" if "unit" not in header else "label"
    shown = _SHOWN.get(d, d)
    raise DataError(
        f"no column {missing!r} in the header (read with delimiter {shown!r}, tried"
        f" {' '.join(_SHOWN.get(x, x) for x in _DELIMITERS)}: columns"
        f" {', '.join(repr(h) for h in header[:12]) or 'none'}); the sheet needs the columns"
        " 'unit' and 'label' of the CSV `audit sample` wrote",
        file=str(path),
        line=1,
    )


def csv_labels(path: Path, sample: Sample) -> dict[str, HumanLabel]:
    """The filled-in labels of a CSV (the `unit` and `label` columns; an empty label is not
    labelled yet), as the project writes it or as a spreadsheet saves it back: UTF-8 (with or
    without a BOM) or UTF-16 with a BOM ("Unicode Text"), cells separated by commas,
    semicolons, tabs or bars (`_delimiter`). A line of another sample, an unknown or repeated
    unit, or a label off the scale is an error naming the file and line."""
    text = _sheet_text(path)
    delimiter = _delimiter(text, path)
    units = {u.unit for u in sample.units}
    out: dict[str, HumanLabel] = {}
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        line = reader.line_num + 1  # where the next record starts (a cell may hold line breaks)
        for number, row in enumerate(reader, 2):
            at, line = line, reader.line_num + 1

            def bad(message: str, field: str, at: int = at, number: int = number) -> DataError:
                return DataError(
                    message, file=str(path), line=at, item=f"sheet row {number}", field=field
                )

            other = from_spreadsheet((row.get("sample") or "").strip())
            if other and other != sample.sample:
                raise bad(
                    f"a label of sample {other!r}, not of {sample.sample!r}: refused", "sample"
                )
            unit = from_spreadsheet((row.get("unit") or "").strip())
            if unit not in units:
                raise bad(
                    f"unknown unit {unit!r}: sample {sample.sample} has {min(units)}..{max(units)}",
                    "unit",
                )
            raw = from_spreadsheet((row.get("label") or "").strip())
            if not raw:
                continue
            label = _on_scale(raw, sample.scale)
            if label is None:
                raise bad(
                    f"label {raw!r} of unit {unit} is off the scale"
                    f" ({' | '.join(sample.scale.labels)})",
                    "label",
                )
            if unit in out:
                raise bad(f"unit {unit} labelled twice (first at {out[unit].source})", "unit")
            out[unit] = HumanLabel(label, f"{path}:{at}")
    return out


def mlflow_labels(client: Any, sample: Sample) -> dict[str, HumanLabel]:
    """The latest valid HUMAN feedback of the scale's name on the sample's traces, by unit. A
    trace's label goes to the unit whose output and target ids (and output text hash) are the
    ones the trace carries, never by unit number alone: a sample redrawn under the same name
    numbers other verdicts u01, u02, ..., and the labels of the earlier draw's traces apply
    only to the verdicts they were made on (under whatever number those have now)."""
    import mlflow

    exp_id = _experiment_id(client, sample.benchmark)
    quoted = sample.sample.replace("'", "\\'")
    traces = mlflow.search_traces(
        locations=[exp_id],
        filter_string=f"tag.`{SAMPLE_TAG}` = '{quoted}'",
        return_type="list",
        max_results=max(1000, 2 * len(sample.units)),
    )
    by_ids = {(u.generation_id, u.target_id): u for u in sample.units}
    latest_of: dict[str, tuple[tuple[int, int], HumanLabel]] = {}
    elsewhere = 0  # traces of verdicts not in this draw of the sample
    for t in traces:
        tags = t.info.tags
        u = by_ids.get((tags.get(TRACE_OUTPUT), tags.get(TRACE_TARGET)))
        if u is None or tags.get(TRACE_SHA) != u.generation_sha:
            elsewhere += 1
            continue
        people = [
            a
            for a in t.info.assessments
            if a.source.source_type == "HUMAN"
            and a.valid is not False
            and getattr(a, "feedback", None) is not None
        ]
        human = [a for a in people if a.name == sample.scale.name]
        for a in people:
            if a.name != sample.scale.name:
                log.warning(
                    "trace %s (unit %s): feedback %r by %s is not named %r: not read as a label",
                    t.info.trace_id,
                    u.unit,
                    a.name,
                    a.source.source_id,
                    sample.scale.name,
                )
        if not human:
            continue
        latest = max(human, key=lambda a: (a.last_update_time_ms or 0, a.create_time_ms or 0))
        label = _on_scale(latest.value, sample.scale)
        if label is None:
            raise DataError(
                f"label {latest.value!r} by {latest.source.source_id} is off the scale"
                f" ({' | '.join(sample.scale.labels)}): edit the assessment",
                file=f"MLflow trace {t.info.trace_id}",
                item=u.unit,
                field=sample.scale.name,
            )
        when = (latest.last_update_time_ms or 0, latest.create_time_ms or 0)
        if u.unit not in latest_of or when > latest_of[u.unit][0]:
            latest_of[u.unit] = (when, HumanLabel(label, f"mlflow:{latest.source.source_id}"))
    if elsewhere:
        log.warning(
            "sample %s: %d MLflow trace(s) tagged with its name are of verdicts not in it (an"
            " earlier draw under the same name, or an output changed since): their labels are"
            " not read",
            sample.sample,
            elsewhere,
        )
    return {unit: label for unit, (_, label) in latest_of.items()}


# ---------------------------------------------------------------- score


@dataclass(frozen=True)
class Pairs:
    """The row's judge values on all its units, and the labelled units' judge and human
    labels (with each unit's weight where the metric is a mean over items)."""

    values: list[float]
    weights: list[float] | None
    judge: list[str]
    human: list[str]
    labelled_weights: list[float] | None
    # the labelled units are among the run's (a sample of it), not other outputs' (released)
    in_population: bool = True


def audit_numbers(
    scale: Scale,
    pairs: Pairs,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
) -> dict[str, float | None]:
    """The figures logged on a run: kappa with its interval, the prediction-powered estimate
    of the metric and the human-only interval, the judge's own mean."""
    v = scale.values
    kappa = audit_kappa(pairs.judge, pairs.human, scale.labels, n_resamples=n_resamples, seed=seed)
    out: dict[str, float | None] = {
        "audit.n": float(kappa.n),
        "audit.n_units": float(len(pairs.values)),
        "audit.kappa": kappa.kappa,
        "audit.kappa_ci_low": kappa.low,
        "audit.kappa_ci_high": kappa.high,
        "audit.exact_agreement": kappa.exact,
    }
    if scale.metric is None:  # the verdicts average to none of the run's metrics: kappa only
        return out
    fl = [v[x] for x in pairs.judge]
    hl = [v[x] for x in pairs.human]
    common: dict[str, Any] = {
        "weights_all": pairs.weights,
        "weights_labelled": pairs.labelled_weights,
        "labelled_in_population": pairs.in_population,
        "bounds": (min(v.values()), max(v.values())),  # a mean of unit values stays in there
    }
    ppi = ppi_mean(pairs.values, fl, hl, **common)
    # the labels alone: the same estimator with the judge's weight 0 (the same correction)
    human = ppi_mean(pairs.values, fl, hl, lam=0.0, **common)
    if pairs.weights is None:
        judge_mean = sum(pairs.values) / len(pairs.values)
    else:
        w = pairs.weights
        judge_mean = sum(a * b for a, b in zip(pairs.values, w, strict=True)) / sum(w)
    return {
        **out,
        "audit.judge_mean": judge_mean,
        **_est(f"audit.{scale.metric}_ppi", ppi),
        "audit.lambda": ppi.lam,
        **_est("audit.human_mean", human),
    }


def confusion(labels: Sequence[str], judge: Sequence[str], human: Sequence[str]) -> dict[str, Any]:
    """The judge's labels (rows) against the person's (columns), counts in the scale's order."""
    at = {x: i for i, x in enumerate(labels)}
    counts = [[0] * len(labels) for _ in labels]
    for j, h in zip(judge, human, strict=True):
        counts[at[j]][at[h]] += 1
    return {"labels": list(labels), "counts": counts}


def _est(name: str, e: Estimate) -> dict[str, float | None]:
    return {name: e.estimate, f"{name}_ci_low": e.low, f"{name}_ci_high": e.high}


def _weights(scale: Scale, units: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Each unit's weight in the metric: 1, or 1/k for one of an item's k units."""
    count: dict[str, int] = {}
    for g, _ in units:
        count[g] = count.get(g, 0) + 1
    return {u: (1.0 / count[u[0]] if scale.per_item else 1.0) for u in units}


def score_sample(
    root: Path,
    params: Params,
    name: str,
    labels_csv: Path | None = None,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    log_run: bool = True,
) -> dict[str, Any]:
    """The audit of one sample (module docstring): refused if its labels no longer apply."""
    from pipeline.core import registry

    sample = load_sample(root, name)
    bench = registry.get(sample.benchmark)
    ctx = _context(bench, params, root)
    scale = Scale.of(capability(bench).scale(ctx))
    if scale.labels != sample.scale.labels:
        raise LfbenchError(
            f"audit sample {name}: made on the scale {sample.scale.describe()}, the benchmark's"
            f" is now {scale.describe()}: refused"
        )
    client = _client(root)
    run = current_run(client, sample.benchmark, sample.row_key)
    items = _items(bench, root)
    population = row_verdicts(bench, ctx, scale, root, run, row_items(client, run), items)
    now_sha = sorted({v.judgement.judge_prompt_sha for v in population})
    if now_sha != [sample.judge_prompt_sha]:
        raise LfbenchError(
            f"audit sample {name} was made for judge {sample.judge} with prompt sha"
            f" {sample.judge_prompt_sha[:12]}; the row's judgements are now by"
            f" {', '.join(s[:12] for s in now_sha)}: labels of another judge version are"
            " refused (make a new sample)"
        )
    by_unit = {(v.generation.generation_id, v.verdict.target_id): v for v in population}
    for u in sample.units:
        got = by_unit.get((u.generation_id, u.target_id))
        if got is None:
            raise LfbenchError(
                f"audit sample {name}, unit {u.unit}: the row has no usable verdict on"
                f" {u.target_id} of output {u.generation_id} any more: refused"
            )
        if text_sha(got.generation.text) != u.generation_sha:
            raise LfbenchError(
                f"audit sample {name}, unit {u.unit}: output {u.generation_id} changed since"
                " the sample was made (its text hash differs): labels of another output are"
                " refused (make a new sample)"
            )
    labels = mlflow_labels(client, sample)
    if labels_csv is not None:
        labels |= csv_labels(labels_csv, sample)
    labelled = [u for u in sample.units if u.unit in labels]
    if len(labelled) < 2:
        raise LfbenchError(
            f"audit sample {name}: {len(labelled)} of {len(sample.units)} units labelled; at"
            " least 2 are needed (label them in the MLflow UI, or give --labels CSV)"
        )
    keys = list(by_unit)
    w = _weights(scale, keys)
    pairs = Pairs(
        values=[scale.values[by_unit[k].verdict.label] for k in keys],
        weights=[w[k] for k in keys] if scale.per_item else None,
        judge=[by_unit[(u.generation_id, u.target_id)].verdict.label for u in labelled],
        human=[labels[u.unit].label for u in labelled],
        labelled_weights=(
            [w[(u.generation_id, u.target_id)] for u in labelled] if scale.per_item else None
        ),
    )
    numbers = audit_numbers(scale, pairs, n_resamples=n_resamples, seed=seed)
    sources: dict[str, int] = {}
    for u in labelled:
        src = "csv" if not labels[u.unit].source.startswith("mlflow:") else "mlflow"
        sources[src] = sources.get(src, 0) + 1
    result = {
        "sample": name,
        "benchmark": sample.benchmark,
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "model": sample.model,
        "judge": sample.judge,
        "judge_prompt_sha": sample.judge_prompt_sha,
        "metric": scale.metric,
        "row_metric": run.data.metrics.get(scale.metric) if scale.metric else None,
        "labels": f"{len(labelled)} of {len(sample.units)} units labelled ("
        + ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
        + ")",
        **numbers,
        "confusion": confusion(scale.labels, pairs.judge, pairs.human),
        "disagreements": [
            {
                "unit": u.unit,
                "item_id": u.item_id,
                "output": u.generation_id,
                "target": u.target_id,
                "judge": j,
                "person": h,
            }
            for u, j, h in zip(labelled, pairs.judge, pairs.human, strict=True)
            if j != h
        ],
    }
    if len(labelled) < len(sample.units):
        result["warning"] = (
            f"{len(labelled)} of the {len(sample.units)} drawn units are labelled: the interval"
            " assumes the labelled ones are a random subset of the drawn ones (label them in"
            " unit order, u01 first: the units are numbered in a random order), or label all"
        )
        log.warning("audit sample %s: %s", name, result["warning"])
    if log_run:
        tags = {
            "audit.sample": name,
            "audit.source": result["labels"],
            "audit.judge_prompt_sha": sample.judge_prompt_sha,
            "audit.scale": scale.describe(),
        }
        log_audit(client, run.info.run_id, numbers, tags)
    write_json(root / AUDITS / f"{name}.score.json", result)
    return result


def log_audit(
    client: Any, run_id: str, numbers: Mapping[str, float | None], tags: Mapping[str, str]
) -> None:
    """The audit's figures as metrics of the run (a new value of each, MLflow keeps the
    history), its sources as tags; the pending mark of a superseded audit is cleared."""
    import time

    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    run = client.get_run(run_id)
    client.log_batch(
        run_id,
        # an undefined figure (kappa of one label) is NaN, not the last run's value
        metrics=[
            Metric(k, float("nan") if v is None else float(v), now, 0)
            for k, v in sorted(numbers.items())
        ],
        tags=[RunTag(k, v) for k, v in sorted(tags.items())],
    )
    if PENDING in run.data.tags:
        client.delete_tag(run_id, PENDING)


# ---------------------------------------------------------------- released labels


def score_released(
    root: Path,
    params: Params,
    benchmark: str,
    *,
    min_labels: int = 30,
    n_resamples: int = 1000,
    seed: int = 0,
    labels_path: Path | None = None,
    log_run: bool = True,
) -> list[dict[str, Any]]:
    """Each released system's rows with at least `min_labels` labels of people on its outputs
    (the benchmark's released annotations): kappa and the corrected score, logged on the row's
    run. Labels come from outputs of the same system, setting and row keys (e.g. domain), not
    necessarily the row's own outputs: the row's source tag says so."""
    from pipeline.core import registry
    from pipeline.stages.agreement import capability as agreement_of
    from pipeline.stages.agreement import judge_labelled
    from pipeline.stages.tracking import CURRENT

    bench = registry.get(benchmark)
    audit = capability(bench)
    ag = agreement_of(bench)
    from pipeline.stages.common import context

    ctx = context(bench, params, root)  # its LLM judges' prompts: they judge the labelled set
    scale = Scale.of(audit.scale(ctx))
    path = labels_path or root / _labels_dep(root, benchmark)
    labelled = ag.load(ctx, ctx.inputs.json(str(path)), str(path))
    released = ag.released(labelled)
    judged, _ = judge_labelled(bench, ctx, labelled, released, root)
    prior = audit.released(ctx, labelled, judged)
    client = _client(root)
    exp_id = _experiment_id(client, benchmark)
    runs = client.search_runs(
        [exp_id], filter_string=f"tags.`{CURRENT}` = 'true'", max_results=5000
    )
    results = []
    items = _items(bench, root)
    for run in sorted(runs, key=lambda r: r.info.run_name or ""):
        p = run.data.params
        if "judge" not in p or "system" not in p:
            continue
        mine = [
            x
            for x in prior
            if x.judge == p["judge"]
            and x.system == p["system"]
            and x.setting == p["setting"]
            and all(p.get(k) == v for k, v in x.keys.items())
        ]
        usable = [x for x in mine if x.judge_label is not None]
        if len(usable) < min_labels:
            continue
        population = row_verdicts(bench, ctx, scale, root, run, row_items(client, run), items)
        keys = [(v.generation.generation_id, v.verdict.target_id) for v in population]
        w = _weights(scale, keys)
        lw = _prior_weights(scale, usable)
        pairs = Pairs(
            values=[scale.values[v.verdict.label] for v in population],
            weights=[w[k] for k in keys] if scale.per_item else None,
            judge=[x.judge_label for x in usable if x.judge_label is not None],
            human=[x.human_label for x in usable],
            labelled_weights=lw if scale.per_item else None,
            in_population=False,
        )
        numbers = audit_numbers(scale, pairs, n_resamples=n_resamples, seed=seed)
        keys_text = ", ".join(f"{k} {v}" for k, v in sorted(usable[0].keys.items()))
        source = (
            f"released human labels ({path.name}): {len(usable)} verdicts on other outputs of"
            f" {p['system']} / {p['setting']} ({keys_text}); {len(mine) - len(usable)} unusable"
        )
        result = {
            "sample": f"released:{path.name}",
            "benchmark": benchmark,
            "run_id": run.info.run_id,
            "run_name": run.info.run_name,
            "model": p["model"],
            "judge": p["judge"],
            "judge_prompt_sha": run.data.tags.get("judge.prompt_sha", ""),
            "metric": scale.metric,
            "row_metric": run.data.metrics.get(scale.metric) if scale.metric else None,
            "labels": source,
            **numbers,
            "confusion": confusion(scale.labels, pairs.judge, pairs.human),
            "disagreements": [
                {
                    "unit": x.unit,
                    "item_id": "",
                    "output": x.unit.rsplit("#", 1)[0],
                    "target": x.unit.rsplit("#", 1)[-1],
                    "judge": x.judge_label,
                    "person": x.human_label,
                }
                for x in usable
                if x.judge_label != x.human_label
            ],
        }
        results.append(result)
        if log_run:
            tags = {
                "audit.sample": f"released:{path.name}",
                "audit.source": source,
                "audit.judge_prompt_sha": result["judge_prompt_sha"],
                "audit.scale": scale.describe(),
            }
            log_audit(client, run.info.run_id, numbers, tags)
    write_json(root / AUDITS / f"{benchmark}-released.score.json", {"rows": results})
    return results


def _prior_weights(scale: Scale, labels: Sequence[PriorLabel]) -> list[float]:
    outputs = [x.unit.rsplit("#", 1)[0] for x in labels]
    count = {o: outputs.count(o) for o in set(outputs)}
    return [1.0 / count[o] if scale.per_item else 1.0 for o in outputs]


def _labels_dep(root: Path, benchmark: str) -> str:
    """The human labels file the benchmark's agreement stage reads (its `--labels`)."""
    from pipeline.core import dvcfile

    stages = dvcfile.stages(root / "dvc.yaml")
    stage = stages.get(f"{benchmark}-agreement", {})
    cmd = " ".join(stage.get("cmd", "").split()) if isinstance(stage, dict) else ""
    m = re.search(r"--labels\s+(\S+)", cmd)
    if m is None:
        raise ConfigError(f"dvc.yaml: no {benchmark}-agreement stage with --labels: give --labels")
    return m.group(1)


# ---------------------------------------------------------------- the report


def scores(root: Path) -> list[dict[str, Any]]:
    """Every audit result in audits/ (`*.score.json`), for the report."""
    out: list[dict[str, Any]] = []
    folder = root / AUDITS
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.score.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        out += doc.get("rows", [doc])
    return out


def _f(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{float(x):.{digits}f}"


def _render_confusion(r: Mapping[str, Any]) -> list[str]:
    """The judge-by-person table and the units where they disagree (to look at, one by one)."""
    c = r.get("confusion")
    if not c:
        return []
    labels, counts = c["labels"], c["counts"]
    first = max(len("judge \\ person"), *(len(x) for x in labels))
    cell = max(len(x) for x in labels)
    lines = [
        "  judge \\ person".ljust(first + 2) + " |" + "".join(f" {x:>{cell}}" for x in labels),
    ]
    for label, row in zip(labels, counts, strict=True):
        lines.append(f"  {label:<{first}} |" + "".join(f" {k:>{cell}}" for k in row))
    wrong = r.get("disagreements") or []
    if wrong:
        lines.append(f"  where they disagree ({len(wrong)}):")
        for d in wrong:
            where = f"output {d['output']}, target {d['target']}"
            if d["unit"] != f"{d['output']}#{d['target']}":  # a released label's unit is that
                where = f"{d['unit']}  {where}"
            lines.append(f"    {where}: judge {d['judge']}, person {d['person']}")
    return lines


def render(results: Sequence[Mapping[str, Any]]) -> str:
    """One block per audited run: kappa, the judge's score and the corrected one."""
    if not results:
        return "no run audited (none with enough labels)\n"
    lines = []
    for r in results:
        lines += [
            f"{r['run_name']}  (run {r['run_id']}, sample {r['sample']})",
            f"  labels: {r['labels']}",
            f"  kappa {_f(r['audit.kappa'], 3)} [{_f(r['audit.kappa_ci_low'], 3)},"
            f" {_f(r['audit.kappa_ci_high'], 3)}] on n={int(r['audit.n'])}; exact agreement"
            f" {_f(100 * r['audit.exact_agreement'], 1)}%",
        ]
        m = f"audit.{r['metric']}_ppi"
        if r.get("metric") and m in r:
            lines.append(
                f"  {r['metric']}: judge {_f(r['audit.judge_mean'])} on"
                f" {int(r['audit.n_units'])} verdicts (the row: {_f(r.get('row_metric'))});"
                f" corrected {_f(r[m])} [{_f(r[m + '_ci_low'])}, {_f(r[m + '_ci_high'])}]"
                f" (judge's weight {_f(r.get('audit.lambda'))});"
                f" people alone {_f(r['audit.human_mean'])} [{_f(r['audit.human_mean_ci_low'])},"
                f" {_f(r['audit.human_mean_ci_high'])}]"
            )
        if r.get("warning"):
            lines.append(f"  warning: {r['warning']}")
        lines += _render_confusion(r)
    return "\n".join(lines) + "\n"
