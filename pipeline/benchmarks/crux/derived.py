"""The offline default: CRUX data DERIVED from the SummHay haystacks, exactly as follows.

CRUX's own data (DUC-2004, Multi-News) cannot be fetched here, but a SummHay haystack carries
what CRUX needs, so that numbers stay comparable from one version to the next:

- one query per subtopic: its `query`; item id `<haystack>/<subtopic>`;
- sub-questions = the subtopic's insights (id and text);
- passages = the haystack's whole documents (id `<haystack>:<position>`);
- rating of (document, insight) = 5 when the document's `insights_included` holds the insight,
  else 0 (the `labels` judge replays these);
- answerable sub-questions = the insights at least one document holds (the others are dropped,
  and a query left with none is excluded from every mean and counted);
- Z* = the greedy marginal-gain cover (the document answering most not-yet-answered
  sub-questions first; ties by haystack position);
- released rankings = each released retriever's scores, descending, ties by haystack position;
- domain = news or conversation; `source: derived:summhay` on every record.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from pipeline.benchmarks.crux.metrics import greedy_cover
from pipeline.benchmarks.crux.schema import Collection, Passage, Query, SubQuestion
from pipeline.core.benchmark import Inputs
from pipeline.data.haystacks import Haystack, haystack_file, normalise, parse_raw_haystack

SOURCE = "derived:summhay"
LABEL = 5  # the rating of a document that holds the insight


def pid(haystack: str, position: int) -> str:
    return f"{haystack}:{position}"


def ranking(scores: Sequence[float], pids: Sequence[str]) -> list[str]:
    """Scores descending, ties by haystack position (the order of `pids`)."""
    order = sorted(range(len(pids)), key=lambda i: (-scores[i], i))
    return [pids[i] for i in order]


def collection(hay: Haystack, eta: int) -> Collection:
    from pipeline.retrieval.tokens import count_tokens_batch

    pids = [pid(hay.haystack_id, d.position) for d in hay.documents]
    tokens = count_tokens_batch([d.text for d in hay.documents])
    passages = [
        Passage(pid=p, text=d.text, tokens=t, position=d.position)
        for p, d, t in zip(pids, hay.documents, tokens, strict=True)
    ]
    queries = []
    for sub in hay.subtopics:
        holds = {iid: [p for p, d in zip(pids, hay.documents, strict=True) if iid in d.insight_ids]
                 for iid in (i.insight_id for i in sub.insights)}  # fmt: skip
        kept = [i for i in sub.insights if holds[i.insight_id]]
        dropped = [i for i in sub.insights if not holds[i.insight_id]]
        ratings: dict[str, list[int]] = {}
        for q, ins in enumerate(kept):
            for p in holds[ins.insight_id]:
                ratings.setdefault(p, [0] * len(kept))[q] = LABEL
        ratings = {p: ratings[p] for p in pids if p in ratings}  # haystack order
        queries.append(
            Query(
                item_id=sub.item_id,
                query=sub.query,
                domain=hay.domain,
                subquestions=[SubQuestion(qid=i.insight_id, text=i.text) for i in kept],
                dropped=[SubQuestion(qid=i.insight_id, text=i.text) for i in dropped],
                ratings=ratings,
                zstar=greedy_cover(ratings, pids, eta),
                rankings={r: ranking(s, pids) for r, s in sorted(sub.retriever_scores.items())},
                meta={"haystack": hay.haystack_id, "subtopic": sub.subtopic},
            )
        )
    return Collection(
        collection_id=hay.haystack_id,
        domain=hay.domain,
        source=SOURCE,
        passages=passages,
        queries=queries,
    )


def derive(
    inputs: Inputs, data_dir: str, haystacks: Sequence[str], subtopics: int | None, eta: int
) -> list[Collection]:
    out = []
    for hid in haystacks:
        path = posixpath.join(data_dir, haystack_file(hid))
        hay = normalise(hid, parse_raw_haystack(inputs.json(path), path), haystack_file(hid))
        if subtopics is not None:
            hay = hay.model_copy(update={"subtopics": hay.subtopics[:subtopics]})
        out.append(collection(hay, eta))
    return out
