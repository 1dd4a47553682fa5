"""The container runtime's pure parts: the input-addressed recipe, the runtime decision and its
memo per `dvc repro`, the environment allow-list, the container id seen from inside and stage
records."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.config import Params
from pipeline.core.errors import LfbenchError
from pipeline.env import containers as c
from pipeline.env import image as img
from pipeline.stages import record
from tests.conftest import ROOT, run

RECIPE = {"recipe": "ab" * 32, "tag": "lfbench:" + "ab" * 6}
IMAGE_ID = "sha256:" + "cd" * 32


def _has() -> tuple[str, str]:
    return IMAGE_ID, "present"


def _cannot() -> tuple[str, str]:
    raise LfbenchError("base image x is not present and cannot be pulled")


def _crashes() -> tuple[str, str]:
    raise OSError("the engine hung up")


@pytest.mark.parametrize(
    ("requested", "engine", "obtain", "chosen", "warn"),
    [
        ("local", True, _has, "local", False),
        ("local", False, _cannot, "local", False),
        ("auto", False, _has, "local", True),
        ("auto", True, _cannot, "local", True),
        ("auto", True, _crashes, "local", True),
        ("auto", True, _has, "docker", False),
        ("docker", True, _has, "docker", False),
    ],
)
def test_decide(requested: str, engine: bool, obtain: Any, chosen: str, warn: bool) -> None:
    got = c.decide(requested, RECIPE, client=object() if engine else None, obtain=obtain)
    assert got["runtime"] == chosen and got["why"] and got["recipe"] == RECIPE["recipe"]
    assert bool(got.get("warn")) == warn
    assert got.get("image_id") == (IMAGE_ID if chosen == "docker" else None)
    if obtain is not _has and engine and requested == "auto":  # the reason, for the warning
        assert got["reason"] in (
            "base image x is not present and cannot be pulled",
            "OSError: the engine hung up",
        )


@pytest.mark.parametrize(
    ("engine", "obtain", "message"),
    [
        (False, _has, "no Docker engine answers"),
        (True, _cannot, "cannot be pulled"),
        (True, _crashes, "OSError: the engine hung up"),
    ],
)
def test_docker_runtime_fails_clearly(engine: bool, obtain: Any, message: str) -> None:
    with pytest.raises(LfbenchError, match=message):
        c.decide("docker", RECIPE, client=object() if engine else None, obtain=obtain)


def test_the_decision_is_remembered_per_dvc_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stages of one `dvc repro` share the first stage's decision; another run decides anew."""
    monkeypatch.setattr(c, "repro_key", lambda: "999999998-1")  # a dvc process, gone by now
    assert c.remembered(tmp_path, RECIPE, "auto") is None
    decision = {"runtime": "local", "why": "auto: no Docker engine answers", "recipe": "x"}
    c.remember(tmp_path, RECIPE, "auto", decision)
    assert c.remembered(tmp_path, RECIPE, "auto") == decision
    assert c.remembered(tmp_path, RECIPE, "docker") is None  # params changed: decide again
    monkeypatch.setattr(c, "repro_key", lambda: "999999999-1")  # another dvc process
    assert c.remembered(tmp_path, RECIPE, "auto") is None
    c.remember(tmp_path, RECIPE, "auto", decision)  # and the finished run's memo is swept
    assert [p.name.split("-")[0] for p in (tmp_path / ".lfbench" / "runtime").iterdir()] == [
        "999999999"
    ]


RAW_PARAMS: dict[str, Any] = {
    "runtime": "docker",
    "env_passthrough": ["HF_TOKEN_PROBE"],
    "models": {
        "published": {"provider": "published"},
        "qwen": {"provider": "openai", "api_key_env": None},
        "gpt": {"provider": "openai", "api_key_env": "OPENAI_API_KEY"},
    },
    "judges": {"claude": {"provider": "openai", "api_key_env": "ANTHROPIC_KEY"}},
    "retrieval": {"embedder": {"api_key_env": "EMBED_KEY"}},
}


