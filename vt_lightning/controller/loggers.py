"""A window's summary into the Trainer's loggers, on the training thread (they are not thread-safe)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger

from vt_lightning.analysis.schema import Summary

PREFIX = "vt_lightning"


def summary_scalars(summary: Summary) -> dict[str, float]:
    """``vt_lightning/step_ms``, ``vt_lightning/<part>_ms`` per breakdown part, GPU busy %, peak MB."""
    step = summary.get("step_ms")
    values: dict[str, float | None] = {}
    if step is not None:
        values.update(step_ms=step.get("mean"), step_ms_p50=step.get("p50"), step_ms_max=step.get("max"))
    for part, ms in (summary.get("breakdown_ms") or {}).items():
        values[f"{part}_ms"] = ms
    gpu = summary.get("gpu")
    if gpu is not None:
        values["gpu_busy_percent"] = gpu.get("busy_percent")
    memory = summary.get("memory")
    if memory is not None:
        values.update(
            peak_allocated_mb=memory.get("peak_allocated_mb"), peak_reserved_mb=memory.get("peak_reserved_mb")
        )
    for verdict in summary.get("verdicts") or []:  # share of step time per kind (docs/verdicts.md)
        values[f"verdict/{verdict.get('kind')}"] = (verdict.get("evidence") or {}).get("share")
    job = summary.get("job")
    if job is not None:  # rank 0 of a job whose ranks all traced: how long the others waited for the straggler
        straggler = job.get("straggler")
        values["straggler_wait_ms"] = straggler.get("others_wait_ms") if straggler else 0.0
    return {f"{PREFIX}/{name}": float(value) for name, value in values.items() if value is not None}


def log_summary(loggers: Iterable[Any], summary: Summary, markdown: str | None = None) -> None:
    """Scalars (and the markdown) at the window's log step; raises the first error after every logger."""
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
        except Exception as err:  # every logger gets its turn; the first error is re-raised below
            first_error = first_error or err
    if first_error is not None:
        raise first_error


def _experiment(logger: Any) -> Any:
    """TensorBoard's SummaryWriter; other loggers are not asked (their ``experiment`` may start a remote run)."""
    return logger.experiment if isinstance(logger, TensorBoardLogger) else None
