"""RAGQuestEval's cost per 100 items, in calls and cl100k_base tokens, on the default params.

    python perf/crud_rag_questeval_cost.py [--mirror ../shared/data] [--records 100]

Calls follow from the design (questeval.py): per record without a released cache entry, one
question-generation call and one call answering the questions from the reference (construct
time, once per record, shared by every system and setting); per output, one call answering the
record's good questions (judge time); a repair call only after an unusable answer.

Tokens: the prompts are the project's own, rendered exactly as the stages send them, on the
first N released event-summarisation records and the lead baseline's outputs in the base
setting (their real lengths). What an LLM would write is not known offline, so the
question lists and answers are stood in for by the authors' released caches (4,400 entries of
four tasks): the mean tokens of an entry's {"key_info", "question"} JSON (the questions a
generation call writes and every answering call reads) and of its {"answers"} JSON (what an
answering call writes). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.benchmarks.crud_rag.benchmark import CrudRag  # noqa: E402
from pipeline.benchmarks.crud_rag.params import CrudParams  # noqa: E402
from pipeline.core.benchmark import Context  # noqa: E402
from pipeline.core.config import load_yaml  # noqa: E402
from pipeline.core.params import validate_params  # noqa: E402
from pipeline.core.prompts import load_prompt  # noqa: E402
from pipeline.retrieval.tokens import count_tokens  # noqa: E402
from pipeline.stages.common import FileInputs  # noqa: E402

CACHES = ("HalluModified", "QuestAnswer1Doc", "QuestAnswer2Docs", "QuestAnswer3Docs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirror", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--records", type=int, default=100)
    args = ap.parse_args()
    raw = load_yaml(ROOT / "params.yaml")
    raw["crud_rag"].update(records=args.records)
    raw["crud_rag"]["grid"].update(chunk=[], chunk_overlap=[], top_k=[], oracle=False)
    params = validate_params(raw, benchmarks=["crud_rag"])
    cx = params.section("crud_rag", CrudParams)
    prompts = {k: load_prompt(v, ROOT) for k, v in cx.prompts.model_dump().items()}
    ctx = Context(params, cx, prompts, FileInputs(args.mirror), "crud_rag")
    bench = CrudRag()
    items = bench.construct(ctx, None).records
    gens = bench.offline_generations(ctx, "lead", params.models["lead"], items)

    entries = []
    for name in CACHES:
        data = json.loads((args.mirror / "crud_rag" / f"{name}_quest_gt_save.json").read_text())
        entries += [e for e in data.values() if e.get("question")]
    q_json = [
        json.dumps({"key_info": e["key_info"], "question": e["question"]}, ensure_ascii=False)
        for e in entries
    ]
    a_json = [json.dumps({"answers": e["answers"]}, ensure_ascii=False) for e in entries]
    qs_only = [json.dumps(e["question"], ensure_ascii=False) for e in entries]
    tq, ta, tqs = (
        fmean(map(count_tokens, q_json)),
        fmean(map(count_tokens, a_json)),
        fmean(map(count_tokens, qs_only)),
    )
    stand_in = qs_only[0]  # placeholder of the questions' place in a prompt (its length added)

    gen_in = [count_tokens(prompts["quest_generate"].render(reference=i.reference)) for i in items]
    ref_in = [
        count_tokens(prompts["quest_answer"].render(context=i.reference, questions=stand_in))
        - count_tokens(stand_in)
        + tqs
        for i in items
    ]
    out_in = [
        count_tokens(prompts["quest_answer"].render(context=g.text or "", questions=stand_in))
        - count_tokens(stand_in)
        + tqs
        for g in gens
    ]
    n = len(items)
    per100 = 100 / n
    construct = {
        "calls": 2 * 100,
        "input_tokens": round(per100 * (sum(gen_in) + sum(ref_in))),
        "output_tokens": round(100 * (tq + ta)),
    }
    judge = {
        "calls": 100,
        "input_tokens": round(100 / len(gens) * sum(out_in)),
        "output_tokens": round(100 * ta),
    }
    print(
        json.dumps(
            {
                "records": n,
                "outputs": len(gens),
                "setting": gens[0].setting,
                "released_entries_used_for_llm_text": len(entries),
                "mean_tokens_questions_json": round(tq, 1),
                "mean_tokens_answers_json": round(ta, 1),
                "mean_questions_per_record": round(fmean(len(e["question"]) for e in entries), 2),
                "construct_per_100_records_without_cache": construct,
                "construct_per_100_records_with_released_cache": {
                    "calls": 0,
                    "input_tokens": 0,
                    "output_tokens": 0,
                },
                "judge_per_100_outputs": judge,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
