"""Triggers: pure decisions, from cheap per-step facts, that a window should start now."""

from __future__ import annotations

import re
import signal
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from vt_lightning.constants import TRIGGER_FILE_NAME as TRIGGER_FILE_NAME  # where the trigger rules live

SLOW_STEP = "slow_step"
MEMORY_GROWTH = "memory_growth"
TRIGGER_FILE = "trigger_file"
SIGNAL = "signal"
# Also the priority when several reasons fire at the same check: what the user asked for first.
REASONS = (TRIGGER_FILE, SIGNAL, MEMORY_GROWTH, SLOW_STEP)
ON_DEMAND = frozenset({TRIGGER_FILE, SIGNAL})

# ``SlowStep.last`` after ``skip_next()``: the next interval comes out > 2**61 ns, "not a step".
_SKIP = -(1 << 62)
_UNARMED = 1 << 61


@dataclass(frozen=True)
class Firing:
    """Why a window should open: what fired, at which batch, the measured value and its baseline."""

    reason: str
    batch: int
    value: float | None = None
    baseline: float | None = None
    unit: str | None = None  # "s" (slow step) or "bytes" (memory growth)
    rank: int | None = None  # the global rank that saw it (DDP)
    detail: str | None = None  # e.g. the signal's name or the trigger file's path

    def to_metadata(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key != "detail" or value}

    def describe(self) -> str:
        """One line for the end-of-fit message."""
        if self.reason == SLOW_STEP and self.value is not None and self.baseline:
            return (
                f"slow step: batch {self.batch} took {self.value:.3g} s, "
                f"{self.value / self.baseline:.1f}x the {self.baseline:.3g} s median"
            )
        if self.reason == MEMORY_GROWTH and self.value is not None and self.baseline:
            return (
                f"memory growth: {self.value / 2**20:.1f} MiB at batch {self.batch}, "
                f"+{100 * (self.value / self.baseline - 1):.0f}% over {self.baseline / 2**20:.1f} MiB"
            )
        what = "trigger file" if self.reason == TRIGGER_FILE else f"signal {self.detail or ''}".strip()
        return f"{what} seen at batch {self.batch}"


@dataclass(frozen=True)
class TriggerConfig:
    """The trigger options of ``VizTraceCallback``, checked by ``options.make_options``."""

    slow_step_factor: float | None = None
    slow_step_baseline: int = 50
    memory_growth: float | None = None
    memory_growth_steps: int = 100
    trigger_file: bool = False
    trigger_signal: str | None = None
    trigger_cooldown: int = 100
    trigger_interval: float = 0.5
    max_windows: int | None = None

    @property
    def armed(self) -> bool:
        return (
            self.slow_step_factor is not None
            or self.memory_growth is not None
            or self.trigger_file
            or self.trigger_signal is not None
        )


def _free_signals() -> dict[int, str]:
    """Signals with no standard meaning (SIGUSR1, SIGUSR2, real-time): the only ones a trigger takes."""
    free = {int(getattr(signal, n)): n for n in ("SIGUSR1", "SIGUSR2") if hasattr(signal, n)}
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None:
        for n in range(int(low), int(high) + 1):
            free[n] = "SIGRTMIN" if n == low else "SIGRTMAX" if n == high else f"SIGRTMIN+{n - int(low)}"
    return free


FREE_SIGNALS = _free_signals()
_REAL_TIME = re.compile(r"SIGRT(MIN|MAX)([+-]\d{1,3})?")
ALLOWED_SIGNALS = (
    "SIGUSR1, SIGUSR2 or a real-time signal (SIGRTMIN..SIGRTMAX, e.g. 'SIGRTMIN+3')"
    if any(n.startswith("SIGRT") for n in FREE_SIGNALS.values())
    else "SIGUSR1 or SIGUSR2"
    if FREE_SIGNALS
    else "a signal this platform does not have: use trigger_file"
)


