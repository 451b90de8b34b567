"""The console at any length (issue 28): the end-of-run table has as many lines after 2,000 windows
as after 10, says where the full table is, and the full table on disk holds every window."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pytest

from vt_lightning.analysis.history import MAX_TABLE_ROWS, RunHistory, row_of
from vt_lightning.controller.inbox import Outcomes
from vt_lightning.export import report
from vt_lightning.export.job import WindowResult


def summary(index: int, step_ms: float) -> dict[str, Any]:
    return {
        "window": {"index": index, "global_rank": 0, "worker": "host_0"},
        "steps": {"recorded": [10 * index + 5]},
        "step_ms": {"mean": step_ms},
        "breakdown_ms": {"data_wait": 0.1, "forward": step_ms / 2, "backward": step_ms / 3, "optimizer": 0.2},
        "memory": {"peak_allocated_mb": 12.0},
        "top_python": {"by_inclusive": [{"origin": "user", "function": "Net.step", "inclusive_ms": 1.0}]},
    }


def result(tmp_path: Path, index: int, step_ms: float) -> WindowResult:
    run_dir = tmp_path / f"window_{index:03d}-batches_{10 * index + 5}-{10 * index + 5}"
    return WindowResult(
        trace_path=run_dir / "host_0.0000000005.pt.trace.json.gz",
        trace_bytes=1,
        json_bytes=1,
        python_events=1,
        torch_events=1,
        overflow=False,
        summary=summary(index, step_ms),  # type: ignore[arg-type]
    )


def table_lines(history: RunHistory, monkeypatch: pytest.MonkeyPatch, rich: bool) -> list[str]:
    monkeypatch.setattr(report, "rich_available", lambda: rich)
    out = io.StringIO()
    report.print_history_table(history, file=out)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("rich", [True, False], ids=["rich", "plain"])
def test_the_end_of_run_table_has_the_same_lines_for_10_and_2000_windows(monkeypatch, rich):
    rng = random.Random(28)
    sizes = {}
    for windows in (10, 2000):
        history = RunHistory()
        for index in range(windows):
            history.add(row_of(summary(index, rng.uniform(1.0, 9.0))))  # type: ignore[arg-type]
        lines = table_lines(history, monkeypatch, rich)
        sizes[windows] = len(lines)
        assert len(history.table()) <= MAX_TABLE_ROWS
        assert any("median" in line for line in lines) and any("p90" in line for line in lines), lines
        assert any("more" in line for line in lines), lines  # the windows not shown are counted
    assert sizes[10] == sizes[2000], sizes


def test_the_slowest_window_is_shown_and_marked_however_long_the_run(monkeypatch):
    history = RunHistory()
    for index in range(2000):
        history.add(row_of(summary(index, 500.0 if index == 1234 else 2.0)))  # type: ignore[arg-type]
    lines = table_lines(history, monkeypatch, rich=False)
    (slow,) = [line for line in lines if line.startswith("1234")]
    assert "*" in slow and "500.0" in slow
    assert any("slowest" in line for line in lines)


def test_the_median_and_p90_rows_cover_every_window(monkeypatch):
    history = RunHistory()
    for index in range(1000):
        history.add(row_of(summary(index, float(index + 1))))  # type: ignore[arg-type]
    median, p90 = history.aggregate(0.5).step_ms, history.aggregate(0.9).step_ms
    assert median is not None and abs(median - 500) / 500 < 0.02, median
    assert p90 is not None and abs(p90 - 900) / 900 < 0.02, p90


def test_end_of_run_says_where_the_full_table_is_and_it_holds_every_window(tmp_path, monkeypatch, capsys, caplog):
    from vt_lightning.controller import messages

    monkeypatch.setattr(report, "rich_available", lambda: False)
    spool = tmp_path / "spool"
    spool.mkdir()
    printed = {}
    for windows in (10, 500):
        root = tmp_path / f"logs{windows}"  # one run each: a second run into one root appends its section
        root.mkdir()
        outcomes = Outcomes(lambda key, message: None, tracer_entries=1000)
        outcomes.start(spool / str(windows), lambda *args: None, keep_windows=None)
        (spool / str(windows)).mkdir()
        outcomes.receive([result(tmp_path, i, 1.0 + (i % 7)) for i in range(windows)])
        caplog.clear()
        with caplog.at_level("INFO"):
            messages.end_of_run(root, outcomes, [], "fit")
        printed[windows] = capsys.readouterr().out.splitlines()
        said = caplog.text
        full = root / "vt_lightning.windows.txt"
        assert str(full) in said, said
        rows = full.read_text().splitlines()
        assert len(rows) == 2 + windows + 2  # title, header, a row per window, median and p90
        assert f"all {windows} windows" in rows[0]
    assert len(printed[10]) == len(printed[500]), printed


def test_end_of_run_prints_normalised_paths(tmp_path, monkeypatch, caplog):
    """`../.venv/bin/python train.py` with a log dir given as `../logs`: the printed commands name
    plain absolute paths, with no `..` in them, that work when pasted from any directory."""
    import sys

    from vt_lightning.controller import messages

    monkeypatch.setattr(report, "rich_available", lambda: False)
    monkeypatch.setattr(sys, "executable", "/opt/project/examples/../.venv/bin/python")
    (tmp_path / "logs").mkdir()
    (tmp_path / "examples").mkdir()
    monkeypatch.chdir(tmp_path / "examples")
    spool = tmp_path / "spool"
    spool.mkdir()
    outcomes = Outcomes(lambda key, message: None, tracer_entries=1000)
    outcomes.start(spool, lambda *args: None, keep_windows=None)
    outcomes.receive([result(tmp_path, 0, 1.0)])
    with caplog.at_level("INFO"):
        messages.end_of_run(Path("../logs"), outcomes, [], "fit")
    said = caplog.text
    assert f"summary: /opt/project/.venv/bin/python -m vt_lightning summary {tmp_path / 'logs'}\n" in said, said
    assert "/../" not in said and "/./" not in said, said
