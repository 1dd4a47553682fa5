"""Scripted answers for the test server (`tests.e2e.crud_responder:respond`) to CRUD-RAG's
RAGQuestEval prompts:

- question generation: one key phrase per clause of the reference (its first four characters),
  and the question 关于“<phrase>”，文中说了什么？ (`questions` below);
- answering: each question's phrase when the text holds it, else 无法推断 (`answer` below, which
  the test uses to recompute every answer). A question list that holds 乱码 gets an answer that
  does not parse on the first attempt; the repair is answered correctly.
"""

from __future__ import annotations

import json
import re
from typing import Any

UN = "无法推断"
PHRASE = re.compile(r"关于“([^”]+)”")


def clauses(text: str) -> list[str]:
    return [c.strip() for c in re.split(r"[，。；！？,.;]", text) if len(c.strip()) >= 2]


def questions(reference: str) -> tuple[list[str], list[str]]:
    phrases = list(dict.fromkeys(c[:4] for c in clauses(reference)))
    return phrases, [f"关于“{p}”，文中说了什么？" for p in phrases]


def answer(question: str, text: str) -> str:
    found = PHRASE.search(question)
    return found.group(1) if found and found.group(1) in text else UN


def _between(task: str, start: str, end: str) -> str:
    return task.split(start, 1)[1].split(end, 1)[0].strip()


def respond(body: dict[str, Any]) -> str:
    messages = body.get("messages", [])
    task = str(messages[0].get("content", "")) if messages else ""
    first_attempt = len(messages) == 1
    if task.startswith("阅读下面的新闻文本"):
        key_info, qs = questions(_between(task, "新闻文本：\n", "\n\n只输出"))
        return json.dumps({"key_info": key_info, "question": qs}, ensure_ascii=False)
    if task.startswith("只根据下面的文本回答每个问题"):
        text = _between(task, "文本：\n", "\n\n问题（JSON列表）：")
        qs = json.loads(_between(task, "问题（JSON列表）：\n", "\n\n只输出"))
        if first_attempt and any("乱码" in q for q in qs):
            return "答案如下：" + "、".join(qs)
        return json.dumps({"answers": [answer(q, text) for q in qs]}, ensure_ascii=False)
    return "未知的请求"
