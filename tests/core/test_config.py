"""params.yaml validation: the core (runtime, models, judges), each benchmark's section by its
own package, the providers a package defines, and partial loading for one benchmark's stages."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.benchmarks.long2rag.params import Long2ragLeadModel, OverlapJudge
from pipeline.benchmarks.summhay.params import SummhayParams
from pipeline.core.config import OwnedJudge
from pipeline.core.errors import ConfigError
from pipeline.core.params import load_params, validate_params

ROOT = Path(__file__).resolve().parents[2]


def test_default_params_are_valid() -> None:
    params = load_params(ROOT / "params.yaml")
    sh = params.section("summhay", SummhayParams)
    assert sh.models == ["published", "lead", "extractive"]
    assert sh.judges == ["published-gpt-4o", "local"]
    assert params.judges["local"].provider == "local"
    assert sh.scoring.modes == ["paper"]
    # the providers Long2RAG defines are validated by its own classes
    assert isinstance(params.models["l2r-lead"], Long2ragLeadModel)
    assert isinstance(params.judges["l2r-overlap"], OverlapJudge)


def test_a_stage_validates_only_its_own_benchmark() -> None:
    """A SummHay stage leaves the Long2RAG section and entries as written (its DVC deps do not
    cover that package); asking for the section it did not load is an error."""
    raw: dict[str, Any] = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["long2rag"]["settings"] = ["rag_big"]  # invalid, but not this stage's business
    raw["judges"]["l2r-overlap"]["full"] = 5.0
    params = validate_params(raw, benchmarks=["summhay"])
    assert params.section("summhay", SummhayParams).models[0] == "published"
    assert type(params.judges["l2r-overlap"]) is OwnedJudge  # kept as written
    with pytest.raises(ConfigError, match="long2rag section was not loaded"):
        from pipeline.benchmarks.long2rag.params import Long2ragParams

        params.section("long2rag", Long2ragParams)
    with pytest.raises(ConfigError) as e:
        validate_params(raw)  # all of it: both problems are the long2rag package's to find
    assert "long2rag.settings" in str(e.value)


def _params_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text, encoding="utf-8")
    return path


BASE = """
models:
  published: {provider: published}
judges:
  published-gpt-4o: {provider: published}
summhay:
  models: [published]
  judges: [published-gpt-4o]
