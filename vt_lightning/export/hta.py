"""Holistic Trace Analysis on a vt_lightning window: which traces to hand it, and whether its GPU
breakdowns apply.

HTA's temporal, kernel and idle-time breakdowns index the window's first GPU kernel: on a window
that recorded none (a CPU run) they raise a bare ``IndexError``. ``gpu_breakdowns_missing`` says so
in one line first, from the window's own summaries (only GPU windows carry a ``gpu`` section)."""

from __future__ import annotations

import os
from pathlib import Path

from vt_lightning.export.reading import SummaryNotFound, UnreadableFile
from vt_lightning.export.report import hta_trace_files, load_summary, summary_names

__all__ = ["gpu_breakdowns_missing", "hta_trace_files"]


def gpu_breakdowns_missing(window_dir: str | os.PathLike[str]) -> str | None:
    """None when the window recorded GPU kernels; otherwise the one line that explains why HTA's
    GPU breakdowns do not apply to it (no trace, no summary to tell, or a CPU-only window)."""
    window = Path(window_dir)
    try:
        traces = hta_trace_files(window)
    except SummaryNotFound as err:
        return str(err)
    for trace in traces.values():
        summary_path = window / summary_names(Path(trace).name)[0]
        try:
            summary = load_summary(summary_path)
        except (SummaryNotFound, UnreadableFile, OSError):
            return f"{window}: no summary beside {Path(trace).name} to tell whether GPU kernels were recorded"
        if summary.get("gpu"):
            return None
    return (
        f"{window}: no GPU kernels were recorded (a CPU run): HTA's temporal, kernel and idle-time "
        "breakdowns need CUDA kernels; its trace parsing and CPU-side views still apply"
    )
