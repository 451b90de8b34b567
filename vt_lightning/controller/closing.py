"""Handing a closed window to the writer: its destination, its bookkeeping, its place in the inbox.

A function over the controller rather than a method so that what happens at a window's end (and
what later features add there: retention, job files) grows here, not in ``WindowController``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from vt_lightning.controller import messages, windows
from vt_lightning.controller import run as runs
from vt_lightning.controller.handoff import finishes_at_end

if TYPE_CHECKING:
    from vt_lightning.controller.controller import WindowController
    from vt_lightning.recording.window import ProfilingWindow


def hand_off(ctl: WindowController, window: ProfilingWindow, reason: str | None, partial: bool) -> None:
    """Name the window's files, close its recording into the spool and give the job to the writer."""
    assert ctl.run is not None and ctl.spool is not None and ctl.writer is not None
    target, planned = window.window, ctl.planned
    trigger = planned.trigger if planned is not None else None
    if planned is not None and trigger is None:
        ctl.completed.add(planned.window.index)
    ctl._schedule_from(target.end)
    incomplete = len(window.steps) < len(target.active_steps)
    if incomplete:
        why = reason or "the window was closed early"
        messages.warn_cut_window(ctl.warn, ctl.stage, target, window.steps, why, ctl.windows_recorded)
    destination = windows.destination(
        ctl.options, ctl.run, window, planned, partial or incomplete, reason, ctl.trainer(), ctl.python_filter
    )
    if trigger is not None:
        ctl.triggered_runs.append((destination.run_dir.name, trigger))
        del ctl.triggered_runs[: -messages.TRIGGERED_SHOWN]  # the latest are named at the end
    at_end = finishes_at_end(runs.trains_on_cpu(ctl.run), ctl.writer.process_started, *_fit_remaining(ctl))
    closed = window.close(ctl.spool, destination, hold_dump=at_end)  # held: even VizTracer's dump waits
    if closed is not None:
        ctl.windows_recorded += 1
        ctl.inbox.expect(ctl.writer.hand_off(closed, at_end=at_end))
        ctl._quiet_until(ctl.next_look)  # look at the next batch start for the answer


def _fit_remaining(ctl: WindowController) -> tuple[int | None, float | None]:
    """Batches left to fit's end by its own limits, and the mean batch since train start in seconds
    (validation and the window's own steps included: an overestimate); None where unknown (another
    stage, no limit, no batch run yet)."""
    trainer = ctl.trainer()
    if ctl.stage != "fit" or trainer is None or ctl.train_started is None:
        return None, None
    end = runs.fit_end_batch(trainer)
    started_ns, first = ctl.train_started
    now = runs.global_batch(trainer)
    done = now + 1 - first
    if end is None or done <= 0:
        return None, None
    return end - now - 1, (time.perf_counter_ns() - started_ns) / 1e9 / done
