"""The Lightning view's tests' synthetic trace (one training batch's stage and module ranges, torch
ops, a user range, a Python call) and the rewrite applied as the writer applies it."""

from __future__ import annotations

from typing import Any

from vt_lightning.analysis.lightning_view import apply_lightning_view
from vt_lightning.analysis.trace import WindowTrace


def X(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def synthetic_trace() -> dict[str, Any]:
    ua = "user_annotation"
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": 1,
        "vt_lightning": {"window": 0},
        "traceEvents": [
            X("ProfilerStep#1", 0, 100, ua),
            X("[pl][profile]run_training_batch", 1, 98, ua),
            X("[pl][profile][LightningModule]M.training_step", 2, 50, ua),
            X("[pl][module]torch.nn.modules.container.Sequential: net", 3, 40, ua),
            X("[pl][module]torch.nn.modules.linear.Linear: net.0", 4, 10, ua),
            X("aten::linear", 5, 8),
            X("[pl][module]torch.nn.modules.activation.ReLU: net.1", 20, 5, ua),
            X("aten::relu", 21, 3),
            X("[pl][module]torch.nn.modules.linear.Linear: net.0", 400, 10, "gpu_user_annotation"),
            X("some_user_range", 60, 2, ua),
            X("python_call", 61, 1, "FEE"),
        ],
    }


def view(trace: dict[str, Any]) -> dict[str, int]:
    """``apply_lightning_view`` on a trace dict, as the writer applies it to the typed trace: the
    dict then holds the trace as its file would."""
    typed = WindowTrace.of(trace)
    summary = apply_lightning_view(typed)
    trace.clear()
    trace.update(typed.as_dict())
    return summary
