"""What an lfbench process prints: each step, its progress and its result, warnings that matter;
a library's chatter only with `--verbose` (or LFBENCH_VERBOSE=1, for the stages of a dvc repro).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.core.progress import Ticker

# An lfbench process's logging, then what the stages' libraries do: bm25s sets its own logger to
# DEBUG on import and logs a line per index; ONNX Runtime's quantiser logs on the root logger.
SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from pipeline.cli import _setup_logging
    _setup_logging(verbose=False)
    import bm25s
    bm25s.BM25().index([["one", "two"], ["two", "three"]], show_progress=False)
    logging.info('Quantization parameters for tensor:"l0.ln1" not specified')
    logging.getLogger("pipeline.stages.judge").info("wrote judgements/x.jsonl: 3 judgements")
    logging.getLogger("pipeline.stages.judge").debug("a detail")
    logging.getLogger("some.library").warning("a library's warning")
    """
)


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "LFBENCH_VERBOSE"} | env_extra
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_library_s_chatter_stays_out_of_the_log() -> None:
    err = _run({})
    assert "Building index from tokens" not in err
    assert "Quantization parameters" not in err
    assert "a detail" not in err
    assert "INFO pipeline.stages.judge: wrote judgements/x.jsonl: 3 judgements" in err
    assert "WARNING some.library: a library's warning" in err


def test_verbose_from_the_environment_shows_everything() -> None:
    err = _run({"LFBENCH_VERBOSE": "1"})
    assert "DEBUG bm25s: Building index from tokens" in err
    assert "Quantization parameters" in err and "a detail" in err


def test_the_quantiser_s_root_logger_lines_move_to_debug(tmp_path: Path) -> None:
    """Building the int8 encoder: ONNX Runtime's quantiser logs an INFO line per tensor and a
    warning (pre-processing, for image models) on the root logger; none reaches the user."""
    script = textwrap.dedent(
        f"""
        import logging
        from pathlib import Path
        from pipeline.cli import _setup_logging
        _setup_logging(verbose=False)
        from pipeline.local_judge import encoder_onnx
        encoder_onnx.model_path(Path({str(tmp_path)!r}))
        logging.warning("after the build: warnings pass again")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "LFBENCH_VERBOSE"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "pre-processing" not in done.stderr and "Quantization" not in done.stderr
    assert "after the build: warnings pass again" in done.stderr


def test_a_long_step_logs_its_progress(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    now = [0.0]
    ticker = Ticker(logging.getLogger("pipeline.test"), "embedding", 1000, "texts", every=10,
                    clock=lambda: now[0])  # fmt: skip
    with caplog.at_level(logging.INFO):
        for _ in range(10):
            now[0] += 4.0
            ticker.advance(100)
    lines = [r.getMessage() for r in caplog.records]
    # every 10 s of a 40 s step (the last one, at the end, is the caller's "done" line)
    assert lines == [
        "embedding: 300/1,000 texts (30%), 25/s, about 28 s left",
        "embedding: 600/1,000 texts (60%), 25/s, about 16 s left",
        "embedding: 900/1,000 texts (90%), 25/s, about 4 s left",
    ]