def test_container_env_is_an_allow_list() -> None:
    environ = {
        "OPENAI_API_KEY": "sk-1",
        "ANTHROPIC_KEY": "sk-2",
        "HF_TOKEN_PROBE": "hf",
        "LFBENCH_DATA_MIRROR": "/mirror",
        "LFBENCH_SECRET_PROBE": "nope",
        "LFBENCH_VERBOSE": "1",
        "AWS_SECRET_ACCESS_KEY": "nope",
        "PATH": "/usr/bin",
        "HOME": "/root",
    }
    runner = {
        "LFBENCH_GIT_COMMIT": "abc",
        "LFBENCH_GIT_DIRTY": "false",
        "LFBENCH_RUNTIME": "docker",
        "LFBENCH_IMAGE_DIGEST": "sha256:x",
        "SOMETHING_ELSE": "dropped",
    }
    env = c.container_env(RAW_PARAMS, environ, runner)
    assert env == {
        "LFBENCH_GIT_COMMIT": "abc",
        "LFBENCH_GIT_DIRTY": "false",
        "LFBENCH_RUNTIME": "docker",
        "LFBENCH_IMAGE_DIGEST": "sha256:x",
        "LFBENCH_DATA_MIRROR": "/mirror",
        "LFBENCH_VERBOSE": "1",
        "OPENAI_API_KEY": "sk-1",
        "ANTHROPIC_KEY": "sk-2",
        "HF_TOKEN_PROBE": "hf",
        "HOME": "/tmp",
    }
    # EMBED_KEY is named but not set: it is simply absent.
    assert c.allowed_names(RAW_PARAMS) == [
        "OPENAI_API_KEY",
        "ANTHROPIC_KEY",
        "EMBED_KEY",
        "HF_TOKEN_PROBE",
    ]


def test_env_passthrough_names_are_validated() -> None:
    with pytest.raises(LfbenchError, match="not a valid environment variable name"):
        c.allowed_names({"env_passthrough": ["OK", "NOT-OK"]})
    base = {
        "models": {"p": {"provider": "published"}},
        "judges": {"j": {"provider": "published"}},
        "summhay": {"models": ["p"], "judges": ["j"]},
    }
    assert Params.model_validate({**base, "env_passthrough": ["A_1"]}).env_passthrough == ["A_1"]
    assert Params.model_validate(base).env_passthrough == []
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        Params.model_validate({**base, "env_passthrough": ["1BAD"]})


