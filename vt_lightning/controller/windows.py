"""Opening a window (or declining to) and naming what a closed one becomes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vt_lightning.analysis.filters import PythonFilter
from vt_lightning.analysis.schedule import Window
from vt_lightning.analysis.sources import Planned
from vt_lightning.constants import COMMAND_FUNCTIONS_KEY, VERSION
from vt_lightning.controller import messages
from vt_lightning.controller.handoff import BackgroundWriter
from vt_lightning.controller.messages import Warn
from vt_lightning.controller.run import Run, log_step
from vt_lightning.controller.side_recorders import side_recorders
from vt_lightning.export.job import Destination
from vt_lightning.export.layout import (
    host_name,
    memory_file_name,
    new_job_id,
    oom_file_name,
    span_name,
    trace_file_name,
    window_dir_name,
    worker_name,
)
from vt_lightning.options import Options
from vt_lightning.recording.lightning_hooks import LightningViewHooks
from vt_lightning.recording.memory import CudaMemoryRecorder, dump_oom_snapshot
from vt_lightning.recording.pytracer import PythonTracer, foreign_profiler
from vt_lightning.recording.torchtracer import TorchTracer, torch_profiler_active
from vt_lightning.recording.unsafe_names import skipped_message, unsafe_module_file
from vt_lightning.recording.window import ProfilingWindow


def open_window(
    target: Window,
    options: Options,
    run: Run,
    python: PythonTracer,
    writer: BackgroundWriter,
    trainer: Any,
    warn: Warn,
) -> ProfilingWindow | None:
    """A new window, nothing installed yet; None when another profiler records or the writer has no room."""
    conflict = foreign_profiler() or ("a torch profiler that is already recording" if torch_profiler_active() else None)
    if conflict:
        warn(
            "conflict:" + conflict,
            f"vt_lightning: {conflict} is active, so window {target.index} (and any other window "
            "meeting it) is skipped; the other tool is left untouched.",
        )
        return None
    unsafe = unsafe_module_file()
    if unsafe is not None:
        warn("unsafe-file", skipped_message(unsafe, target.index))  # one key with UnsafeImport's
        return None
    waited, room = writer.wait_for_room()
    if not room:
        warn("writer-stuck", messages.writer_stuck(options.writer_timeout, run.output, target.index))
        return None
    if waited > 0.05:
        warn(
            "backlog",
            f"vt_lightning: windows come faster than the writer finishes them; window {target.index} "
            f"waited {waited:.2f} s for earlier windows to be written. Raise `wait` to space windows out.",
        )
    step_hooks = LightningViewHooks(trainer, trainer.lightning_module) if options.lightning_view else None
    recorder = CudaMemoryRecorder(options.memory_max_entries) if options.memory_snapshot and run.cuda else None
    return ProfilingWindow(
        target,
        python,
        TorchTracer(options.torch, cuda_available=run.cuda),
        memory_recorder=recorder,
        step_hooks=step_hooks,
        on_problem=warn,
        side=side_recorders(options, run, python, trainer, target),
    )


def paths(
    options: Options, run: Run, window: ProfilingWindow, planned: Planned | None
) -> tuple[Path, str, str, str | None]:
    """(local run directory, worker, span, memory snapshot name or None) of a window."""
    target = window.window
    first = window.steps[0] if window.steps else target.active_start
    last = window.steps[-1] if window.steps else target.last_step  # a cut window names what it holds
    worker = worker_name(run.global_rank, host_name())
    span = span_name(target.active_start)
    snapshots = options.memory_snapshot and (run.cuda or options.torch.profile_memory)
    memory_name = memory_file_name(worker, span) if snapshots else None
    reason = planned.reason if planned is not None else None
    run_dir = run.root / window_dir_name(target.index, first, last, stage=run.stage, reason=reason)
    return run_dir, worker, span, memory_name


def destination(
    options: Options,
    run: Run,
    window: ProfilingWindow,
    planned: Planned | None,
    partial: bool,
    reason: str | None,
    trainer: Any,
    python_filter: PythonFilter | None,
) -> Destination:
    """Where a closed window goes (``publish_to``: its remote copy), with its trace's metadata."""
    target = window.window
    trigger = planned.trigger if planned is not None else None
    run_dir, worker, span, memory_name = paths(options, run, window, planned)
    settings = options.settings()
    metadata = {
        "version": VERSION,
        "stage": run.stage,
        "window": target.index,
        "steps": list(window.steps),
        # First and last batch (inclusive), not lists: metadata scales with what was recorded.
        "scheduled_steps": _bounds(target.active_start, target.end),
        "warmup_steps": _bounds(target.warmup_start, target.active_start),
        "schedule": settings["schedule"],
        "partial": partial,
        **({"partial_reason": reason} if partial and reason else {}),
        "tracer": settings["tracer"],
        "torch": settings["torch"],
        "lightning_view": options.lightning_view,
        "validation": window.range_log("validation"),
        "user_hooks": run.user_hooks,
        COMMAND_FUNCTIONS_KEY: run.command,
        "trigger": trigger.to_metadata() if trigger is not None else None,
        "worker": worker,
        "span": span,
        "log_step": log_step(trainer) if trainer is not None else None,
        **run.rank_info,
    }
    return Destination(
        run_dir=run_dir,
        trace_name=trace_file_name(worker, span),
        metadata=metadata,
        gzip_level=options.compression_level,
        memory_name=memory_name,
        python_filter=python_filter,
        summary=options.summary,
        job_id=new_job_id(),  # once per window: the writer's retries recognize their own trace
        publish_to=run.remote / run_dir.name if run.remote is not None else None,
    )


def _bounds(start: int, end: int) -> list[int]:
    """``[first, last]`` of the batches ``[start, end)``; ``[]`` when there are none."""
    return [start, end - 1] if end > start else []


def dump_oom(options: Options, run: Run, window: ProfilingWindow, planned: Planned | None, warn: Warn) -> None:
    """On a CUDA out-of-memory error inside a window, keep the allocator's state of that moment."""
    if window.memory_recorder is None or not window.active:
        return
    run_dir, _, _, memory_name = paths(options, run, window, planned)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_oom_snapshot(run_dir / oom_file_name(memory_name or "memory_snapshot.pickle"), window.memory_recorder)
    except Exception as err:  # the OOM snapshot is extra: its failure is said, the window's close goes on
        warn("oom", f"vt_lightning: could not write the out-of-memory snapshot ({err})")
