"""One rank's triggers, checked at a batch that needs a look. A slow step is known at the batch start
after it; the file, signal and memory are read at coarse checks (``trigger_interval``), in DDP one
all-reduce each (``agreement.py``), never inside a window: every rank gets one answer at one batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from vt_lightning.analysis.sources import WindowPlan
from vt_lightning.analysis.triggers import (
    MEMORY_GROWTH,
    SIGNAL,
    SLOW_STEP,
    TRIGGER_FILE,
    Cadence,
    Firing,
    MemoryGrowth,
    SlowStep,
    TriggerConfig,
)
from vt_lightning.controller.agreement import Agreement
from vt_lightning.recording.flight import FlightRecorder
from vt_lightning.recording.probes import Problem, SignalTrigger, TriggerFile


class TriggerWatch:
    def __init__(
        self,
        config: TriggerConfig,
        agreement: Agreement,
        clock: Callable[[], int],
        trigger_path: Path | str | None,  # a URL's (export/job.URL) on a remote root
        signal_trigger: SignalTrigger | None,
        read_memory: Callable[[], int] | None,
        memory_kind: str | None,
        on_problem: Problem,
        first_check: int,
    ) -> None:
        self.config = config
        self.agreement = agreement
        self.clock = clock
        self.on_problem = on_problem
        factor = config.slow_step_factor
        self.slow = SlowStep(factor, config.slow_step_baseline, clock) if factor is not None else None
        self.memory = MemoryGrowth(config.memory_growth, config.memory_growth_steps) if config.memory_growth else None
        self.read_memory = read_memory
        self.memory_kind = memory_kind
        self.file = TriggerFile(trigger_path, on_problem) if trigger_path is not None else None
        self.signal = signal_trigger
        self.cadence = Cadence(config.trigger_interval)
        self.next_check = first_check
        self._seen: list[Firing] = []  # slow steps waiting for the next agreed check (DDP)
        self._held: Firing | None = None  # an on-demand request that found a window recording
        self.flight: FlightRecorder | None = None  # samples the slow step that fires (recording/flight.py)

    def check(self, step: int, plan: WindowPlan) -> Firing | None:
        """What should open a window at batch ``step`` (None: nothing, or not now)."""
        if self.slow is not None and self.slow.fired is not None:
            if self.flight is not None:  # the step ran up to this batch start (``SlowStep.last``)
                self.flight.mark(step - 1, self.slow.last, self.slow.fired[0])
            slow = self.slow.take(step)
            if slow is not None:
                slow = dataclasses.replace(slow, detail=self._detail(SLOW_STEP), rank=self.agreement.rank)
                if not self.agreement.distributed:
                    return slow
                if not self._seen:
                    self._seen.append(slow)
        if step < self.next_check:
            return None
        if plan.busy(step):  # no check inside a window: wait for the batch after it (same on every rank)
            self.next_check = max(step + 1, plan.busy_until)
            return None
        return self._check(step)

    def hold(self, firing: Firing) -> None:
        """Keep an on-demand request that could not be honoured yet for the next check."""
        self._held = firing

    def request_now(self) -> None:
        """A signal came: in one process, check at the next batch instead of waiting for the cadence."""
        if not self.agreement.distributed:
            self.next_check = 0

    def _check(self, step: int) -> Firing | None:
        gap = self.cadence.next_gap(step, self.clock())
        if self.slow is not None:
            self.slow.refresh()
        firings, self._seen = self._seen, []
        if self._held is not None:
            firings.append(self._held)
            self._held = None
        if self.memory is not None and self.read_memory is not None:
            try:
                grown = self.memory.observe(step, self.read_memory())
            except Exception as err:  # the trigger goes off, the check goes on (DDP ranks stay in step)
                self.memory = None
                self.on_problem(
                    "memory-probe",
                    f"vt_lightning: cannot read memory use ({err}); the memory-growth trigger is off for this run.",
                )
                grown = None
            if grown is not None:
                firings.append(dataclasses.replace(grown, detail=self.memory_kind))
        if self.file is not None and self.file.seen():
            firings.append(Firing(TRIGGER_FILE, step, detail=str(self.file.path)))
        if self.signal is not None and self.signal.take():
            firings.append(Firing(SIGNAL, step, detail=self.signal.name))
        firing, gap = self.agreement.agree(firings, gap, self._detail)
        self.next_check = step + gap
        return firing

    def _detail(self, reason: str) -> str | None:
        if reason == TRIGGER_FILE and self.file is not None:
            return str(self.file.path)
        if reason == SIGNAL and self.signal is not None:
            return self.signal.name
        if reason == MEMORY_GROWTH:
            return self.memory_kind
        if reason == SLOW_STEP and self.slow is not None:  # the rule that fired (docs/triggers.md)
            return f"over {self.slow.factor:g}x the median of the last {self.config.slow_step_baseline} steps"
        return None
