"""The benchmark suite runs end to end (``benchmarks/run.py --quick --no-write``); no timing checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import REPO

pytestmark = pytest.mark.benchmarks  # nox runs the benchmarks' smoke tests on one Python


def _quick(script: str, *extra: str) -> str:
    """Run a benchmark script's quick mode, writing nothing; returns what it printed."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--no-write", *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_quick_benchmark_completes_and_prints_the_table() -> None:
    out = _quick("run.py", "--rounds", "1")  # one quiet round (of ~30 s) shows every row
    for text in (
        "measure",
        "min",
        "median",
        "max",
        "quiet step before windows: vt / none",
        "window-end stall",
        "active step vt / by-hand",
        "vt, every trigger armed / none",
        "trigger check, one process",
        "DDP agreement, 2 gloo ranks",
        "torch",
        "lightning",
        "viztracer",
        "cores",
    ):
        assert text in out, text


@pytest.mark.slow
def test_summary_cost_benchmark_completes() -> None:
    out = _quick("summary_cost.py")
    for text in ("writer job", "of which summary", "time to trace", "| off |", "| on |", "summary |"):
        assert text in out, text


@pytest.mark.slow
def test_short_run_benchmark_completes() -> None:
    out = _quick("short_run.py")
    for text in (
        "fit added, pl_profiler",
        "window breakdown (vt_window)",
        "window breakdown (vt_ahead)",
        "batches 0-1, step delta (writer boots)",
        "sum of the parts / pl_profiler added",
        "worst quiet step vs none",
        "median quiet step / none's",
        "noise: spread of `none` fit",
    ):
        assert text in out, text


@pytest.mark.slow
def test_writer_start_benchmark_completes() -> None:
    out = _quick("writer_start.py")
    for text in ("CPU ms to its first answer", "without site (-S, the product)", "with site (before)", "saved by -S"):
        assert text in out, text


@pytest.mark.slow
def test_tb_plugin_benchmark_completes() -> None:
    out = _quick("tb_plugin.py")
    for text in ("## The TensorBoard tab", "first load ms", "held MiB after all rows", "| 50 |", "| 200 |"):
        assert text in out, text


@pytest.mark.slow
def test_writer_cost_benchmark_completes_and_every_round_writes_the_same_trace() -> None:
    """Captures the 1e4 and the real-model windows, replays each twice: one md5 per row (the
    writer's output does not depend on the round, nor on a job finished before from the same
    capture), and the end-of-fit wait against save()."""
    out = _quick("writer_cost.py", "--repeats", "2", "--end-waits", "1")
    for text in ("writer µs/event", "save() µs/event", "writer / save()", "by stage", "End-of-fit wait", "| this |"):
        assert text in out, text
    # the wait against the held window's save() timed in the training process: a figure, not a dash
    wait_row = next(line for line in out.splitlines() if line.startswith("| this |")).split("|")
    header = next(line for line in out.splitlines() if "save() in that process" in line).split("|")
    here = wait_row[[cell.strip() for cell in header].index("save() in that process (s)")]
    assert float(here.split()[0]) > 0, wait_row
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith(("| 1e4 ", "| real "))}
    assert set(rows) == {"1e4", "real"}, out
    for name, row in rows.items():
        md5s = row.rstrip(" |").rsplit("|", 1)[1].split()
        assert len(md5s) == 1, (name, row)


@pytest.mark.slow
def test_quiet_batch_benchmark_completes() -> None:
    out = _quick("quiet_batch.py")
    for text in ("an empty training step, no callback", "no window in the run - no callback", "timed directly"):
        assert text in out, text


@pytest.mark.slow
def test_stage_end_wait_benchmark_completes() -> None:
    out = _quick("stage_end_wait.py")
    for text in ("| fit |", "| validate |", "| test |", "| predict |", "| short fit |", "writer process started"):
        assert text in out, text


@pytest.mark.slow
def test_memory_panel_benchmark_completes() -> None:
    """The writer's memory view and the tab's chart in Chromium, big window against the baseline."""
    out = _quick("memory_panel.py")
    for text in ("| writer: memory view | 1,000 events | 10,000 |", "| tab: click to chart drawn |", "ratio"):
        assert text in out, text
