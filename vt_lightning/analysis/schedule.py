"""Which training batch belongs to which profiling window: ``torch.profiler.schedule``'s semantics
without torch. One step is one training batch, counted across epochs from 0."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    """What the profilers do during one batch (torch's ``ProfilerAction`` without the save split)."""

    NONE = "none"  # no profiler and no hook installed
    WARMUP = "warmup"  # torch.profiler prepared, its events discarded; no Python tracer
    ACTIVE = "active"  # both tracers record


@dataclass(frozen=True)
class Window:
    """One scheduled window: global batch indices ``[warmup_start, end)``; active from ``active_start``."""

    index: int
    warmup_start: int
    active_start: int
    end: int  # exclusive

    @property
    def active_steps(self) -> range:
        return range(self.active_start, self.end)

    @property
    def last_step(self) -> int:
        return self.end - 1


@dataclass(frozen=True)
class Schedule:
    """``skip_first`` batches, then ``repeat`` cycles (0: until training ends) of ``wait`` +
    ``warmup`` + ``active`` batches.

    Example:
        >>> s = Schedule(skip_first=0, wait=1, warmup=1, active=2, repeat=1)
        >>> [s.phase(i).value for i in range(5)]
        ['none', 'warmup', 'active', 'active', 'none']
    """

    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}")
        if not isinstance(self.active, int) or isinstance(self.active, bool) or self.active < 1:
            raise ValueError(f"`active` must be an integer >= 1, got {self.active!r}")

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def window_index(self, step: int) -> int | None:
        """Index of the cycle ``step`` falls in, or None before ``skip_first`` / after the last repeat."""
        if step < self.skip_first:
            return None
        index = (step - self.skip_first) // self.cycle
        if self.repeat and index >= self.repeat:
            return None
        return index

    def window(self, index: int) -> Window:
        if index < 0 or (self.repeat and index >= self.repeat):
            raise ValueError(f"window index {index} outside schedule with repeat={self.repeat}")
        cycle_start = self.skip_first + index * self.cycle
        warmup_start = cycle_start + self.wait
        active_start = warmup_start + self.warmup
        return Window(index, warmup_start, active_start, active_start + self.active)

    def phase(self, step: int) -> Phase:
        """Phase of global batch ``step``; O(1), allocation-free."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        index = self.window_index(step)
        if index is None:
            return Phase.NONE
        offset = (step - self.skip_first) - index * self.cycle
        if offset < self.wait:
            return Phase.NONE
        if offset < self.wait + self.warmup:
            return Phase.WARMUP
        return Phase.ACTIVE

    def windows_until(self, num_steps: int) -> list[Window]:
        """Windows that start before ``num_steps`` batches have run (for planning and tests)."""
        out: list[Window] = []
        index = 0
        while not self.repeat or index < self.repeat:
            w = self.window(index)
            if w.warmup_start >= num_steps:
                break
            out.append(w)
            index += 1
        return out

    def next_window(self, step: int) -> Window | None:
        """The first window that has not ended by batch ``step`` (None when the schedule is over)."""
        if step < self.skip_first:
            return self.window(0)
        index = (step - self.skip_first) // self.cycle
        if self.repeat and index >= self.repeat:
            return None
        window = self.window(index)
        if step >= window.end:
            index += 1
            if self.repeat and index >= self.repeat:
                return None
            window = self.window(index)
        return window
