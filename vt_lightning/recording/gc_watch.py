"""Garbage-collector pauses during a window (a side recorder), as spans on the thread that paused.

VizTracer shows a collection only as a gap inside whatever call allocated. ``gc.callbacks`` gives
each collection's start and end, stamped with the Python tracer's clock so that the writer places
them as it places the Python calls, named ``"[gc] generation N"``, where the ``gc`` verdict reads them.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import Any

from vt_lightning.constants import GC_SPAN_PREFIX

MAX_PAUSES = 100_000  # a window's worth at the most; more are counted, not kept


class GcWatch:
    """Side recorder ``"gc"``: one ``gc.callbacks`` entry for the window, removed at stop."""

    name = "gc"

    def __init__(self, clock_us: Callable[[], float]) -> None:
        self._clock_us = clock_us
        self._open: dict[int, tuple[float, int]] = {}  # native thread id -> (start µs, generation)
        self._pauses: list[tuple[float, float, int, int, int, int]] = []
        self._dropped = 0
        self._installed = False
        self._pid = os.getpid()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if os.getpid() != self._pid:  # a child forked during the window inherited gc.callbacks
            return
        now = self._clock_us()
        tid = threading.get_native_id()
        if phase == "start":
            self._open[tid] = (now, int(info.get("generation", -1)))
            return
        opened = self._open.pop(tid, None)
        if opened is None:  # began before the window started
            return
        if len(self._pauses) >= MAX_PAUSES:
            self._dropped += 1
            return
        start, generation = opened
        self._pauses.append(
            (start, now, tid, generation, int(info.get("collected", 0)), int(info.get("uncollectable", 0)))
        )

    def start(self) -> None:
        self._clock_us()  # fail here, not inside a collection, if the clock is unusable
        self._pid = os.getpid()
        gc.callbacks.append(self._callback)
        self._installed = True

    def stop(self) -> None:
        if self._installed:
            self._installed = False
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:  # someone cleared gc.callbacks
                pass
        self._open.clear()

    def collect(self) -> dict[str, Any] | None:
        """The pauses as VizTracer-style events (``ts`` on the Python tracer's clock)."""
        if not self._pauses and not self._dropped:
            return None
        pid = os.getpid()
        events = [
            {
                "ph": "X",
                "name": f"{GC_SPAN_PREFIX}generation {generation}",
                "ts": start,
                "dur": max(end - start, 0.0),
                "pid": pid,
                "tid": tid,
                "args": {"collected": collected, "uncollectable": uncollectable},
            }
            for start, end, tid, generation, collected, uncollectable in self._pauses
        ]
        return {"events": events, "dropped": self._dropped}
