"""The container runtime's pure parts: runtime choice, the environment allow-list, the container
id seen from inside, stage records and the deterministic local image record."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import containers as c
from pipeline.core.config import Params
from pipeline.core.errors import LfbenchError
from tests.conftest import ROOT, run

IMAGE = {"runtime": "docker", "image_id": "sha256:" + "ab" * 32}
LOCAL = {"runtime": "local", "image_id": None}


@pytest.mark.parametrize(
    ("requested", "engine", "record", "chosen"),
    [
        ("local", True, IMAGE, "local"),
        ("local", False, None, "local"),
        ("auto", False, IMAGE, "local"),
        ("auto", True, None, "local"),
        ("auto", True, LOCAL, "local"),
        ("auto", True, IMAGE, "docker"),
        ("docker", True, IMAGE, "docker"),
    ],
)
def test_choose_runtime(
    requested: str, engine: bool, record: dict[str, Any] | None, chosen: str
) -> None:
    got, why = c.choose_runtime(requested, engine, record)
    assert got == chosen and why


@pytest.mark.parametrize(
    ("engine", "record", "message"),
    [
        (False, IMAGE, "no Docker engine answers"),
        (True, None, "names no image"),
        (True, LOCAL, "names no image"),
    ],
)
def test_docker_runtime_fails_clearly(
    engine: bool, record: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(LfbenchError, match=message):
        c.choose_runtime("docker", engine, record)


def test_build_runtime() -> None:
    assert c.build_runtime("local", True) == "local"
    assert c.build_runtime("auto", False) == "local"
    assert c.build_runtime("auto", True) == "docker"
    assert c.build_runtime("docker", True) == "docker"
    with pytest.raises(LfbenchError, match="no Docker engine"):
        c.build_runtime("docker", False)


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
    assert c.container_id_from(MOUNTINFO) == CID
    assert c.container_id_from(HOST_MOUNTINFO) is None
    assert c.container_id_from(f"0::/docker/{CID}\n") == CID
    assert c.container_id_from(f"0::/system.slice/docker-{CID}.scope\n") == CID
    assert c.container_id_from("0::/user.slice/user-1000.slice\n") is None


def test_stage_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LFBENCH_RUNTIME", "local")
    monkeypatch.delenv("LFBENCH_IMAGE_DIGEST", raising=False)
    args = ["--benchmark", "summhay", "--out", "x.jsonl"]
    path = c.write_stage_record(tmp_path, "construct", args)
    assert path.parent == tmp_path / ".lfbench" / "stages"
    assert path.name.startswith("construct-") and len(path.stem) == len("construct-") + 8
    assert path == c.stage_record_path(tmp_path, "construct", args)
    assert path != c.stage_record_path(tmp_path, "construct", [*args, "--params", "p.yaml"])
    rec = json.loads(path.read_text())
    assert rec["runtime"] == "local" and rec["image_digest"] is None
    assert rec["python"] == sys.executable and rec["args"] == args
    assert isinstance(rec["uid"], int) and isinstance(rec["gid"], int)


def test_local_image_record_is_deterministic(tmp_path: Path) -> None:
    """`lfbench image build` with runtime local: same bytes every time; only the lock changes it."""
    for name in ("params.yaml", "requirements.lock", "Dockerfile"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    params = (tmp_path / "params.yaml").read_text().replace("runtime: auto", "runtime: local")
    (tmp_path / "params.yaml").write_text(params)
    out = []
    for i in range(2):
        run(["lfbench", "image", "build", "--out", f"image{i}.json"], tmp_path)
        out.append((tmp_path / f"image{i}.json").read_bytes())
    assert out[0] == out[1]
    rec = json.loads(out[0])
    assert rec == c.local_record(tmp_path / "requirements.lock")
    assert rec["runtime"] == "local" and rec["image_id"] is None
    with (tmp_path / "requirements.lock").open("a") as f:
        f.write("# changed\n")
    run(["lfbench", "image", "build", "--out", "image2.json"], tmp_path)
    assert json.loads((tmp_path / "image2.json").read_text())["lock_sha256"] != rec["lock_sha256"]


def test_auto_without_engine_runs_locally(tmp_path: Path) -> None:
    """`auto` with a dead DOCKER_HOST: the image stage writes the local record (no error)."""
    for name in ("params.yaml", "requirements.lock", "Dockerfile"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    dead = f"unix://{tmp_path / 'dead.sock'}"
    proc = run(
        ["lfbench", "image", "build", "--out", "image.json"], tmp_path, {"DOCKER_HOST": dead}
    )
    assert json.loads((tmp_path / "image.json").read_text())["runtime"] == "local"
    assert "no image built" in proc.stderr


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
        c.check_wheelhouse(lock, wh)
    (wh / "antlr4-python3-runtime-4.9.3.tar.gz").write_bytes(b"")
    c.check_wheelhouse(lock, wh)  # pywin32 is for Windows only


def test_default_base_is_pinned_by_digest() -> None:
    base = c.default_base_image(ROOT / "Dockerfile")
    assert base.startswith("python:3.11-slim-bookworm@sha256:")
    assert len(base.split("@sha256:")[1]) == 64
