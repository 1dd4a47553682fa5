"""The params.yaml entries a stage reads, and whether its dvc.yaml `params` list them.

A stage lists each entry of `models`, `judges` and `retrievers` it reads as a DVC parameter of
its own, and never the whole of `judges` or `models`: a judge entry a new benchmark adds would
otherwise mark the other benchmarks' stages changed. Most entries follow from a stage's matrix
(`judges.${item.judge}`); two kinds depend on values of params.yaml, so `lfbench check` checks
them here: a construct stage reads the judges entry its section names as its construction LLM
(`construction_llm()`: SummHay's synthesis, Long²RAG's and CRUX's construction, CRUD-RAG's
RAGQuestEval questions), and an agreement stage every judge of its section (each scores the
human-labelled outputs itself).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pipeline.core import dvcfile
from pipeline.core.config import BenchmarkParams, Params


def entries_read(verb: str, bench: str, section: BenchmarkParams) -> list[tuple[str, str]]:
    """(params key, why) of the entries a `lfbench run <verb>` stage of `bench` reads that its
    matrix does not name."""
    if verb == "construct":
        llm = section.construction_llm()
        return [] if llm is None else [(f"judges.{llm}", f"{bench}'s construction LLM")]
    if verb == "agreement":
        return [(f"judges.{j}", f"{bench}.judges") for j in section.judges]
    return []


def listed(key: str, params: list[str]) -> bool:
    """Whether a DVC params list covers `key` (the key itself, or a section holding it)."""
    return any(key == p or key.startswith(p + ".") for p in params)


def unlisted(params: Params, dvc_file: Path, only: str | None = None) -> list[str]:
    """`stage: key (why)` for each entry a stage reads that its params do not list (of the
    benchmark `only`'s stages alone when given: a stage loads its own section only)."""
    from pipeline.core import registry

    out = []
    for stage, spec in dvcfile.stages(dvc_file).items():
        argv = shlex.split(str(spec.get("cmd", "")))
        if argv[:2] != ["lfbench", "run"] or len(argv) < 3 or "--benchmark" not in argv:
            continue
        bench = argv[argv.index("--benchmark") + 1]
        if bench not in params.benchmarks() or only not in (None, bench):
            continue
        section = params.section(bench, registry.get(bench).params_model)
        keys = [str(p) for p in spec.get("params") or [] if isinstance(p, str)]
        out += [
            f"{stage}: {key} ({why})"
            for key, why in entries_read(argv[2], bench, section)
            if not listed(key, keys)
        ]
    return out


def relist(
    params: Params, dvc_file: Path, exact: bool = True, only: str | None = None
) -> list[str]:
    """Rewrite, in `dvc_file`'s text, the `judges.*` items of the `params` list of each stage
    whose judges entries follow from params.yaml (an agreement stage, a construct stage): the
    entries it reads now, no more, no fewer. Comments and every other line stay as they are.
    Returns `stage: +key` / `stage: -key` for each change (`lfbench check --fix`). With
    `exact` False, a listed entry params.yaml still has stays (only what DVC would refuse, an
    entry params.yaml lacks, goes)."""
    from pipeline.core import registry

    lines = dvc_file.read_text(encoding="utf-8").splitlines(keepends=True)
    changes: list[str] = []
    for stage, spec in dvcfile.stages(dvc_file).items():
        argv = shlex.split(str(spec.get("cmd", "")))
        if argv[:2] != ["lfbench", "run"] or len(argv) < 3 or "--benchmark" not in argv:
            continue
        if argv[2] not in ("agreement", "construct"):
            continue
        bench = argv[argv.index("--benchmark") + 1]
        if bench not in params.benchmarks() or only not in (None, bench):
            continue
        section = params.section(bench, registry.get(bench).params_model)
        want = [key for key, _ in entries_read(argv[2], bench, section)]
        keep = set() if exact else {f"judges.{j}" for j in params.judges}
        lines, changed = _relist_block(lines, stage, want, keep)
        changes += [f"{stage}: {c}" for c in changed]
    if changes:
        dvc_file.write_text("".join(lines), encoding="utf-8")
    return changes


def _relist_block(
    lines: list[str], stage: str, want: list[str], keep: set[str]
) -> tuple[list[str], list[str]]:
    """The stage's block-style `params:` list with its `- judges.<name>` items replaced by
    `want` and those of `keep` it had (added after its last item when it had none)."""
    head = f"  {stage}:\n"
    if head not in lines:
        return lines, []
    i = lines.index(head) + 1
    while i < len(lines) and lines[i].rstrip("\n") != "    params:":
        if lines[i].strip() and not lines[i].startswith("   "):
            return lines, []  # the next stage: this one has no block-style params list
        i += 1
    if i >= len(lines):
        return lines, []
    start = end = i + 1
    while end < len(lines) and lines[end].startswith("      - "):
        end += 1
    items = [ln[len("      - ") :].strip() for ln in lines[start:end]]
    have = [it for it in items if it.startswith("judges.") and "${" not in it]
    want = [k for k in have if k in keep and k not in want] + want
    if sorted(have) == sorted(want):
        return lines, []
    kept = [it for it in items if it not in have]
    new = kept + want
    block = [f"      - {it}\n" for it in new]
    changed = [f"-{k}" for k in have if k not in want] + [f"+{k}" for k in want if k not in have]
    return lines[:start] + block + lines[end:], changed
