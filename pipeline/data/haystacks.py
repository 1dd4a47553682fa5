"""SummHay haystacks: the released JSON format, its validation, and the normalised records.

The haystack release of Summary of a Haystack is the raw data of every benchmark derived from it
(SummHay itself; Long²RAG's and CRUX's offline defaults), so its format lives here, outside the
benchmark packages. A released haystack file holds a topic, its subtopics (each a task: a query
and its reference insights, per-document retriever scores and, in the news release, the summaries
of 78 systems with GPT-4o judgements) and ~100 documents with the insights planted in each.

`parse_raw_haystack` validates a file's content and names the file, subtopic and field of any
defect (`load_raw_haystack` also reads it). `normalise` turns it into the records the pipeline
works on: documents with their 1-based position (the id systems cite), insights with their gold
documents, and retriever scores as lists aligned with document positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.core.config import Strict, known, no_repeats
from pipeline.core.errors import DataError, format_loc
from pipeline.core.io import read_json
from pipeline.core.records import Record

COVERAGE_LABELS = ("FULL_COVERAGE", "PARTIAL_COVERAGE", "NO_COVERAGE")
HAYSTACK_IDS = tuple([f"news{i}" for i in range(1, 6)] + [f"conv{i}" for i in range(1, 6)])


class HaystackSelection(Strict):
    """Which released haystacks a derived benchmark reads: a params block that Long²RAG's and
    CRUX's offline defaults share (each adds its own fields)."""

    haystacks: list[str] = Field(default_factory=lambda: list(HAYSTACK_IDS), min_length=1)
    subtopics: int | None = Field(default=None, ge=1, description="first N subtopics per haystack")

    @field_validator("haystacks")
    @classmethod
    def _known(cls, hs: list[str]) -> list[str]:
        known("haystack", hs, HAYSTACK_IDS)
        no_repeats(haystacks=hs)
        return hs


# Retriever names as released -> the names lfbench reports (the paper's column names).
RELEASED_SETTINGS = {
    "random": "random",
    "vector": "vector",
    "dwzhu/e5-base-4k": "longembed",
    "keywords": "keywords",
    "rerank3": "rerank3",
    "oracle": "oracle",
    "fl-ctxt-sort": "full-sort",
    "fl-ctxt-rev-sort": "full-rev-sort",
    "fl-ctxt-middle": "full-middle",
}
SUMMARY_KEY_PREFIX = "summary_subtopic_"


def haystack_file(haystack_id: str) -> str:
    """news1 -> topic_news1.json; conv1 -> topic_conv1.cleaned.json (relative to data/summhay)."""
    if haystack_id.startswith("news"):
        return f"topic_{haystack_id}.json"
    return f"topic_{haystack_id}.cleaned.json"


def domain_of(haystack_id: str) -> Literal["news", "conversation"]:
    return "news" if haystack_id.startswith("news") else "conversation"


# ---------------------------------------------------------------- released (raw) schema


