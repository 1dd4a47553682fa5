"""DVC's own steps made cheaper for a process that does them for many stages (a cluster worker).

A worker does DVC's steps for every stage it is sent: it builds the index (dvc.yaml, dvc.lock,
every stage's params.yaml dependencies), pulls inputs, restores from the run cache, pushes. On
the 8-model perf run (perf/parallel_models.py --cluster) two costs there were DVC's, not ours:

- YAML: DVC parses with ruamel's pure-Python constructor, and parses the same text again and
  again: params.yaml once per params dependency of every stage it loads (588 parses for 50
  stages), dvc.yaml and dvc.lock once per index it builds. `memo_yaml` keeps the last results
  of DVC's safe parser by text: the same parser, called once per distinct text; each caller gets
  its own copy (a pickle round trip), as a fresh parse would give it.
- S3 connections: DVC builds its S3 filesystem with fsspec's instance cache switched off, so
  every remote it opens makes a new boto session and client (0.1-0.3 s, three or four times a
  stage: pull, run-cache read, restore, push). `one_remote_session` opens each remote once per
  repository object (a worker makes one per task).

Neither changes what DVC computes: the same parser on the same text, the same remote.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

_MEMO_SIZE = 32
_lock = threading.Lock()
_installed = False
_parsed: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()


def memo_yaml() -> None:
    """Memoize DVC's safe YAML parse in this process (idempotent). DVC looks the parser up in
    two modules' globals at call time: both get the memoized one."""
    global _installed
    from dvc.utils import strictyaml
    from dvc.utils.serialize import _yaml

    with _lock:
        if _installed:
            return
        original = _yaml.parse_yaml
        memo = _memoized(original)
        _yaml.parse_yaml = memo  # load_yaml: params files
        strictyaml.parse_yaml = memo  # dvc.yaml, dvc.lock, .dvc files
        _installed = True


def _memoized(parse: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(parse)
    def parse_yaml(text: str, path: str, typ: str = "safe") -> Any:
        if typ != "safe":  # round-trip documents carry comments and positions: not shared
            return parse(text, path, typ=typ)
        key = (typ, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
        with _lock:
            blob = _parsed.get(key)
            if blob is not None:
                _parsed.move_to_end(key)
        if blob is None:
            data = parse(text, path, typ=typ)  # a parse error propagates, nothing is kept
            blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
            with _lock:
                _parsed[key] = blob
                while len(_parsed) > _MEMO_SIZE:
                    _parsed.popitem(last=False)
        return pickle.loads(blob)  # our own bytes, made just above

    return parse_yaml


def one_remote_session(repo: Any) -> None:
    """This repository opens each DVC remote once: later asks get the same remote (one S3
    session and client for a task's pulls, run-cache reads, restore and pushes, as within one
    DVC command; a new repository, a new session, so no listing outlives a task)."""
    cloud = repo.cloud
    original = cloud.get_remote
    opened: dict[str | None, Any] = {}

    def get_remote(name: str | None = None, command: str = "<command>") -> Any:
        name = name or repo.config["core"].get("remote")  # as DVC: the default remote
        if name not in opened:
            opened[name] = original(name=name, command=command)
        return opened[name]

    cloud.get_remote = get_remote
