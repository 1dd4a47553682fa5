"""CRUX's audit: a person rates one (passage, sub-question) pair as the judge did (0-5).

CRUX's metrics (coverage, alpha-nDCG, density of a context) are not a mean of these ratings, so
an audit gives the judge's kappa against the person on the run, not a corrected metric. A row is
one retriever's ranking at one cut-off: its units are the pairs of the passages in that context.
"""

from __future__ import annotations

from pipeline.benchmarks.crux.contexts import cut
from pipeline.benchmarks.crux.judging import split_target
from pipeline.benchmarks.crux.params import CruxParams
from pipeline.benchmarks.crux.schema import QueryView
from pipeline.core.benchmark import Audit, AuditScale, Context
from pipeline.core.errors import DataError
from pipeline.core.records import Generation

RATINGS = ("5", "4", "3", "2", "1", "0")


class CruxAudit(Audit[CruxParams, QueryView]):
    def scale(self, ctx: Context[CruxParams]) -> AuditScale:
        return AuditScale(
            name="rating",
            labels=RATINGS,
            values={r: float(r) for r in RATINGS},
            metric=None,
            meaning="how well the passage answers the sub-question: 5 fully and correctly, 4"
            " almost fully, 3 in part, 2 only touches on it, 1 barely related, 0 no help",
        )

    def view(
        self, ctx: Context[CruxParams], item: QueryView, generation: Generation, target: str
    ) -> dict[str, str]:
        pid, qid = split_target(target)
        sub = next((s for s in item.query.subquestions if s.qid == qid), None)
        passage = item.passages.get(pid)
        if sub is None or passage is None:
            raise DataError(
                "no such passage or sub-question in the query",
                item=item.query.item_id,
                field=target,
            )
        return {"sub-question": sub.text, "passage": passage.text}

    def in_row(
        self,
        ctx: Context[CruxParams],
        setting: str,
        item: QueryView,
        generation: Generation,
        target: str,
    ) -> bool:
        """A row `<retriever>@<cut-off>` holds the pairs of the passages in that context."""
        retriever, _, cutoff = setting.rpartition("@")
        if not retriever or generation.setting != retriever:
            return False
        pid, _ = split_target(target)
        return pid in cut(generation, item.query, cutoff, item.passages).passages