def parse_trigger_signal(value: Any) -> tuple[int, str]:
    """A signal name or number -> (number, canonical name); ValueError naming ``trigger_signal``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, str):
        match = _REAL_TIME.fullmatch(value)
        if match is not None and hasattr(signal, "SIGRTMIN"):
            base = int(signal.SIGRTMIN if match.group(1) == "MIN" else signal.SIGRTMAX)
            number = base + int(match.group(2) or 0)
        elif value.startswith("SIG") and isinstance(getattr(signal.Signals, value, None), signal.Signals):
            number = int(getattr(signal.Signals, value))
    if number is not None and number in FREE_SIGNALS:
        return number, FREE_SIGNALS[number]
    meaning = _standard_meaning(number)
    if meaning is not None:
        raise ValueError(
            f"`trigger_signal`: {meaning} that a trigger would take over; use {ALLOWED_SIGNALS}, got {value!r}"
        )
    raise ValueError(f"`trigger_signal` must be {ALLOWED_SIGNALS}, got {value!r}")


def _standard_meaning(number: int | None) -> str | None:
    """``"SIGCHLD (Child exited) has a standard meaning"`` for a known signal, else None."""
    if number is None:
        return None
    try:
        member = signal.Signals(number)
    except ValueError:
        return None
    described = signal.strsignal(member)
    return f"{member.name}{f' ({described})' if described else ''} has a standard meaning"


class SlowStep:
    """Fires when a step takes ``factor`` x the median of the last ``baseline_steps``; unarmed until the
    baseline is full, and slow steps stay in it (a run that slows for good stops firing)."""

    def __init__(self, factor: float, baseline_steps: int, clock: Callable[[], int]) -> None:
        self.factor = float(factor)
        self.clock = clock
        self.durations: deque[int] = deque(maxlen=baseline_steps)
        self.limit = _UNARMED  # ns; a step longer than this fires
        self.baseline_ns: float | None = None
        self.last = _SKIP
        self.fired: tuple[int, float] | None = None  # (duration ns, baseline ns) of the last slow step

    @property
    def armed(self) -> bool:
        return self.limit < _UNARMED

    def steady(self) -> bool:
        """Per batch start: True unless the step that just ended was slow (then ``fired`` says how)."""
        now = self.clock()
        duration = now - self.last
        self.last = now
        if duration <= self.limit:
            self.durations.append(duration)
            return True
        return self._outlier(duration)

    def _outlier(self, duration: int) -> bool:
        if duration > _UNARMED:  # the first interval after skip_next(): not a step
            return True
        self.durations.append(duration)
        self.fired = (duration, self.baseline_ns or 0.0)
        return False

    def skip_next(self) -> None:
        """The interval that ends at the next batch start is not a training step: ignore it."""
        self.last = _SKIP

    def refresh(self) -> None:
        """At a coarse check: recompute the median, and arm once the baseline is full."""
        if len(self.durations) < (self.durations.maxlen or 0):
            return
        self.baseline_ns = statistics.median(self.durations)
        self.limit = int(self.factor * self.baseline_ns)

    def take(self, batch: int) -> Firing | None:
        """The firing for the slow step that ended before batch ``batch`` (once)."""
        fired, self.fired = self.fired, None
        if fired is None:
            return None
        duration, baseline = fired
        return Firing(SLOW_STEP, batch - 1, duration / 1e9, baseline / 1e9, "s")


class MemoryGrowth:
    """Fires when memory grew by ``fraction`` over at least ``steps`` batches; restarts after a firing."""

    def __init__(self, fraction: float, steps: int) -> None:
        self.fraction = float(fraction)
        self.steps = steps
        self.samples: deque[tuple[int, int]] = deque()
        self.compared = False  # armed: a sample was compared with one ``steps`` batches older

    def observe(self, batch: int, value: int) -> Firing | None:
        if batch < self.steps:
            return None
        samples = self.samples
        samples.append((batch, value))
        horizon = batch - self.steps
        while len(samples) >= 2 and samples[1][0] <= horizon:
            samples.popleft()
        reference_batch, reference = samples[0]
        self.compared = self.compared or reference_batch <= horizon
        if reference_batch > horizon or reference <= 0 or value <= reference * (1 + self.fraction):
            return None
        samples.clear()
        samples.append((batch, value))
        return Firing(MEMORY_GROWTH, batch, float(value), float(reference), "bytes")


class Cadence:
    """Batches to the next coarse check (~``interval_s``): the gap at most doubles, so one slow step is no gap."""

    def __init__(self, interval_s: float, max_batches: int = 1000) -> None:
        self.interval_ns = interval_s * 1e9
        self.max_batches = max_batches
        self._last: tuple[int, int] | None = None
        self._gap = 1

    def next_gap(self, batch: int, now_ns: int) -> int:
        last, self._last = self._last, (batch, now_ns)
        if last is None or self.interval_ns <= 0 or batch <= last[0]:
            self._gap = 1
            return 1
        step_ns = (now_ns - last[1]) / (batch - last[0])
        wanted = self.max_batches if step_ns <= 0 else int(min(self.max_batches, self.interval_ns / step_ns))
        self._gap = max(1, min(self.max_batches, wanted, 2 * self._gap))
        return self._gap