"""


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = _params_file(tmp_path, BASE + "runtime: local\nruntime: docker\n")
    with pytest.raises(ConfigError, match="duplicate key 'runtime'"):
        load_params(path)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = _params_file(
        tmp_path, BASE.replace("models: [published]", "models: [published]\n  modles: [x]")
    )
    with pytest.raises(ConfigError, match=r"summhay\.modles: Extra inputs"):
        load_params(path)


def test_unknown_section_is_not_a_benchmark(tmp_path: Path) -> None:
    path = _params_file(tmp_path, BASE + "summhya: {models: [x], judges: [y]}\n")
    with pytest.raises(ConfigError, match="unknown section 'summhya': not a benchmark"):
        load_params(path)


def test_unknown_and_foreign_providers(tmp_path: Path) -> None:
    text = BASE.replace("  published: {provider: published}", "  x: {provider: openia}")
    with pytest.raises(ConfigError, match=r"models\.x.*unknown model provider"):
        load_params(_params_file(tmp_path, text))
    # a provider a benchmark package defines, named in another benchmark's list
    text = BASE.replace(
        "  published: {provider: published}",
        "  published: {provider: published}\n  lead: {provider: long2rag-lead}",
    ).replace("models: [published]", "models: [published, lead]")
    with pytest.raises(
        ConfigError, match="provider long2rag-lead, which belongs to benchmark long2rag"
    ):
        load_params(_params_file(tmp_path, text), ["summhay"])
    # a provider name of a benchmark that does not define it
    text = (
        BASE.replace(
            "  published: {provider: published}",
            "  published: {provider: published}\n  odd: {provider: long2rag-odd}",
        )
        + "long2rag: {models: [odd], judges: [published-gpt-4o]}\n"
    )
    with pytest.raises(ConfigError, match="benchmark long2rag defines no provider 'long2rag-odd'"):
        load_params(_params_file(tmp_path, text), ["long2rag"])


def test_undefined_model_in_run_list(tmp_path: Path) -> None:
    path = _params_file(tmp_path, BASE.replace("models: [published]", "models: [ghost]"))
    with pytest.raises(ConfigError, match="'ghost', which is not defined under models"):
        load_params(path)


def test_bad_mode_and_haystack(tmp_path: Path) -> None:
    text = BASE + "  scoring: {modes: [fancy]}\n  haystacks: [news9]\n"
    with pytest.raises(ConfigError) as info:
        load_params(_params_file(tmp_path, text))
    assert "summhay.scoring.modes[0]: Input should be 'paper' or 'corrected'" in str(info.value)


def test_a_model_setting_is_checked_by_its_benchmark(tmp_path: Path) -> None:
    text = BASE.replace(
        "  published: {provider: published}",
        "  published: {provider: published}\n"
        "  q: {provider: openai, base_url: 'http://x/v1', model: m, settings: [orcale]}",
    ).replace("models: [published]", "models: [published, q]")
    with pytest.raises(
        ConfigError,
        match=r"models\.q\.settings: unknown setting 'orcale': no benchmark has it",
    ):
        load_params(_params_file(tmp_path, text))


def test_a_published_entry_replays_one_benchmark(tmp_path: Path) -> None:
    text = BASE.replace(
        "{provider: published}\njudges", "{provider: published, benchmark: crux}\njudges"
    )
    with pytest.raises(ConfigError, match="'published' replays crux outputs, not summhay's"):
        load_params(_params_file(tmp_path, text))


def test_model_name_must_be_a_safe_stage_name(tmp_path: Path) -> None:
    text = BASE.replace(
        "  published: {provider: published}",
        "  published: {provider: published}\n  'my model': {provider: published}",
    )
    with pytest.raises(ConfigError, match="'my model' has whitespace"):
        load_params(_params_file(tmp_path, text))


@pytest.mark.parametrize(
    ("kind", "name", "reason"),
    [
        ("models", "gpt-4.1", "has a dot, which DVC reads as nesting"),
        ("judges", "judge.v2", "has a dot, which DVC reads as nesting"),
        ("models", ".hidden", "has a dot"),
        ("models", "team/gpt", "has a path separator"),
        ("judges", "a\\b", "has a path separator"),
        ("models", "tab\tname", "has whitespace"),
        ("models", "-rf", "starts with -"),
        ("models", "x" * 65, "is 65 characters long; at most 64"),
        ("judges", "j" * 300, "is 300 characters long"),
        ("models", "caf\u00e9", "must match"),
        ("models", "", "is empty"),
    ],
)
def test_an_entry_name_that_dvc_files_or_python_cannot_hold_is_refused_with_the_reason(
    kind: str, name: str, reason: str
) -> None:
    """Issue 26, point 9 (and issue 25, point 7): the name becomes a DVC stage and params path,
    file names and the journal's path; refused at check, with why."""
    raw: dict[str, Any] = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw[kind][name] = {"provider": "published"}
    with pytest.raises(ConfigError, match=re.escape(reason)) as e:
        validate_params(raw)
    assert f"\n  {kind}: entry name " in str(e.value)


def test_every_entry_name_in_use_is_still_valid() -> None:
    """The names params.yaml, the template and the tests use (a stricter rule must not break
    them)."""
    from pipeline.core.config import name_problem

    names = ["published-gpt-4o", "crud-text", "l2r-lead", "l2r-overlap", "crux-contexts",
             "crux-labels", "published", "lead", "extractive", "local", "smol-judge", "p",
             "toy-llm", "sweep-judge", "llm-batch", "gemini-oracle", "_template", "a_b",
             "x" * 64]  # fmt: skip
    assert {n: name_problem(n) for n in names} == dict.fromkeys(names)


