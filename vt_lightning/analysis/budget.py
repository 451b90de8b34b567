"""The run budget: how much of a run profiling may take, in bytes written and time in windows. Pure.

Time is profiling's overhead: the training thread's time in windows less what their batches would
have taken at the run's mean quiet-batch time, against the run's wall time, past ``grace_seconds``."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class BudgetLimits:
    """None lifts a limit. The defaults leave ordinary schedules alone and stop runaway ones."""

    budget_output_mb: float | None = 10_240.0
    budget_time_share: float | None = 0.1
    grace_seconds: float = 3.0


@dataclass(frozen=True)
class Exhausted:
    """Which limit a run reached, and the option that raises it."""

    limit: str  # "bytes" | "time"
    option: str
    message: str


class RunBudget:
    """What the run has spent so far, against its limits."""

    def __init__(self, limits: BudgetLimits, started_at: float, first_batch: int = 0) -> None:
        self.limits = limits
        self.started_at = started_at
        self.first_batch = first_batch  # the run's first batch (a resumed fit starts past 0)
        self.window_seconds = 0.0  # training-thread time from windows' openings to their hand-offs
        self.window_batches = 0  # batches run inside those windows
        self.output_bytes = 0  # bytes the writer reported for the windows written

    def spent(self, seconds: float, batches: int) -> None:
        self.window_seconds += max(0.0, seconds)
        self.window_batches += max(0, batches)

    def wrote(self, nbytes: int) -> None:
        self.output_bytes += max(0, nbytes)

    def overhead(self, now: float, batch: int) -> float:
        """Seconds the windows added to the run by batch ``batch``."""
        elapsed = max(0.0, now - self.started_at)
        quiet_batches = batch - self.first_batch - self.window_batches
        quiet_step = max(0.0, elapsed - self.window_seconds) / quiet_batches if quiet_batches > 0 else 0.0
        return max(0.0, self.window_seconds - self.window_batches * quiet_step)

    def exhausted(self, now: float, batch: int) -> Exhausted | None:
        """The first limit reached before a window may begin at batch ``batch``, or None."""
        lim = self.limits
        if lim.budget_output_mb is not None and self.output_bytes >= lim.budget_output_mb * MIB:
            return Exhausted(
                "bytes",
                "budget_output_mb",
                f"the windows' files reached {size_text(self.output_bytes)}, the run's limit "
                f"(budget_output_mb={lim.budget_output_mb:g})",
            )
        if lim.budget_time_share is not None:
            elapsed = max(0.0, now - self.started_at)
            overhead = self.overhead(now, batch)
            if overhead >= max(lim.grace_seconds, lim.budget_time_share * elapsed):
                return Exhausted(
                    "time",
                    "budget_time_share",
                    f"windows added {overhead:.1f} s to the run's {elapsed:.1f} s "
                    f"({overhead / max(elapsed, 1e-9):.0%}), past the run's limit "
                    f"(budget_time_share={lim.budget_time_share:g}, after the first {lim.grace_seconds:g} s)",
                )
        return None


def size_text(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit it is at least 1 of, to 3 significant digits."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{nbytes:.0f} B"