CID = "32fbe87eee0aad028ddf8af7c95e34b383141468f681c1d02ea3252b29f35ff4"
OVERLAY = "/var/lib/docker/overlay2/" + "e5" * 32
MOUNTINFO = "".join(
    line + "\n"
    for line in (
        "78 53 0:39 / / rw,relatime master:2 - overlay overlay rw,lowerdir=/var/lib/docker/"
        f"overlay2/l/WE2IT2,upperdir={OVERLAY}/diff,workdir={OVERLAY}/work",
        "79 78 0:41 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw",
        f"95 78 254:0 /var/lib/docker/containers/{CID}/resolv.conf /etc/resolv.conf rw - ext4 x rw",
        f"96 78 254:0 /var/lib/docker/containers/{CID}/hostname /etc/hostname rw - ext4 x rw",
    )
)
HOST_MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
"""


def test_container_id_from_mountinfo_and_cgroup() -> None:
    assert record.container_id_from(MOUNTINFO) == CID
    assert record.container_id_from(HOST_MOUNTINFO) is None
    assert record.container_id_from(f"0::/docker/{CID}\n") == CID
    assert record.container_id_from(f"0::/system.slice/docker-{CID}.scope\n") == CID
    assert record.container_id_from("0::/user.slice/user-1000.slice\n") is None


def test_stage_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LFBENCH_RUNTIME", "local")
    monkeypatch.delenv("LFBENCH_IMAGE_DIGEST", raising=False)
    args = ["--benchmark", "summhay", "--out", "x.jsonl"]
    path = record.write_stage_record(tmp_path, "construct", args)
    assert path.parent == tmp_path / ".lfbench" / "stages"
    assert path.name.startswith("construct-") and len(path.stem) == len("construct-") + 8
    assert path == record.stage_record_path(tmp_path, "construct", args)
    assert path != record.stage_record_path(tmp_path, "construct", [*args, "--params", "p.yaml"])
    rec = json.loads(path.read_text())
    assert rec["runtime"] == "local" and rec["image_digest"] is None
    assert rec["python"] == sys.executable and rec["args"] == args
    assert isinstance(rec["uid"], int) and isinstance(rec["gid"], int)


def _project(tmp_path: Path) -> Path:
    for name in ("params.yaml", *img.RECIPE_FILES):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    return tmp_path


def test_the_recipe_is_input_addressed(tmp_path: Path) -> None:
    """`lfbench image recipe`: the same bytes every time and with or without an engine (no
    image id in it); a changed lock, Dockerfile or base makes a new recipe; nothing else does."""
    proj = _project(tmp_path)
    dead = {"DOCKER_HOST": f"unix://{tmp_path / 'dead.sock'}"}
    out = []
    for i, env in enumerate((None, dead)):
        run(["lfbench", "image", "recipe", "--out", f"image{i}.json"], proj, env)
        out.append((proj / f"image{i}.json").read_bytes())
    assert out[0] == out[1]
    rec = json.loads(out[0])
    assert rec == img.recipe(proj) == img.recipe(ROOT)
    assert rec["base_image"] == img.default_base_image(ROOT / "Dockerfile")
    assert rec["tag"] == f"lfbench:{rec['recipe'][:12]}" and "image_id" not in rec
    want = {"Dockerfile", ".dockerignore", "requirements-image.lock", "requirements-nodeps.lock"}
    assert set(rec["files"]) == set(img.RECIPE_FILES) == want
    (proj / "README.md").write_text("not an input\n")
    assert img.recipe(proj) == rec
    seen = {rec["recipe"], img.recipe(proj, "lfbench-base:bookworm")["recipe"]}
    for name in img.RECIPE_FILES:
        with (proj / name).open("a") as f:
            f.write("# changed\n")
        seen.add(img.recipe(proj)["recipe"])
    assert len(seen) == 2 + len(img.RECIPE_FILES)


def test_a_stale_or_old_recipe_is_refused(tmp_path: Path) -> None:
    proj = _project(tmp_path)
    with pytest.raises(LfbenchError, match="missing: run `dvc repro image`"):
        img.read_recipe(proj)
    (proj / "build").mkdir()
    (proj / "build" / "image.json").write_text('{"runtime": "local", "image_id": null}')
    with pytest.raises(LfbenchError, match="not an image recipe of version 2"):
        img.read_recipe(proj)


def test_auto_without_engine_runs_locally_with_one_warning(tmp_path: Path) -> None:
    """`lfbench run` with auto and a dead DOCKER_HOST: local, warned once per dvc run."""
    proj = _project(tmp_path)
    dead = {"DOCKER_HOST": f"unix://{tmp_path / 'dead.sock'}"}
    run(["lfbench", "image", "recipe"], proj)
    decision, _ = _runtime_in(proj, dead)
    assert decision["runtime"] == "local" and "no Docker engine answers" in decision["why"]


def _runtime_in(proj: Path, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    code = (
        "import json, logging, sys; logging.basicConfig(level=logging.WARNING);"
        "from pathlib import Path; from pipeline.env.runtime import runtime;"
        "d1, _ = runtime(Path.cwd(), 'auto'); d2, _ = runtime(Path.cwd(), 'auto');"
        "assert d1 == d2, (d1, d2); print(json.dumps(d1))"
    )
    proc = run([sys.executable, "-c", code], proj, env)
    assert proc.stderr.count("stages of this run go local") == 1, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_wheelhouse_check_names_missing_entries(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "click==8.5.1 \\\n    --hash=sha256:00\n"
        "pywin32==312 ; sys_platform == 'win32' \\\n    --hash=sha256:00\n"
        "antlr4-python3-runtime==4.9.3 \\\n    --hash=sha256:00\n"
    )
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "click-8.5.1-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(LfbenchError, match=r"lacks antlr4-python3-runtime==4\.9\.3"):
        img.check_wheelhouse(lock, wh)
    (wh / "antlr4-python3-runtime-4.9.3.tar.gz").write_bytes(b"")
    img.check_wheelhouse(lock, wh)  # pywin32 is for Windows only


def test_default_base_is_pinned_by_digest() -> None:
    base = img.default_base_image(ROOT / "Dockerfile")
    assert base.startswith("python:3.11-slim-bookworm@sha256:")
    assert len(base.split("@sha256:")[1]) == 64


# ---------------------------------------------------------------- what the image installs


def _lock_pins(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (pinned requirement line, hashes) of a hash-locked requirements file."""
    from packaging.utils import canonicalize_name

    pins: dict[str, tuple[str, frozenset[str]]] = {}
    name = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and line[0] not in " #-\t":
            req = line.rstrip(" \\")
            name = f"{canonicalize_name(req.split('==')[0])}|{req.split(';')[0].strip()}"
            pins[name] = (req.split(";")[0].strip(), frozenset())
        elif "--hash=" in line and name:
            req, hashes = pins[name]
            pins[name] = (req, hashes | {line.strip().split("--hash=")[1].rstrip(" \\")})
    return pins


