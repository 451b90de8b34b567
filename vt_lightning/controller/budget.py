"""The run budget: past a limit it closes the plan, with one warning naming the option to raise."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from vt_lightning.analysis.budget import BudgetLimits, RunBudget
from vt_lightning.analysis.sources import Planned, WindowPlan
from vt_lightning.controller.messages import Warn
from vt_lightning.export.job import WindowResult
from vt_lightning.recording.window import ProfilingWindow


class BudgetGuard:
    """``begin`` as a window begins, ``opened`` / ``closed`` around it, ``received`` the writer's answers."""

    def __init__(self, limits: BudgetLimits, warn: Warn, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = RunBudget(limits, clock())
        self.warn = warn
        self.clock = clock
        self.agree: Callable[[bool], bool] = bool  # with DDP: any rank's budget spent stops all (run.any_rank)
        self._opened_at: float | None = None

    def start(self, agree: Callable[[bool], bool]) -> None:
        """At setup: how the ranks decide together (a fit's first batch is set at train start)."""
        self.agree = agree

    def begin(self, plan: WindowPlan, planned: Planned) -> bool:
        """Begin ``planned`` if the budget allows; else close the plan for the run, said once."""
        reached = self.budget.exhausted(self.clock(), planned.window.warmup_start)
        if self.agree(reached is not None):
            plan.close()
            what = reached.message if reached is not None else "another rank reached its limit"
            option = reached.option if reached is not None else "budget_time_share` / `budget_output_mb"
            self.warn(
                "budget",
                f"vt_lightning: run budget reached: {what}; no more windows open in this run. "
                f"Raise `{option}` (None: no limit) to profile more of it.",
            )
            return False
        plan.begin(planned)
        stopped = plan.limited_after(planned.window.end)
        if stopped is not None:
            self.warn(
                "max-windows",
                f"vt_lightning: budget_windows={plan.max_windows} reached with window {planned.number}; the "
                f"schedule's windows from batch {stopped} on, and triggers, open no window. Raise "
                "`budget_windows` (None: no limit) for more.",
            )
        return True

    def opened(self) -> None:
        self._opened_at = self.clock()

    def closed(self, window: ProfilingWindow | None = None) -> None:
        """The window is handed off (or skipped, or failed): its time counts, less its batches'."""
        if self._opened_at is not None:
            batches = (
                0 if window is None else len(window.steps) + window.window.active_start - window.window.warmup_start
            )
            self.budget.spent(self.clock() - self._opened_at, batches)
            self._opened_at = None

    def received(self, outcomes: Iterable[Any]) -> None:
        """Bytes of the windows the writer finished (traces and memory snapshots)."""
        for outcome in outcomes:
            if isinstance(outcome, WindowResult):
                self.budget.wrote(outcome.trace_bytes + outcome.memory_bytes)