ENDPOINT = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
OPENAI = {"provider": "openai", **ENDPOINT}


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize(
    ("path", "extra"),
    [
        (("models", "q", "temperature"), {"models": {"q": OPENAI}}),
        (("models", "q", "top_p"), {"models": {"q": OPENAI}}),
        (("models", "q", "price_input_per_1m"), {"models": {"q": OPENAI}}),
        (("judges", "j", "timeout_s"), {"judges": {"j": OPENAI}}),
        (("judges", "crud-text", "embedding", "temperature"),
         {"judges": {"crud-text": {"provider": "crud_rag-text", "embedding": ENDPOINT}}}),
        (("judges", "local", "train", "c"), {}),
        (("judges", "l2r-overlap", "full"), {}),
        (("crux", "scoring", "w"), {}),
        (("crux", "scoring", "alpha"), {}),
        (("long2rag", "construction", "threshold"), {}),
        (("summhay", "scoring", "partial_credit"), {}),
    ],
)  # fmt: skip
def test_a_non_finite_float_is_refused_anywhere_in_params(
    path: tuple[str, ...], extra: dict[str, Any], value: str
) -> None:
    """`.nan` / `.inf` in any float of params.yaml is an error naming the key (issue 26, point 2):
    one config (allow_inf_nan=False) on the bases every params model derives from."""
    raw: dict[str, Any] = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    for section, entries in copy.deepcopy(extra).items():
        raw[section].update(entries)
    node = raw
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = yaml.safe_load(value)
    with pytest.raises(ConfigError) as e:
        validate_params(raw)
    where = r"\.(?:[^.\s]+\.)?".join(map(re.escape, path))  # (a union's member may follow)
    assert re.search(where + ": Input should be a finite number", str(e.value)), str(e.value)


def test_every_params_model_refuses_non_finite_floats() -> None:
    """The class behind point 2 of issue 26: every model reachable from a benchmark's section or
    a provider it defines (and the core entries) has allow_inf_nan=False, so a new package's
    params inherit it from Strict / EndpointConfig or this fails."""
    import typing

    from pydantic import BaseModel

    from pipeline.core import config, registry

    roots: list[type[BaseModel]] = [config.Params, *config.CORE_MODEL_PROVIDERS.values()]
    roots += config.CORE_JUDGE_PROVIDERS.values()
    for bench in registry.load_all():
        roots += [bench.params_model, *bench.providers]
    seen: set[type[BaseModel]] = set()

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp in seen:
                return
            seen.add(tp)
            for field in tp.model_fields.values():
                walk(field.annotation)
        for arg in typing.get_args(tp):
            walk(arg)

    for root in roots:
        walk(root)
    assert len(seen) > 30
    lax = sorted(m.__name__ for m in seen if m.model_config.get("allow_inf_nan") is not False)
    assert not lax, f"params models that accept NaN/inf: {lax}"


def test_the_longest_names_still_make_file_names_a_file_system_holds(tmp_path: Path) -> None:
    """The entry and benchmark name limits keep every derived file name under 255 bytes (a
    300-character model name used to pass check and fail in the journal's path)."""
    from pipeline.authoring.scaffold import NAME_MAX as BENCH_MAX
    from pipeline.core.config import NAME_MAX
    from pipeline.stages.common import judge_stage, llm_paths

    stage = judge_stage("b" * BENCH_MAX, "m" * NAME_MAX, "j" * NAME_MAX)
    journal = llm_paths(tmp_path, stage)[1]
    for path in (journal, journal.with_suffix(".embeddings.jsonl")):
        assert len(f".{path.name}.12345678.tmp".encode()) <= 255
    (journal.parent).mkdir(parents=True)
    journal.with_suffix(".embeddings.jsonl").write_text("", encoding="utf-8")  # it can be made


# ---------------------------------------------------------------- base_url (issue 36, point 9)

