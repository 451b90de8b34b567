"""Window sources: does a window start at this batch, and why? ``WindowPlan`` merges the schedule's
windows with triggered ones, applies the limits and numbers them, deterministically: every DDP rank
fed the same requests plans the same windows (one that fails to open still counts everywhere)."""

from __future__ import annotations

from dataclasses import dataclass

from vt_lightning.analysis.schedule import Schedule, Window
from vt_lightning.analysis.triggers import ON_DEMAND, Firing


@dataclass(frozen=True)
class Planned:
    """A window the plan holds: its batches, its run number and, for a triggered one, why."""

    window: Window  # for a scheduled window, ``window.index`` is the schedule's cycle index
    number: int  # the ``window_NNN`` of its run directory and of its metadata
    trigger: Firing | None = None

    @property
    def reason(self) -> str | None:
        return self.trigger.reason if self.trigger is not None else None


class WindowPlan:
    """The schedule's windows plus triggered ones, numbered so that without triggers the number is
    the cycle index, and numbers grow with time."""

    def __init__(
        self, schedule: Schedule, scheduled: bool = True, max_windows: int | None = None, cooldown: int = 0
    ) -> None:
        self.schedule = schedule
        self.scheduled = scheduled
        self.max_windows = max_windows
        self.cooldown = cooldown
        self.begun = 0  # windows that reached their first batch (opened or skipped there)
        self.triggered = 0  # triggered windows accepted
        self._last_number = -1
        self._pending: Planned | None = None  # an accepted triggered window not yet begun
        self._busy_until = -1  # exclusive end of the last begun window
        self._cooldown_until = -1  # no measured trigger before this batch
        self._cancelled: set[int] = set()  # schedule cycles displaced by a triggered window
        self.closed = False  # the run budget is spent: no window begins any more

    def next_window(self, step: int) -> Planned | None:
        """The first planned window that has not ended by batch ``step``."""
        if self.closed or (self.max_windows is not None and self.begun >= self.max_windows):
            return None
        pending = self._pending
        scheduled = self._next_scheduled(step)
        if pending is not None and (scheduled is None or pending.window.warmup_start <= scheduled.warmup_start):
            return pending
        if scheduled is None:
            return None
        return Planned(scheduled, scheduled.index + self.triggered)

    def limited_after(self, step: int) -> int | None:
        """The warmup batch of the first scheduled window ``max_windows`` stops (None: none stopped)."""
        if self.max_windows is None or self.begun < self.max_windows:
            return None
        nxt = self._next_scheduled(step)
        return nxt.warmup_start if nxt is not None else None

    def busy(self, step: int) -> bool:
        """True while batch ``step`` belongs to a begun or accepted window."""
        return step < self._busy_until or self._pending is not None

    @property
    def busy_until(self) -> int:
        return self._busy_until

    def next_boundary(self, step: int) -> float:
        """The first batch >= ``step`` where a planned window starts (inf: none)."""
        nxt = self.next_window(step)
        return nxt.window.warmup_start if nxt is not None else float("inf")

    def close(self) -> None:
        """No window begins from now on (the run budget is spent); a pending triggered one is dropped."""
        self.closed = True
        self._pending = None

    def begin(self, planned: Planned) -> None:
        """The window's first batch came: it counts now, opened or not."""
        self.begun += 1
        self._last_number = max(self._last_number, planned.number)
        self._busy_until = max(self._busy_until, planned.window.end)
        if planned is self._pending:
            self._pending = None

    def request(self, firing: Firing, start: int, warmup: int, active: int) -> tuple[Planned | None, str]:
        """A window for a trigger at batch ``start``, or None and why ("budget", "max_windows", "busy",
        "cooldown": on-demand triggers skip the cooldown)."""
        if self.closed:
            return None, "budget"
        if self.max_windows is not None and self.begun + (self._pending is not None) >= self.max_windows:
            return None, "max_windows"
        if self.busy(start):
            return None, "busy"
        if firing.reason not in ON_DEMAND and start < self._cooldown_until:
            return None, "cooldown"
        window = Window(self.triggered, start, start + warmup, start + warmup + active)
        self._cancel_overlapping(window)
        self.triggered += 1
        planned = Planned(window, self._last_number + 1, firing)
        self._pending = planned
        self._cooldown_until = window.end + self.cooldown
        return planned, ""

    def _cancel_overlapping(self, window: Window) -> None:
        """Scheduled windows that would overlap a triggered one give way to it."""
        if not self.scheduled:
            return
        nxt = self._next_scheduled(window.warmup_start)
        while nxt is not None and nxt.warmup_start < window.end:
            self._cancelled.add(nxt.index)
            nxt = self._next_scheduled(nxt.end)

    def _next_scheduled(self, step: int) -> Window | None:
        if not self.scheduled:
            return None
        nxt = self.schedule.next_window(step)
        while nxt is not None and nxt.index in self._cancelled:
            nxt = self.schedule.next_window(nxt.end)
        return nxt