class _Raw(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RawInsight(_Raw):
    insight_id: str = Field(min_length=1)
    insight_name: str = ""
    insight: str = Field(min_length=1)


class RawEval(_Raw):
    insight_id: str = Field(min_length=1)
    coverage: Literal["FULL_COVERAGE", "PARTIAL_COVERAGE", "NO_COVERAGE"]
    bullet_id: int | str | None = None


class RawSubtopic(_Raw):
    subtopic_id: str = Field(min_length=1)
    subtopic_name: str = ""
    subtopic: str = Field(min_length=1)
    query: str = Field(min_length=1)
    insights: list[RawInsight] = Field(min_length=1)
    retriever: dict[str, dict[str, float]]
    summaries: dict[str, list[str]] = Field(default_factory=dict)
    eval_summaries: dict[str, list[RawEval]] = Field(default_factory=dict)


class RawDocument(_Raw):
    document_id: str = Field(min_length=1)
    document_text: str = Field(min_length=1)
    insights_included: list[str]


class RawHaystack(_Raw):
    topic_id: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    topic_metadata: dict[str, Any] = Field(default_factory=dict)
    subtopics: list[RawSubtopic] = Field(min_length=1)
    documents: list[RawDocument] = Field(min_length=1)


def _item_of(raw: Any, loc: tuple[int | str, ...]) -> tuple[str | None, tuple[int | str, ...]]:
    """Name the subtopic or document a pydantic error location points into."""
    if len(loc) >= 2 and loc[0] in ("subtopics", "documents") and isinstance(loc[1], int):
        kind, idx = loc[0], loc[1]
        ident = None
        try:
            entry = raw[kind][idx]
            ident = entry.get("subtopic_id" if kind == "subtopics" else "document_id")
        except (KeyError, IndexError, TypeError, AttributeError):
            pass
        noun = "subtopic" if kind == "subtopics" else "document"
        label = f"{noun} {ident!r} ({kind}[{idx}])" if ident else f"{noun} {kind}[{idx}]"
        return label, loc[2:]
    return None, loc


def parse_raw_haystack(raw: Any, file: str) -> RawHaystack:
    """A released haystack file's content (parsed JSON), validated; `file` names it in errors."""
    try:
        hay = RawHaystack.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        item, rest = _item_of(raw, tuple(err["loc"]))
        raise DataError(str(err["msg"]), file=file, item=item, field=format_loc(rest)) from e
    check_consistency(hay, file)
    return hay


def load_raw_haystack(path: Path) -> RawHaystack:
    """Read and validate a released haystack file (for tools and tests; stages read through
    their `Inputs`)."""
    return parse_raw_haystack(read_json(path), str(path))


def check_consistency(hay: RawHaystack, file: str) -> None:
    """The cross-references a schema cannot express."""
    doc_ids = [d.document_id for d in hay.documents]
    seen: set[str] = set()
    for i, d in enumerate(hay.documents):
        if d.document_id in seen:
            raise DataError(
                "duplicate document_id",
                file=file,
                item=f"document {d.document_id!r} (documents[{i}])",
                field="document_id",
            )
        seen.add(d.document_id)
    insight_ids: set[str] = set()
    subtopic_ids: set[str] = set()
    for si, s in enumerate(hay.subtopics):
        item = f"subtopic {s.subtopic_id!r} (subtopics[{si}])"
        if s.subtopic_id in subtopic_ids:
            raise DataError("duplicate subtopic_id", file=file, item=item, field="subtopic_id")
        subtopic_ids.add(s.subtopic_id)
        for ii, ins in enumerate(s.insights):
            if ins.insight_id in insight_ids:
                raise DataError(
                    "insight_id used twice in this haystack",
                    file=file,
                    item=item,
                    field=f"insights[{ii}].insight_id",
                )
            insight_ids.add(ins.insight_id)
        doc_set = set(doc_ids)
        for method, scores in s.retriever.items():
            missing = doc_set - scores.keys()
            if missing:
                raise DataError(
                    f"no score for {len(missing)} of the haystack's documents "
                    f"(e.g. {sorted(missing)[0]!r})",
                    file=file,
                    item=item,
                    field=f"retriever.{method}",
                )
        for key in s.eval_summaries:
            if key not in s.summaries:
                raise DataError(
                    "judgements for a summary that is not in summaries",
                    file=file,
                    item=item,
                    field=f"eval_summaries.{key}",
                )
        own = {ins.insight_id for ins in s.insights}
        for key, evals in s.eval_summaries.items():
            for ei, ev in enumerate(evals):
                if ev.insight_id not in own:
                    raise DataError(
                        f"insight_id {ev.insight_id!r} is not an insight of this subtopic",
                        file=file,
                        item=item,
                        field=f"eval_summaries.{key}[{ei}].insight_id",
                    )
    for i, d in enumerate(hay.documents):
        for j, iid in enumerate(d.insights_included):
            if iid not in insight_ids:
                raise DataError(
                    f"unknown insight_id {iid!r}",
                    file=file,
                    item=f"document {d.document_id!r} (documents[{i}])",
                    field=f"insights_included[{j}]",
                )


# ---------------------------------------------------------------- normalised dataset


class Document(Record):
    position: int = Field(ge=1, description="1-based position: the id a system cites")
    document_id: str
    text: str
    insight_ids: list[str]


class Insight(Record):
    insight_id: str
    name: str
    text: str
    gold_docs: list[int] = Field(description="positions of the documents that contain it")


class Subtopic(Record):
    item_id: str
    subtopic_id: str
    name: str
    subtopic: str
    query: str
    insights: list[Insight]
    retriever_scores: dict[str, list[float]] = Field(
        description="released retriever scores, aligned with document positions"
    )


class Derivation(Record):
    """How a haystack that the authors did not release was made: recombined from released
    documents to a target length (`lfbench`'s length study), or synthesized through a model."""

    kind: Literal["recombined", "synthesized"]
    collection: str = Field(description="its rows' `collection` column, e.g. 50k or synthetic")
    sources: list[str] = Field(description="the released haystacks its documents come from")
    target_tokens: int | None = None
    n_tokens: int = Field(description="cl100k_base tokens of its documents")
    seed: int
    recipe_sha: str = Field(description="sha256 of the parameters that made it")
    figures: dict[str, Any] = Field(
        default_factory=dict, description="what construction did: verification, drops, cost"
    )


class Haystack(Record):
    haystack_id: str
    domain: Literal["news", "conversation"]
    topic_id: str
    topic: str
    participants: list[str]
    source_file: str
    documents: list[Document]
    subtopics: list[Subtopic]
    derived: Derivation | None = None  # None: a released haystack

    @property
    def collection(self) -> str:
        """The rows it is scored in: `released`, or its derivation's collection."""
        return "released" if self.derived is None else self.derived.collection

    def subtopic(self, subtopic_id: str) -> Subtopic:
        for s in self.subtopics:
            if s.subtopic_id == subtopic_id:
                return s
        raise KeyError(subtopic_id)


def item_id(haystack_id: str, subtopic_id: str) -> str:
    return f"{haystack_id}/{subtopic_id}"


def normalise(
    haystack_id: str,
    hay: RawHaystack,
    source_file: str,
    domain: Literal["news", "conversation"] | None = None,
    derived: Derivation | None = None,
) -> Haystack:
    gold: dict[str, list[int]] = {}
    documents = []
    for pos, d in enumerate(hay.documents, start=1):
        documents.append(
            Document(
                position=pos,
                document_id=d.document_id,
                text=d.document_text,
                insight_ids=list(d.insights_included),
            )
        )
        for iid in d.insights_included:
            gold.setdefault(iid, []).append(pos)
    participants = hay.topic_metadata.get("participants") or []
    subtopics = []
    for s in hay.subtopics:
        scores = {
            RELEASED_SETTINGS.get(method, method): [float(m[d.document_id]) for d in hay.documents]
            for method, m in sorted(s.retriever.items())
        }
        subtopics.append(
            Subtopic(
                item_id=item_id(haystack_id, s.subtopic_id),
                subtopic_id=s.subtopic_id,
                name=s.subtopic_name,
                subtopic=s.subtopic,
                query=s.query,
                insights=[
                    Insight(
                        insight_id=i.insight_id,
                        name=i.insight_name,
                        text=i.insight,
                        gold_docs=gold.get(i.insight_id, []),
                    )
                    for i in s.insights
                ],
                retriever_scores=scores,
            )
        )
    return Haystack(
        haystack_id=haystack_id,
        domain=domain or domain_of(haystack_id),
        topic_id=hay.topic_id,
        topic=hay.topic,
        participants=[str(p) for p in participants],
        source_file=source_file,
        documents=documents,
        subtopics=subtopics,
        derived=derived,
    )


def parse_summary_key(key: str) -> tuple[str, str]:
    """'summary_subtopic_dwzhu/e5-base-4k_gpt-4o' -> ('gpt-4o', 'longembed'); no retriever ->
    ('gpt-4o', 'full'). Summarizer names contain no underscore; retriever names may contain '/'."""
    if not key.startswith(SUMMARY_KEY_PREFIX):
        raise ValueError(f"summary key {key!r} does not start with {SUMMARY_KEY_PREFIX!r}")
    rest = key[len(SUMMARY_KEY_PREFIX) :]
    if "_" not in rest:
        return rest, "full"
    retriever, system = rest.rsplit("_", 1)
    if retriever not in RELEASED_SETTINGS:
        raise ValueError(f"summary key {key!r} names an unknown retriever {retriever!r}")
    return system, RELEASED_SETTINGS[retriever]