_ENDPOINT_ENTRIES = """
models:
  published: {provider: published}
  mine: {provider: openai, base_url: %(model_url)s, model: m, api_key_env: null}
judges:
  published-gpt-4o: {provider: published}
  mine-judge: {provider: openai, base_url: %(judge_url)s, model: m, api_key_env: null}
summhay:
  models: [published, mine]
  judges: [published-gpt-4o, mine-judge]
"""
GOOD_URL = "http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://user:s3cr3t-pw@127.0.0.1:8000/v1", "a user name or password"),
        ("https://sk-s3cr3t-pw@api.example.com/v1", "a user name or password"),
        ("127.0.0.1:8000/v1", "not an http(s) URL"),
        ("localhost:8000/v1", "not an http(s) URL"),
        ("''", "not an http(s) URL"),
        ("ftp://127.0.0.1/v1", "not an http(s) URL"),
        ("http:///v1", "no host"),
        ("http://127.0.0.1:99999/v1", "port"),
        ("'http://127.0.0.1:8000/v1?api-version=1'", "query"),
    ],
)
@pytest.mark.parametrize("where", ["models.mine", "judges.mine-judge"])
def test_a_base_url_that_is_not_a_plain_http_url_is_refused_naming_the_field(
    tmp_path: Path, url: str, reason: str, where: str
) -> None:
    """A base_url with credentials (the client cannot send them: every request failed as an
    "unexpected error"), or that is not an http(s) URL with a host, is refused when params are
    loaded (`lfbench check`, and every stage), naming the field; a password is never echoed."""
    urls = {"model_url": GOOD_URL, "judge_url": GOOD_URL}
    urls["model_url" if where == "models.mine" else "judge_url"] = url
    path = _params_file(tmp_path, _ENDPOINT_ENTRIES % urls)
    with pytest.raises(ConfigError) as e:
        load_params(path, benchmarks=["summhay"])
    message = str(e.value)
    assert f"{where}.base_url: " in message and reason in message, message
    assert "s3cr3t" not in message
    load_params(_params_file(tmp_path, _ENDPOINT_ENTRIES % {"model_url": GOOD_URL,
                                                            "judge_url": GOOD_URL}))  # fmt: skip


