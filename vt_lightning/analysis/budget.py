"""The run budget: how much of a run profiling may take, in bytes written and time in windows.
(The third limit, ``max_windows``, is counted by the window plan, ``sources.WindowPlan``.)

Pure bookkeeping, fed by the controller: a window's time on the training thread when it closes, its
files' sizes when the writer answers. ``exhausted`` is asked before each window opens; once a limit
is reached no window opens for the rest of the run (docs/options.md, "Run budget").

Time is the wall time of the training thread from a window's opening (warmup) to its hand-off,
compared with the run's wall time so far. The first ``grace_seconds`` of windows are always allowed,
so a short run's one window never counts as "50% of the run".
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class BudgetLimits:
    """None lifts a limit. The defaults leave ordinary schedules alone and stop runaway ones (a
    one-batch window at every batch made a 300-step run 65x slower)."""

    max_output_mb: float | None = 10_240.0
    max_time_share: float | None = 0.1
    grace_seconds: float = 10.0


@dataclass(frozen=True)
class Exhausted:
    """Which limit a run reached, and the option that raises it."""

    limit: str  # "bytes" | "time"
    option: str
    message: str


class RunBudget:
    """What the run has spent so far, against its limits."""

    def __init__(self, limits: BudgetLimits, started_at: float) -> None:
        self.limits = limits
        self.started_at = started_at
        self.window_seconds = 0.0  # training-thread time inside windows
        self.output_bytes = 0  # bytes the writer reported for the windows written

    def spent(self, seconds: float) -> None:
        self.window_seconds += max(0.0, seconds)

    def wrote(self, nbytes: int) -> None:
        self.output_bytes += max(0, nbytes)

    def exhausted(self, now: float) -> Exhausted | None:
        """The first limit reached before one more window may open, or None."""
        lim = self.limits
        if lim.max_output_mb is not None and self.output_bytes >= lim.max_output_mb * MIB:
            return Exhausted(
                "bytes",
                "max_output_mb",
                f"the windows' files reached {self.output_bytes / MIB:,.0f} MiB, the run's limit "
                f"(max_output_mb={lim.max_output_mb:g})",
            )
        if lim.max_time_share is not None:
            elapsed = max(0.0, now - self.started_at)
            allowed = max(lim.grace_seconds, lim.max_time_share * elapsed)
            if self.window_seconds >= allowed:
                return Exhausted(
                    "time",
                    "max_time_share",
                    f"windows took {self.window_seconds:.1f} s of the run's {elapsed:.1f} s "
                    f"({self.window_seconds / max(elapsed, 1e-9):.0%}), past the run's limit "
                    f"(max_time_share={lim.max_time_share:g}, after the first {lim.grace_seconds:g} s)",
                )
        return None
