"""Forks inside a window and Ctrl-C never hang a process or lose a recorded window (issue 22: 1, 2).

Each scenario runs ``tests/scripts/fault/fork_and_interrupt.py`` in a subprocess of its own session, so a
hang is a failed test (bounded wall time) and Ctrl-C can go to a whole process group as a terminal
sends it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import load_trace, trace_files
from support.paths import REPO, SCRIPTS

pytestmark = pytest.mark.serial  # forks in windows and Ctrl-C to a process group, in bounded time

SCRIPT = SCRIPTS / "fault" / "fork_and_interrupt.py"


def run(root: Path, scenario: str, *extra: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(root), scenario, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        start_new_session=True,  # its own process group: the Ctrl-C scenario signals the whole group
    )
    return proc, time.monotonic() - start


def window_steps(root: Path) -> list[list[int]]:
    return sorted(load_trace(path)["vt_lightning"]["steps"] for path in trace_files(root))


@pytest.mark.parametrize("scenario", ["os_fork", "mp_fork", "workers"])
def test_a_process_forked_inside_a_window_leaves_every_window_to_its_parent(tmp_path, scenario):
    # os_fork: the child leaves with sys.exit(0), which runs Lightning's on_exception and teardown in
    # the child; before, it waited on the parent's writer (or deleted the parent's spool), and once
    # torch's profiler had run in the parent, it hung in kineto's exit handler for good.
    proc, wall = run(tmp_path, scenario)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["train_batches"] == list(range(12))
    assert window_steps(tmp_path) == [[2, 3], [6, 7], [10, 11]], output[-3000:]
    if scenario != "workers":
        assert [c["step"] for c in report["children"]] == [2, 6, 10]
        for child in report["children"]:
            assert child["exit"] == 0 and child["ran"], child
            assert child["seconds"] < 30, child  # a child never waits on the parent's writer
    assert "Traceback" not in output, output[-4000:]
    assert wall < 120


def test_ctrl_c_keeps_the_window_recorded_before_it_and_the_interrupts_exit_status(tmp_path):
    baseline, _ = run(tmp_path / "without", "sigint", "--no-callback")
    assert "Detected KeyboardInterrupt" in baseline.stdout + baseline.stderr
    proc, wall = run(tmp_path / "with", "sigint")
    output = proc.stdout + proc.stderr
    assert proc.returncode == baseline.returncode != 0, output[-4000:]  # Lightning's own exit status
    report = json.loads((tmp_path / "with" / "interrupt.json").read_text())
    assert report == {"writer_own_session": True, "writer_survived_sigint": True}
    # The window recorded before Ctrl-C (batches 2-3) is written whole; the one in warmup is not.
    assert window_steps(tmp_path / "with") == [[2, 3]], output[-4000:]
    (trace,) = trace_files(tmp_path / "with")
    assert any(e.get("name") == "ProfilerStep#3" for e in load_trace(trace)["traceEvents"])
    assert wall < 90
