"""Handing a closed window to the writer: its destination, its bookkeeping, its place in the inbox.

A function over the controller rather than a method so that what happens at a window's end (and
what later features add there: retention, job files) grows here, not in ``WindowController``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vt_lightning.controller import messages, windows

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
    closed = window.close(ctl.spool, destination)
    if closed is not None:
        ctl.windows_recorded += 1
        ctl.inbox.expect(ctl.writer.hand_off(closed))
        ctl._quiet_until(ctl.next_look)  # look at the next batch start for the answer
