"""A window's summary into every logger of the Trainer, through Lightning's logger API.

Called on the training thread only (Lightning's loggers are not thread-safe): at the first batch
start after the writer returned a window, and at the end of fit. Scalars go through
``logger.log_metrics`` (so TensorBoard, CSV, W&B, MLflow all get them); loggers whose
``experiment`` takes text (TensorBoard's ``SummaryWriter.add_text``) also get the markdown report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PREFIX = "vt_lightning"


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """``vt_lightning/step_ms``, ``vt_lightning/<part>_ms`` per breakdown part, GPU busy %, peak MB."""
    out: dict[str, float] = {}
    step = summary.get("step_ms") or {}
    for key, name in (("mean", "step_ms"), ("p50", "step_ms_p50"), ("max", "step_ms_max")):
        if step.get(key) is not None:
            out[f"{PREFIX}/{name}"] = float(step[key])
    for part, ms in (summary.get("breakdown_ms") or {}).items():
        if ms is not None:
            out[f"{PREFIX}/{part}_ms"] = float(ms)
    gpu = summary.get("gpu") or {}
    if gpu.get("busy_percent") is not None:
        out[f"{PREFIX}/gpu_busy_percent"] = float(gpu["busy_percent"])
    memory = summary.get("memory") or {}
    if memory.get("peak_allocated_mb") is not None:
        out[f"{PREFIX}/peak_allocated_mb"] = float(memory["peak_allocated_mb"])
    if memory.get("peak_reserved_mb") is not None:
        out[f"{PREFIX}/peak_reserved_mb"] = float(memory["peak_reserved_mb"])
    return out


def log_summary(loggers: Iterable[Any], summary: Mapping[str, Any], markdown: str | None = None) -> None:
    """Scalars (and, where the logger takes text, the markdown) at the window's last global step.

    Raises the first logger error after trying every logger, so one broken logger never starves
    the others; the caller turns it into a warning.
    """
    window = summary.get("window") or {}
    step = window.get("log_step")
    step = int(step) if isinstance(step, (int, float)) else None
    scalars = summary_scalars(summary)
    first_error: Exception | None = None
    for logger in loggers:
        try:
            if scalars:
                logger.log_metrics(scalars, step=step)
            if markdown:
                add_text = getattr(_experiment(logger), "add_text", None)
                if callable(add_text):
                    add_text(f"{PREFIX}/window_{window.get('index')}", markdown, global_step=step)
        except Exception as err:
            first_error = first_error or err
    if first_error is not None:
        raise first_error


def _experiment(logger: Any) -> Any:
    """TensorBoard's SummaryWriter, when this logger is TensorBoard's (asking other loggers for
    ``experiment`` may start a remote run, so only TensorBoard loggers are asked)."""
    try:
        from lightning.pytorch.loggers import TensorBoardLogger
    except ImportError:  # pragma: no cover
        return None
    if isinstance(logger, TensorBoardLogger):
        return logger.experiment
    return None