def test_the_image_lock_pins_what_the_host_lock_pins() -> None:
    """The image installs the host's versions and files (same pins, same hashes), so a stage
    computes the same bytes in it as locally; and it leaves out what only the host uses."""
    host, image = _lock_pins(ROOT / "requirements.lock"), _lock_pins(ROOT / img.IMAGE_LOCK)
    for key, (req, hashes) in image.items():
        assert key in host, f"{img.IMAGE_LOCK}: {req} is not pinned so in requirements.lock"
        assert hashes == host[key][1], f"{img.IMAGE_LOCK}: {req} has other hashes"
    names = {k.split("|")[0] for k in image}
    for host_only in ("dvc", "docker", "mlflow", "pyarrow", "pandas", "statsmodels", "boto3"):
        assert host_only not in names, f"{img.IMAGE_LOCK} installs {host_only}"
    assert "mlflow-skinny" in names


# Imported by the host side only: the runner (docker), DVC, the team's stores.
# `lfbench repro`'s driver and workers (Dask) run on the host, around the stages: not in the image
# gguf: pipeline/testing/minilm_gguf.py writes a GGUF file on the host (tests, perf), never a
# stage; dvc_data, pathspec: lfbench prune and the cluster driver, on the host
HOST_ONLY_IMPORTS = {"docker", "dvc", "dvc_data", "pathspec", "s3fs", "distributed", "gguf"}
# Removed from the image by the Dockerfile (unused models of jieba, the hub download backend).
NOT_IN_IMAGE = ("jieba.posseg", "jieba.analyse", "jieba.lac_small", "paddle", "hf_xet")


def test_every_module_the_stages_import_is_in_the_image() -> None:
    """Every third-party module pipeline/ imports (outside HOST_ONLY_IMPORTS) comes from a
    distribution of requirements-image.lock: a new import cannot break the image silently."""
    import ast
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    names = {k.split("|")[0] for k in _lock_pins(ROOT / img.IMAGE_LOCK)}
    names |= {k.split("|")[0] for k in _lock_pins(ROOT / img.NODEPS_LOCK)}
    dists = packages_distributions()
    missing = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                if mod.startswith(NOT_IN_IMAGE) or (
                    isinstance(node, ast.ImportFrom)
                    and any(f"{mod}.{a.name}".startswith(NOT_IN_IMAGE) for a in node.names)
                ):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {mod} (not in image)")
                top = mod.split(".")[0]
                if top in sys.stdlib_module_names or top in HOST_ONLY_IMPORTS or top == "pipeline":
                    continue
                got = {str(canonicalize_name(d)) for d in dists.get(top, [])}
                if not got & names:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {mod} ({got})")
    assert not missing, "\n".join(missing)


def test_the_builder_is_buildah_when_it_can_reach_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """buildah (reproducible) when installed and the engine is the default socket's; Docker's
    classic builder otherwise; LFBENCH_IMAGE_BUILDER forces one, with a clear error if it
    cannot be."""
    have = {"buildah": "/usr/bin/buildah"}
    monkeypatch.setattr(img.shutil, "which", lambda name: have.get(name))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv(img.ENV_BUILDER, raising=False)
    assert img.image_builder() == "buildah"
    monkeypatch.setenv(img.ENV_BUILDER, "docker")
    assert img.image_builder() == "docker"
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    monkeypatch.delenv(img.ENV_BUILDER)
    assert img.image_builder() == "docker"
    monkeypatch.setenv(img.ENV_BUILDER, "buildah")
    with pytest.raises(LfbenchError, match=r"DOCKER_HOST=tcp://10\.0\.0\.1:2375"):
        img.image_builder()
    monkeypatch.delenv("DOCKER_HOST")
    have.clear()
    with pytest.raises(LfbenchError, match="buildah is not installed"):
        img.image_builder()
    monkeypatch.setenv(img.ENV_BUILDER, "kaniko")
    with pytest.raises(LfbenchError, match="expected buildah or docker"):
        img.image_builder()
    monkeypatch.delenv(img.ENV_BUILDER)
    assert img.image_builder() == "docker"
