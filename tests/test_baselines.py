"""No-model baselines: sentence splitting, lead and extractive summaries with citations."""

from __future__ import annotations

from pathlib import Path

from pipeline.baselines import Doc, extractive, lead, split_sentences
from pipeline.benchmarks.summhay.generation import baseline_generations
from pipeline.benchmarks.summhay.params import SummhayParams
from pipeline.benchmarks.summhay.scoring import extract_bullets, extract_citations
from pipeline.core.config import BaselineModel
from pipeline.core.params import validate_params
from pipeline.data.haystacks import load_raw_haystack, normalise


def test_split_sentences_keeps_abbreviations_and_initials() -> None:
    text = (
        "Mr. Smith went to Washington. He met U.S. officials on Jan. 5. "
        '"It was great," he said! Then 3 people left? A. B. Jones stayed.\nA new line here'
    )
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.",
        "He met U.S. officials on Jan. 5.",
        '"It was great," he said!',
        "Then 3 people left?",
        "A. B. Jones stayed.",
        "A new line here",
    ]
    assert split_sentences("") == []


DOCS = [
    Doc(
        4,
        "Foot Locker will close four hundred stores next year. Its shares fell sharply on Monday.",
    ),
    Doc(9, "The weather in Ohio was cold this week. Foot Locker will close four hundred stores."),
    Doc(2, "Sneaker sales rose among young buyers in spring. Analysts expect more growth soon."),
]


def test_lead_takes_first_sentences_in_context_order_then_second() -> None:
    out = lead("ignored", DOCS, 4)
    assert out.split("\n") == [
        "- Foot Locker will close four hundred stores next year. [4]",
        "- The weather in Ohio was cold this week. [9]",
        "- Sneaker sales rose among young buyers in spring. [2]",
        "- Its shares fell sharply on Monday. [4]",
    ]
    assert len(lead("q", DOCS, 100).split("\n")) == 6  # every sentence once
    assert lead("q", [], 3) == ""
    # Sentences under min_words words are not used.
    assert lead("q", [Doc(1, "Too short here. This one is long enough to use.")], 2) == (
        "- This one is long enough to use. [1]"
    )


def test_extractive_ranks_by_query_merges_duplicates_and_cites_all_sources() -> None:
    out = extractive("Foot Locker store closures", DOCS, 2)
    bullets = out.split("\n")
    # The closure sentence is in docs 4 and 9 (near-verbatim): one bullet citing both; BM25
    # prefers the shorter wording (doc 9), and the longer near-duplicate is dropped.
    assert bullets[0] == "- Foot Locker will close four hundred stores. [4][9]"
    assert len(bullets) == 2
    assert "next year" not in out
    # The scorer reads the citations back.
    assert extract_citations(bullets[0]) == [4, 9]


def test_baseline_generations_on_a_haystack(
    haystack: dict[str, object], write_haystack: object, tmp_path: Path
) -> None:
    haystack["documents"] = [  # type: ignore[index]
        {
            "document_id": f"d{i}",
            "document_text": f"Doc number {i} says something long enough. Line {i} is here too.",
            "insights_included": ins,
        }
        for i, ins in ((1, ["i1"]), (2, ["i1", "i3"]), (3, ["i2"]))
    ]
    path = write_haystack(haystack, "topic_news1.json")  # type: ignore[operator]
    hay = normalise("news1", load_raw_haystack(path), path.name)
    params = validate_params(
        {
            "models": {"lead": {"provider": "baseline", "kind": "lead", "settings": ["oracle"]}},
            "judges": {"local": {"provider": "local"}},
            "summhay": {"models": ["lead"], "judges": ["local"]},
        }
    )
    spec = params.models["lead"]
    assert isinstance(spec, BaselineModel)
    section = params.section("summhay", SummhayParams)
    gens = baseline_generations(section, params.seed, "lead", spec, [hay])
    assert [g.item_id for g in gens] == ["news1/s1", "news1/s2"]
    s1 = gens[0]
    assert s1.status == "ok" and s1.setting == "oracle" and s1.system == "lead"
    # Oracle context of s1: docs with its insights (1, 2, 3), 2 insights -> 2 bullets.
    bullets = extract_bullets(s1.text or "")
    assert len(bullets) == 2
    assert [extract_citations(b) for b in bullets] == [[1], [2]]


def test_bad_baseline_entry_is_a_named_config_error(tmp_path: Path) -> None:
    import pytest

    from pipeline.core.errors import ConfigError
    from pipeline.core.params import load_params

    p = tmp_path / "params.yaml"
    p.write_text(
        "models:\n  lead: {provider: baseline, kind: abstractive}\n"
        "judges:\n  local: {provider: local}\n"
        "summhay: {models: [lead], judges: [local]}\n"
    )
    with pytest.raises(ConfigError, match=r"models\.lead.*kind"):
        load_params(p)
