"""Which side recorders (``recording/side.py``) a window gets: one line per kind."""

from __future__ import annotations

import os
import weakref
from typing import Any

from vt_lightning.analysis.schedule import Window
from vt_lightning.analysis.sources import WindowPlan
from vt_lightning.analysis.workers import upcoming_ranges
from vt_lightning.controller.messages import Warn
from vt_lightning.controller.run import Run, batches_started
from vt_lightning.options import Options
from vt_lightning.recording.clock_sync import clock_sync_recorders
from vt_lightning.recording.compile_watch import CompileWatch
from vt_lightning.recording.flight import flight_side
from vt_lightning.recording.gc_watch import GcWatch
from vt_lightning.recording.pytracer import PythonTracer
from vt_lightning.recording.side import SideRecorder
from vt_lightning.recording.workers import WorkerTracing


def side_recorders(
    options: Options, run: Run, python: PythonTracer, trainer: Any, target: Window
) -> list[SideRecorder]:
    """The side recorders of one window, in start order (stopped in reverse)."""
    recorders: list[SideRecorder] = [
        *clock_sync_recorders(run.rank_info, options.writer_timeout),  # ranks' clock offsets (job file)
        *flight_side(target, python.clock_us),
        GcWatch(python.clock_us),  # collector pauses, for the ``gc`` verdict
        CompileWatch(python),  # torch.compile: spans, graph breaks, recompiles
    ]
    workers = _WORKERS.get(trainer)
    if workers is not None:  # DataLoader workers (recording/workers.py)
        recorders.append(workers.recorder(python, target))
    return recorders


# Worker tracing of the fit run in progress, per Trainer (set up at setup, undone at shutdown).
_WORKERS: weakref.WeakKeyDictionary[Any, WorkerTracing] = weakref.WeakKeyDictionary()


def start_run(options: Options, run: Run, spool: Any, trainer: Any, plan: WindowPlan, warn: Warn) -> None:
    """Fit only: wrap the train DataLoaders' workers before Lightning creates their iterator."""
    end_run(trainer)
    if not options.trace_workers or run.stage != "fit" or spool is None:
        return
    owner = weakref.ref(trainer)  # the registry holds the trainer weakly: so must its values

    def upcoming(step: int) -> list[tuple[int, int]]:
        """The scheduled windows workers arm for; none once the run budget closed the plan."""
        if not options.scheduled_windows or plan.closed:
            return []
        left = None if plan.max_windows is None else max(plan.max_windows - plan.begun, 0)
        return upcoming_ranges(plan.schedule, step)[:left]  # counted from the fit's first batch (train start)

    try:
        tracing = WorkerTracing(
            os.fspath(spool),
            run.global_rank,
            options.python,
            upcoming,
            lambda: batches_started(owner()),
            calls=options.worker_calls,
        )
        tracing.install(trainer.fit_loop)
    except Exception as err:  # worker tracing is extra: a failure costs the workers' events, never the run
        warn("workers", f"vt_lightning: DataLoader workers are not traced in this run ({type(err).__name__}: {err}).")
        return
    _WORKERS[trainer] = tracing


def end_run(trainer: Any) -> None:
    tracing = _WORKERS.pop(trainer, None) if trainer is not None else None
    if tracing is not None:
        try:
            tracing.remove()
        except Exception:  # the run is over: nothing of it may fail now
            pass