def test_lfbench_check_refuses_credentials_in_base_url_without_echoing_them(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    url = "http://user:s3cr3t-pw@127.0.0.1:8000/v1"
    path = _params_file(tmp_path, _ENDPOINT_ENTRIES % {"model_url": url, "judge_url": GOOD_URL})
    lfbench = Path(sys.executable).parent / "lfbench"
    done = subprocess.run(
        [str(lfbench), "check", "--params", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "models.mine.base_url: " in done.stderr and "api_key_env" in done.stderr
    assert "s3cr3t" not in done.stdout + done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("'http://127.0.0.1:8000/v1?key=sk-s3cr3t'", "query or fragment"),
        ("'http://127.0.0.1:8000/v1#sk-s3cr3t'", "query or fragment"),
        ("'http://127.0.0.1:8000/v1?a=1&token=sk-s3cr3t#more-s3cr3t'", "query or fragment"),
        ("'127.0.0.1:8000/v1?key=sk-s3cr3t'", "not an http(s) URL"),
        ("'localhost:8000/v1#sk-s3cr3t'", "not an http(s) URL"),
        ("'http:///v1?key=sk-s3cr3t'", "no host"),
        ("'http://127.0.0.1:99999/v1?key=sk-s3cr3t'", "port"),
        ("'http://127.0.0.1:99999/v1/x@sk-s3cr3t'", "port"),
        ("'http:///v1/x@sk-s3cr3t'", "no host"),
    ],
)
def test_a_secret_in_base_url_s_query_or_fragment_is_never_echoed(
    tmp_path: Path, url: str, reason: str
) -> None:
    """Issue 44, point 9. Before: `has a query or fragment ('http://...?key=sk-...')`, and the
    other refusals (no host, a bad port, not http) echoed the whole URL too. Now the message
    shows the URL without its query, fragment or anything from an `@` on."""
    path = _params_file(tmp_path, _ENDPOINT_ENTRIES % {"model_url": url, "judge_url": GOOD_URL})
    with pytest.raises(ConfigError) as e:
        load_params(path, benchmarks=["summhay"])
    message = str(e.value)
    assert "models.mine.base_url: " in message and reason in message, message
    assert "s3cr3t" not in message, message


# ---------------------------------------------------------------- issue 36, points 10, 13, 15


@pytest.mark.parametrize(
    ("line", "kind"), [("? [a, b]: 1", "mapping"), ("[a, b]: 1", "list"), ("? [a, b]", "list")]
)
def test_a_key_that_is_not_a_name_is_an_error_naming_its_line(
    tmp_path: Path, line: str, kind: str
) -> None:
    """Before: `TypeError: unhashable type: 'list'` and a traceback."""
    path = _params_file(tmp_path, BASE + line + "\n")
    with pytest.raises(ConfigError, match=f"line 9: a key that is a {kind}"):
        load_params(path)


def test_yaml_anchors_and_aliases_are_refused_with_the_reason(tmp_path: Path) -> None:
    """An alias bomb (nine aliases of nine aliases ...) stalls DVC's parser for minutes; a
    plain anchor and alias are refused too, before anything is built (before: accepted)."""
    plain = BASE.replace("  published: {provider: published}", "  published: &p {provider:"
                         " published}").replace("  published-gpt-4o: {provider: published}",
                                                "  published-gpt-4o: *p")  # fmt: skip
    assert yaml.safe_load(plain)["judges"]["published-gpt-4o"] == {"provider": "published"}
    with pytest.raises(ConfigError, match=r"line 3: an anchor \(&p\).*alias bomb"):
        load_params(_params_file(tmp_path, plain))
    bomb = "lol:\n  a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        bomb += f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    with pytest.raises(ConfigError, match="anchors and aliases are refused"):
        load_params(_params_file(tmp_path, BASE + bomb))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("models", "q", "slice", "summhay", "first"), "'3'"),
        (("models", "q", "slice", "summhay", "first"), "true"),
        (("models", "q", "slice", "summhay", "first"), "3.0"),
        (("models", "q", "max_tokens"), "'512'"),
        (("models", "q", "temperature"), "'0.5'"),
        (("models", "q", "samples"), "true"),
        (("models", "q", "length_study"), "'yes'"),
        (("models", "q", "length_study"), "1"),
        (("models", "q", "model"), "7"),
        (("judges", "local", "embedding_cache"), "'false'"),
        (("summhay", "subtopics"), "'2'"),
        (("crud_rag", "grid", "chunk"), "[['128', 8]]"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_refused_not_converted(
    path: tuple[str, ...], value: str
) -> None:
    """Before: `first: "3"` ran 3 items and `first: true` 1 (pydantic's lax conversions); every
    params model is strict now: a string is not a number, a bool not an int, 1 not a bool."""
    raw: dict[str, Any] = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["models"]["q"] = {**OPENAI, "slice": {"summhay": {"first": 2}}}
    raw["summhay"]["models"].append("q")
    node = raw
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = yaml.safe_load(value)
    with pytest.raises(ConfigError) as e:
        validate_params(raw)
    where = r"\.(?:[^.\s]+\.)?".join(map(re.escape, path))  # (a union's member may follow)
    message = str(e.value)
    assert re.search(where + r"(\[\d+\])*: Input should be a valid", message), message


def test_the_right_types_still_pass_strict_validation() -> None:
    """An int where a float is meant, YAML lists where pairs are meant (CRUD-RAG's chunk
    grid): what params.yaml writes naturally is still valid."""
    raw: dict[str, Any] = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["models"]["q"] = {**OPENAI, "temperature": 0, "price_input_per_1m": 1, "timeout_s": 30}
    raw["summhay"]["models"].append("q")
    raw["crud_rag"]["grid"]["chunk"] = [[128, 8], [256, 4]]
    params = validate_params(raw)
    assert params.models["q"].temperature == 0.0  # type: ignore[union-attr]
