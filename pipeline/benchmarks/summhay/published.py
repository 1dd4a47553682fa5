"""The `published` provider and judge for SummHay: replay what the authors released.

The news haystacks carry, per subtopic, the summaries of 78 systems (10 summarizers x 6
retrievers, full context, and the position-bias orders) and GPT-4o's coverage judgements of
each. The provider turns each released summary into a Generation; the judge turns each
released judgement list into a Judgement. Nothing is called, nothing is paid.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence

from pipeline.benchmarks.summhay.scoring import extract_bullets
from pipeline.core.benchmark import Inputs
from pipeline.core.config import PublishedModel
from pipeline.core.errors import DataError
from pipeline.core.records import Generation, Judgement, Verdict
from pipeline.data.haystacks import (
    Haystack,
    RawHaystack,
    haystack_file,
    item_id,
    parse_raw_haystack,
    parse_summary_key,
)

PUBLISHED_PROMPT_SHA = "published"


def raw_haystack(inputs: Inputs, data_dir: str, haystack_id: str) -> tuple[str, RawHaystack]:
    """(the file's path, its validated content) of a released haystack."""
    path = posixpath.join(data_dir, haystack_file(haystack_id))
    return path, parse_raw_haystack(inputs.json(path), path)


def generations(
    model_name: str,
    spec: PublishedModel,
    inputs: Inputs,
    data_dir: str,
    dataset: Sequence[Haystack],
) -> Iterator[Generation]:
    """One Generation per released summary, for the haystacks of the dataset."""
    for hay in dataset:
        if hay.derived is not None:
            continue  # nothing was released for a derived haystack
        path, raw = raw_haystack(inputs, data_dir, hay.haystack_id)
        wanted = {s.subtopic_id for s in hay.subtopics}
        for sub in raw.subtopics:
            if sub.subtopic_id not in wanted:
                continue
            for key in sorted(sub.summaries):
                lines = sub.summaries[key]
                try:
                    system, setting = parse_summary_key(key)
                except ValueError as e:
                    raise DataError(
                        str(e),
                        file=path,
                        item=f"subtopic {sub.subtopic_id!r}",
                        field=f"summaries.{key}",
                    ) from e
                if spec.systems is not None and system not in spec.systems:
                    continue
                if spec.settings is not None and setting not in spec.settings:
                    continue
                text = "\n".join(lines)
                if extract_bullets(text) != [line.strip() for line in lines]:
                    raise DataError(
                        "a summary line is empty or holds a line break, so bullet numbers would"
                        " not match the released judgements",
                        file=path,
                        item=f"subtopic {sub.subtopic_id!r}",
                        field=f"summaries.{key}",
                    )
                yield Generation(
                    benchmark="summhay",
                    item_id=item_id(hay.haystack_id, sub.subtopic_id),
                    model=model_name,
                    system=system,
                    setting=setting,
                    status="ok",
                    text=text,
                    meta={"source": f"{posixpath.basename(path)}#{key}"},
                )


def judgements(
    judge_name: str, inputs: Inputs, data_dir: str, gens: Sequence[Generation]
) -> Iterator[Judgement]:
    """Replay the released judgement of each generation that came from the release."""
    raws: dict[str, tuple[str, RawHaystack]] = {}
    for gen in gens:
        source = gen.meta.get("source")
        if not isinstance(source, str) or "#" not in source:
            raise DataError(
                "not a released summary: the published judge can only replay judgements for"
                " generations of the published provider",
                item=gen.generation_id,
                field="meta.source",
            )
        haystack_id, subtopic_id = gen.item_id.split("/", 1)
        if haystack_id not in raws:
            raws[haystack_id] = raw_haystack(inputs, data_dir, haystack_id)
        path, raw = raws[haystack_id]
        key = source.split("#", 1)[1]
        sub = next((s for s in raw.subtopics if s.subtopic_id == subtopic_id), None)
        if sub is None or key not in sub.summaries:
            raise DataError(
                "no released summary for this generation",
                file=path,
                item=gen.generation_id,
                field="meta.source",
            )
        if gen.text != "\n".join(sub.summaries[key]):
            raise DataError(
                "the generation's text differs from the released summary, so the released"
                " judgement does not apply to it",
                file=path,
                item=gen.generation_id,
                field="text",
            )
        evals = sub.eval_summaries.get(key)
        if evals is None:
            raise DataError(
                "the release has no judgement for this summary",
                file=path,
                item=f"subtopic {subtopic_id!r}",
                field=f"eval_summaries.{key}",
            )
        verdicts = [
            Verdict(target_id=e.insight_id, label=e.coverage, link=e.bullet_id) for e in evals
        ]
        yield Judgement.of("summhay", gen, judge_name, PUBLISHED_PROMPT_SHA, "ok", verdicts)
