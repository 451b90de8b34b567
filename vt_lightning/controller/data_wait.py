"""The data wait of steps outside windows (one batch's end to the next one's start), for ``input_bound``
to tell the loader's own wait from what tracing added. A warmup step counts: torch.profiler only
prepares in it (on torch 2.4 that inflated a fetch by 2-4 ms, which can only keep a verdict)."""

from __future__ import annotations

from array import array
from typing import Any

from vt_lightning.analysis.verdicts.input import untraced_reading

UNTRACED_STEPS_KEPT = 32  # the last untraced steps the reading covers


class UntracedWaits:
    """A ring of the last untraced steps' (wait, busy) seconds. Quiet batches allocate nothing: floats
    from CPython's free list, an ``array`` of doubles, an index among the cached small ints."""

    __slots__ = ("busy", "busy_last", "ended", "full", "slot", "started", "wait", "waits")

    def __init__(self) -> None:
        self.started = 0.0  # time.perf_counter() when the running step's own time began (0: none)
        self.ended = 0.0  # when the last step ended (0: the next wait is no fetch)
        self.wait = -1.0  # seconds the running step waited for its batch (-1: unknown or traced)
        self.waits = array("d", bytes(8 * UNTRACED_STEPS_KEPT))
        self.busy = array("d", bytes(8 * UNTRACED_STEPS_KEPT))
        self.slot = 0  # the next slot of the ring
        self.full = False  # every slot holds a step
        self.busy_last = 0.0  # seconds of the last counted step's own time

    def batch_start(self, now: float, traced: bool) -> None:
        """At the batch hook's entry; ``traced``: a window was open while the batch was fetched."""
        self.wait = now - self.ended if self.ended and not traced else -1.0
        self.started = now

    def resume(self, now: float) -> None:
        """vt_lightning's own work at this batch start is done: the step's own time begins."""
        self.started = now

    def batch_end(self, now: float, traced: bool) -> None:
        """At the batch-end hook's entry; ``traced``: the step ran under the Python tracer."""
        busy = self.busy_last if traced else now - self.started
        if self.wait >= 0 and self.started and busy > 0:
            slot = self.slot
            self.waits[slot] = self.wait
            self.busy[slot] = self.busy_last = busy
            if slot == UNTRACED_STEPS_KEPT - 1:
                self.slot, self.full = 0, True
            else:
                self.slot = slot + 1
        self.wait = -1.0
        self.ended = now  # ``ended_at`` moves it past vt_lightning's own work, where there is some

    def ended_at(self, now: float) -> None:
        """vt_lightning's own work at this batch end is done: the next batch's wait begins."""
        self.ended = now

    def not_a_step(self) -> None:
        self.ended = 0.0

    def reading(self) -> dict[str, Any] | None:
        kept = UNTRACED_STEPS_KEPT if self.full else self.slot
        return untraced_reading(list(self.waits[:kept]), list(self.busy[:kept]))
