"""Handing a closed window to the writer: its destination, its bookkeeping, its place in the inbox.

Functions over the controller's state rather than methods, so that what happens at a window's end
(and what later features add there: retention, job files) grows here, not in ``WindowController``.
They read and write only the public state ``ClosingState`` names; the controller does its own
scheduling around them (``WindowController._hand_off``), so this module never imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from vt_lightning.analysis.filters import PythonFilter
from vt_lightning.analysis.history import WindowNumbers
from vt_lightning.analysis.sources import Planned
from vt_lightning.constants import UNTRACED_WAIT_KEY
from vt_lightning.controller import messages, windows
from vt_lightning.controller import run as runs
from vt_lightning.controller.data_wait import UntracedWaits
from vt_lightning.controller.handoff import BackgroundWriter, finishes_at_end
from vt_lightning.controller.inbox import Inbox
from vt_lightning.controller.warn import WarnOnce
from vt_lightning.options import Options
from vt_lightning.recording.spool import Spool
from vt_lightning.recording.window import ProfilingWindow


class ClosingState(Protocol):
    """What a window's end reads and updates of the controller (``WindowController`` has it)."""

    options: Options
    stage: str | None
    run: runs.Run | None
    spool: Spool | None
    writer: BackgroundWriter | None
    planned: Planned | None
    completed: WindowNumbers
    warn: WarnOnce
    inbox: Inbox
    python_filter: PythonFilter | None
    trainer: Callable[[], Any]
    triggered_runs: list[tuple[str, Any]]
    windows_recorded: int
    train_started: tuple[int, int] | None
    untraced: UntracedWaits


def mark_written(ctl: ClosingState) -> None:
    """A scheduled window's cycle is done (checkpointed: never recorded twice), before the
    controller schedules past it."""
    planned = ctl.planned
    if planned is not None and planned.trigger is None:
        ctl.completed.add(planned.window.index)


def hand_off(ctl: ClosingState, window: ProfilingWindow, reason: str | None, partial: bool) -> bool:
    """Name the window's files, close its recording into the spool and give the job to the writer;
    True when a job was handed off (an answer is owed)."""
    assert ctl.run is not None and ctl.spool is not None and ctl.writer is not None
    target, planned = window.window, ctl.planned
    trigger = planned.trigger if planned is not None else None
    incomplete = len(window.steps) < len(target.active_steps)
    if incomplete:
        why = reason or "the window was closed early"
        messages.warn_cut_window(ctl.warn, ctl.stage, target, window.steps, why, ctl.windows_recorded)
    destination = windows.destination(
        ctl.options, ctl.run, window, planned, partial or incomplete, reason, ctl.trainer(), ctl.python_filter
    )
    destination.metadata[UNTRACED_WAIT_KEY] = ctl.untraced.reading()  # input_bound reads it
    if trigger is not None:
        ctl.triggered_runs.append((destination.run_dir.name, trigger))
        del ctl.triggered_runs[: -messages.TRIGGERED_SHOWN]  # the latest are named at the end
    at_end = finishes_at_end(runs.trains_on_cpu(ctl.run), ctl.writer.process_started, *_fit_remaining(ctl))
    closed = window.close(ctl.spool, destination, hold_dump=at_end)  # held: even VizTracer's dump waits
    if closed is None:
        return False
    ctl.windows_recorded += 1
    ctl.inbox.expect(ctl.writer.hand_off(closed, at_end=at_end))
    return True


def _fit_remaining(ctl: ClosingState) -> tuple[int | None, float | None]:
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
