"""Cost of running stages in the image: size, builds, per-stage overhead, push and pull.

    python perf/container_overhead.py [--base IMAGE] [--repeat 10] [--skip-cold] [--skip-stores]

(i) image size, against its base; (ii) build times of the recipe of this working tree on BASE:
present (nothing to do), cached rebuild (layer cache), and two cold builds (`--no-cache`; the
wheelhouse download is cached per lock and not counted), with whether the two cold builds gave
the same image id and, if not, how many layers differ; (iii) per-stage overhead: an empty
command (`python -c pass`, then `python -m pipeline.cli --version` from the mounted workspace)
through the container runner (what `lfbench run` uses) against the same command as a local
process, median of REPEAT runs; (iv) push and pull of the image through an OCI registry (Debian's
docker-registry on loopback) and through a folder DVC remote (`lfbench image push|pull`'s code),
each pull into an engine that no longer has the image. Prints JSON. Needs a Docker engine and the
base image (default lfbench-base:bookworm from scripts/build-base-image.sh).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.env import containers, image_store  # noqa: E402
from pipeline.env import image as img  # noqa: E402


def _median(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
    }


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return round(time.perf_counter() - start, 2), out


def _keep(client: Any, image_id: str) -> None:
    """A second tag, so that removing the recipe's tag forgets the image only by name."""
    client.images.get(image_id).tag("lfbench-perf-keep", image_id[7:19])


def _cold_pair(ctx: Path, rec: dict[str, Any], client: Any, n: int = 2) -> dict[str, Any]:
    ids, layers, times = [], [], []
    for _ in range(n):
        t, image_id = _timed(lambda: img.build_image(ctx, rec, client=client, nocache=True))
        times.append(t)
        ids.append(image_id)
        layers.append(client.images.get(image_id).attrs["RootFS"]["Layers"])
        _keep(client, image_id)
    differ = sum(1 for a, b in zip(layers[0], layers[-1], strict=False) if a != b)
    return {
        "builder": img.image_builder(),
        "build_cold_s": times,
        "cold_builds_same_id": len(set(ids)) == 1 and n > 1,
        "layers": len(layers[0]),
        "layers_differing": differ,
        "cold_ids": ids,
    }


def _registry(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp / "registry.yml"
    cfg.write_text(
        json.dumps(
            {
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(tmp / "registry")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"127.0.0.1:{port}/lfbench"
        time.sleep(0.1)
    raise RuntimeError("docker-registry did not start")


def _stores(root: Path, rec: dict[str, Any], image_id: str, client: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ws = root / "ws"
    ws.mkdir()
    # This Python's dvc (the venv's), whether or not the venv is on PATH.
    dvc = (
        str(Path(sys.executable).parent / "dvc")
        if (Path(sys.executable).parent / "dvc").exists()
        else "dvc"
    )
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    subprocess.run([dvc, "init", "-q"], cwd=ws, check=True)
    subprocess.run(
        [dvc, "remote", "add", "-d", "team", str(root / "remote")],
        cwd=ws,
        check=True,
        stdout=subprocess.DEVNULL,  # "Setting ... as a default remote" would spoil the JSON
    )
    repo, tag = rec["tag"].split(":")

    def forget() -> None:
        client.images.remove(rec["tag"])  # the keep tag holds the layers; the name is gone
        if shutil.which("docker-registry"):
            for t in client.images.get(image_id).tags:
                if t.startswith("127.0.0.1:"):
                    client.images.remove(t)

    _keep(client, image_id)
    if shutil.which("docker-registry"):
        proc, registry = _registry(root)
        try:
            out["registry_push_s"], ref = _timed(
                lambda: image_store.push_registry(ws, rec, registry, client=client)
            )
            forget()
            client.images.remove(image_id, force=True)  # a colleague's engine: no layers at all
            out["registry_pull_s"], got = _timed(
                lambda: image_store.pull_registry(ws, rec, client=client)
            )
            out["registry_same_id"] = got == image_id
            out["registry_ref"] = ref
        finally:
            proc.terminate()
            proc.wait()
    _keep(client, image_id)
    out["dvc_push_s"], dest = _timed(lambda: image_store.push_dvc(ws, rec, client=client))
    out["dvc_archive_mb"] = round(Path(dest).stat().st_size / 1e6, 1)
    forget()
    client.images.remove(image_id, force=True)
    out["dvc_pull_s"], got = _timed(lambda: image_store.pull_dvc(ws, rec, client=client))
    out["dvc_same_id"] = got == image_id
    client.images.get(image_id).tag(repo, tag)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="lfbench-base:bookworm")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--skip-cold", action="store_true", help="Skip the --no-cache builds.")
    ap.add_argument("--cold", type=int, default=2, help="How many cold builds (default 2).")
    ap.add_argument("--skip-stores", action="store_true", help="Skip push and pull.")
    args = ap.parse_args()

    client = containers.docker_client()
    if client is None:
        sys.exit("no Docker engine answers")
    result: dict[str, Any] = {"base_image": args.base, "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        for name in img.RECIPE_FILES:
            shutil.copy2(ROOT / name, ctx / name)
        rec = img.recipe(ctx, args.base)
        result["recipe"] = rec["tag"]
        img.wheelhouse(img.lock_files(ctx))  # download once, outside the timings
        if not args.skip_cold:
            result.update(_cold_pair(ctx, rec, client, args.cold))
            print(json.dumps(result), file=sys.stderr, flush=True)
        image = img.find_image(client, rec) or img.build_image(ctx, rec, client=client)
        result["ensure_present_s"], _ = _timed(
            lambda: image_store.ensure_image(ctx, rec, client=client)
        )
        result["build_cached_s"], again = _timed(lambda: img.build_image(ctx, rec, client=client))
        result["build_cached_same_id"] = again == image
        result["image_id"] = image
        result["image_mb"] = round(client.images.get(image).attrs["Size"] / 1e6, 1)
        result["base_mb"] = round(client.images.get(args.base).attrs["Size"] / 1e6, 1)

        def in_container(argv: list[str]) -> Callable[[], object]:
            def go() -> None:
                out, err = io.StringIO(), io.StringIO()
                env = {"PYTHONPATH": str(ROOT)}
                code = containers.run_stage_in_container(
                    image, argv, ROOT, env, client=client, stdout=out, stderr=err
                )
                if code != 0:
                    raise RuntimeError(err.getvalue())

            return go

        def local(argv: list[str]) -> Callable[[], object]:
            return lambda: subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)

        cli = ["-m", "pipeline.cli", "--version"]
        for label, c_argv, l_argv in (
            ("python -c pass", ["python", "-c", "pass"], [sys.executable, "-c", "pass"]),
            ("python -m pipeline.cli --version", ["python", *cli], [sys.executable, *cli]),
        ):
            dock = _median(in_container(c_argv), args.repeat)
            loc = _median(local(l_argv), args.repeat)
            result[label] = {
                "container": dock,
                "local": loc,
                "overhead_median_s": round(dock["median_s"] - loc["median_s"], 3),
            }
        print(json.dumps(result), file=sys.stderr, flush=True)  # so far, should a store fail
        if not args.skip_stores:
            result.update(_stores(Path(tmp), rec, image, client))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
