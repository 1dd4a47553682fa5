"""RAGQuestEval: questions from the reference, answered from the reference and from the output.

1. Questions (construct time, once per record, shared by every system): the authors' released
   cache entry for the record's ID when there is one (their file layout, used as it is: no
   call); otherwise an LLM (`quest_eval.llm`) lists the reference's key information and one
   question per piece (`prompts/quest_generate.txt`), then answers the questions from the
   reference (`prompts/quest_answer.txt`): the reference answers. The questions the reference
   itself cannot answer ("无法推断") are bad questions and are not asked of outputs.
2. Answers (judge time, one call per output): the judge answers the record's questions from the
   output, "无法推断" where it cannot.
3. Scores per output: recall = the share of questions the output answers; precision = the mean
   token F1 (jieba tokens, bag of tokens) between the output's and the reference's answers over
   the answered questions (0 when none is answered, as the paper's Eq. 2 gives). A record with
   no good question is left out and counted (the authors score it 0 and 0); an unusable answer
   gets one repair call, then the output's verdicts are invalid: left out and counted, never 0.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.benchmarks.crud_rag import text as T
from pipeline.benchmarks.crud_rag.schema import UNANSWERABLE, Item, QuestSet
from pipeline.core.benchmark import Ask, Asker, JudgePrompts, JudgeTask, Parsed, single
from pipeline.core.parse import ParseError, load_object, string_list
from pipeline.core.prompts import Prompt
from pipeline.core.records import Generation, Verdict
from pipeline.core.types import ChatRequest


def target(i: int) -> str:
    return f"q{i + 1}"


def _answers(text: str | None, n: int) -> list[str]:
    obj = load_object(text)
    answers = obj.get("answers")
    if not isinstance(answers, list) or not all(isinstance(a, str | int | float) for a in answers):
        raise ParseError('"answers" must be a list of strings')
    if len(answers) != n:
        raise ParseError(f'"answers" has {len(answers)} answers for {n} questions')
    return [str(a).strip() or UNANSWERABLE for a in answers]


def _questions(text: str | None) -> tuple[list[str], list[str]]:
    qs = string_list(text, "question")
    if not qs:
        raise ParseError('"question" must list at least one question')
    obj = load_object(text)
    key_info = obj.get("key_info", [])
    return [str(k) for k in key_info] if isinstance(key_info, list) else [], qs


@dataclass(frozen=True)
class Prompts:
    generate: Prompt
    answer: Prompt
    repair: Prompt


def _ask(key: str, prompt: Prompt, repair: Prompt, parse: Any, **values: str) -> Ask:
    messages = [{"role": "user", "content": prompt.render(**values)}]
    req = ChatRequest(key, messages, prompt.sha + repair.sha, 0, None, {"type": "json_object"})
    return Ask(req, single(parse), repair=repair)


def build(
    items: Sequence[Item],
    cached: dict[str, dict[str, QuestSet]],
    prompts: Prompts | None,
    ask: Asker | None,
    llm: str | None,
) -> tuple[list[Item], list[tuple[str, str]], Counter[str]]:
    """The items with their questions: from `cached` (task -> record ID -> set), else written
    by the LLM. Returns the items, the failures (item id, why) and counts by source."""
    counts: Counter[str] = Counter()
    out: dict[str, Item] = {}
    todo: list[Item] = []
    for item in items:
        found = cached.get(item.task, {}).get(item.record_id)
        if found is not None:
            out[item.item_id] = item.model_copy(update={"quest_eval": found})
            counts["released"] += 1
        elif ask is not None and prompts is not None:
            todo.append(item)
        else:
            out[item.item_id] = item
            counts["none"] += 1
    failures: list[tuple[str, str]] = []
    if todo:
        assert prompts is not None and ask is not None and llm is not None
        r = prompts.repair
        gen_asks = [
            _ask(f"{i.item_id}#questions", prompts.generate, r, _questions, reference=i.reference)
            for i in todo
        ]
        written: list[tuple[Item, list[str], list[str]]] = []
        for item, ans in zip(todo, ask(gen_asks, "questions"), strict=True):
            if ans.ok:
                written.append((item, *ans.value))
            else:
                failures.append((item.item_id, f"questions: {ans.failure}"))
        ans_asks = []
        for item, _key_info, qs in written:

            def parse(text: str | None, n: int = len(qs)) -> list[str]:
                return _answers(text, n)

            ans_asks.append(
                _ask(f"{item.item_id}#reference-answers", prompts.answer, r, parse,
                     context=item.reference, questions=json.dumps(qs, ensure_ascii=False))
            )  # fmt: skip
        for (item, key_info, qs), ans in zip(
            written, ask(ans_asks, "reference answers"), strict=True
        ):
            if not ans.ok:
                failures.append((item.item_id, f"reference answers: {ans.failure}"))
                continue
            qset = QuestSet(key_info=key_info, question=qs, answers=ans.value, source=llm)
            out[item.item_id] = item.model_copy(update={"quest_eval": qset})
            counts["generated"] += 1
    failed = {i for i, _ in failures}
    return [out[i.item_id] for i in items if i.item_id not in failed], failures, counts


# ---------------------------------------------------------------- judging an output


def judge_task(gen: Generation, item: Item, prompts: JudgePrompts) -> JudgeTask:
    """One ask: the record's good questions, answered from the output."""
    qset = item.quest_eval
    kept = qset.kept() if qset is not None else []
    if qset is None or not kept:
        return JudgeTask(gen, (), (), prompts.sha)
    targets = tuple(target(i) for i in kept)
    questions = [qset.question[i] for i in kept]

    def parse(text: str | None, wanted: Sequence[str]) -> Parsed:
        try:
            answers = _answers(text, len(targets))
        except ParseError as e:
            return {}, {t: str(e) for t in wanted}
        raw = (text or "").strip()
        by_target = dict(zip(targets, answers, strict=True))
        return {t: Verdict(target_id=t, label=by_target[t], raw=raw) for t in wanted}, {}

    content = prompts.prompt.render(
        context=gen.text or "", questions=json.dumps(questions, ensure_ascii=False)
    )
    request = ChatRequest(
        gen.generation_id,
        [{"role": "user", "content": content}],
        prompts.sha,
        0,
        None,
        prompts.response_format,
    )
    return JudgeTask(gen, targets, (Ask(request, parse, targets, prompts.repair),), prompts.sha)


# ---------------------------------------------------------------- scores


def token_f1(reference: str, answer: str) -> float:
    """Bag-of-tokens F1 between two answers (jieba tokens, whitespace dropped): 1 when both
    are empty, 0 when one is."""
    a = [t for t in T.tokens(reference) if t.strip()]
    b = [t for t in T.tokens(answer) if t.strip()]
    if not a or not b:
        return float(a == b)
    common = sum((Counter(a) & Counter(b)).values())
    if common == 0:
        return 0.0
    p, r = common / len(b), common / len(a)
    return 2 * p * r / (p + r)


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    n_questions: int
    n_answered: int


def score(qset: QuestSet, answers: dict[str, str]) -> Score:
    """An output's RAGQuestEval from its answers to the good questions (target -> answer)."""
    kept = qset.kept()
    answered = [i for i in kept if answers.get(target(i), UNANSWERABLE).strip() != UNANSWERABLE]
    recall = len(answered) / len(kept)
    f1s = [token_f1(qset.answers[i], answers[target(i)]) for i in answered]
    precision = sum(f1s) / len(f1s) if f1s else 0.0
    return Score(precision, recall, len(kept), len(answered))
