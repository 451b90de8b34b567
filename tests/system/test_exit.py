"""A job exits 0 after a window, with torch.compile too: schedulers mark anything else as failed.

On Python 3.12.3 with CUDA a compiled Lightning job that had run VizTracer exited with SIGSEGV
during interpreter shutdown, after every file was written. The script runs in a real subprocess so
the exit status is the interpreter's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.paths import REPO, SCRIPTS

SCRIPT = SCRIPTS / "exit" / "compiled_fit.py"


def _run(tmp_path: Path, accelerator: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "out"), accelerator],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["files"]) == 1 and "window_000-batches_2-3" in report["files"][0], report
    assert report["hooks"] == [], report
    # When fit returns, nothing is left for shutdown to wait for or tear down: no thread it would
    # join and none of ours, no child process (the writer process exited and was reaped).
    assert report["threads"] == [], report
    assert report["children"] == [], report


@pytest.mark.slow
def test_a_compiled_model_through_a_window_exits_0(tmp_path):
    _check(_run(tmp_path, "cpu"))


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_model_on_cuda_through_a_window_exits_0(tmp_path):
    _check(_run(tmp_path, "cuda"))
