"""The flight recorder: the training thread's Python stack sampled (100 Hz, a ring of ~20 s) once a
step has run half the median step, so a slow-step window shows the step that fired it
(docs/triggers.md). Nothing more runs per batch on the training thread; the sampler never runs
while a window traces. A slow step's samples are set aside (``mark``), given to its window
(``assign``) and handed over at its close (``FlightSide``); ``analysis/flight.py`` makes the track."""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from types import CodeType
from typing import Any

from vt_lightning.analysis.flight import FlightCapture
from vt_lightning.analysis.schedule import Window
from vt_lightning.analysis.triggers import SlowStep
from vt_lightning.recording.clock_probes import sample_pair

RATE_HZ = 100
RING_SAMPLES = 2048  # about 20 s at 100 Hz: a slow step longer than that keeps its last 20 s
IDLE_S = 0.1  # until the trigger arms, the thread only looks again this often
# A step is sampled once it has run this share of the median step (a slow step runs > factor x it).
LATE_FRACTION = 0.5
Sample = tuple[int, tuple[CodeType, ...]]  # (perf_counter_ns, code objects innermost first)

# Training thread ident -> its recorder (see flight_side); weak, so a run dropped without teardown
# lets its recorder go, and its sampler thread ends at its next tick.
_ARMED: weakref.WeakValueDictionary[int, FlightRecorder] = weakref.WeakValueDictionary()


class FlightRecorder:
    """Samples one thread's Python stack into a ring while ``armed()``, at the ticks ``due(now_ns)`` says."""

    def __init__(
        self,
        armed: Callable[[], bool],
        rate_hz: float = RATE_HZ,
        ring: int = RING_SAMPLES,
        thread: threading.Thread | None = None,
        due: Callable[[int], bool] | None = None,
    ) -> None:
        self.armed = armed
        self.due = due
        self.interval_ns = int(1e9 / rate_hz)
        self.ring: deque[Sample] = deque(maxlen=ring)
        self.thread = thread or threading.current_thread()  # the one sampled: the training thread
        self.sampler: threading.Thread | None = None
        self.stopped = False
        self._stop_sampler = threading.Event()
        self._marked: tuple[int, int, int, list[Sample], bool] | None = None  # (batch, start, end, samples, cut)
        self._assigned: dict[int, tuple[int, int, int, list[Sample], bool]] = {}  # by window warmup start

    def start(self) -> None:
        """Begin sampling (from setup, on the training thread); an earlier recorder of the thread stops."""
        previous = _ARMED.get(self.thread.ident or 0)
        if previous is not None and previous is not self:
            previous.stop()
        _ARMED[self.thread.ident or 0] = self
        self.resume()

    def resume(self) -> None:
        """A fresh sampler thread (after a window), unless one runs or the recorder stopped for good."""
        if self.stopped or self.sampler is not None:
            return
        self._stop_sampler = stop = threading.Event()
        self.sampler = threading.Thread(
            target=_sample, args=(weakref.ref(self), stop), name="vt_lightning-flight", daemon=True
        )
        self.sampler.start()

    def pause(self) -> None:
        """Stop the sampler thread (a window starts tracing); the ring stays."""
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            self._stop_sampler.set()
            if sampler is not threading.current_thread():
                sampler.join(timeout=1.0)

    def stop(self) -> None:
        """For good (idempotent): the thread ends, the ring and the captures are dropped."""
        self.stopped = True
        self.pause()
        if _ARMED.get(self.thread.ident or 0) is self:
            del _ARMED[self.thread.ident or 0]
        self.ring.clear()
        self._marked = None
        self._assigned.clear()

    def mark(self, batch: int, end_ns: int, duration_ns: int) -> None:
        """Step ``batch`` (ending at ``end_ns``) was slow: set its samples aside before the ring forgets them."""
        start_ns = end_ns - duration_ns
        ring = list(self.ring)
        cut = bool(ring) and len(ring) == self.ring.maxlen and ring[0][0] > start_ns
        self._marked = (batch, start_ns, end_ns, [s for s in ring if start_ns <= s[0] < end_ns], cut)

    def assign(self, window_start: int, batch: int) -> None:
        """The slow-step window for the step at ``batch`` gets its samples if this rank marked that very step
        (with DDP the agreed firing may be another rank's)."""
        marked, self._marked = self._marked, None
        if marked is not None and marked[0] == batch:
            self._assigned = {window_start: marked}

    def take(self, window_start: int, python_clock_us: Callable[[], float] | None) -> FlightCapture | None:
        """The capture assigned to the window warming up at ``window_start``, as plain data (once)."""
        marked = self._assigned.pop(window_start, None)
        if marked is None:
            return None
        batch, start_ns, end_ns, samples, cut = marked
        pair = sample_pair(python_clock_us, time.perf_counter_ns, rounds=8) if python_clock_us is not None else None
        frames: list[tuple[str, str, int]] = []
        index: dict[CodeType, int] = {}
        plain: list[tuple[int, tuple[int, ...]]] = []
        for t, codes in samples:
            stack = []
            for code in reversed(codes):  # outermost first
                i = index.get(code)
                if i is None:
                    i = index[code] = len(frames)
                    frames.append((getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno))
                stack.append(i)
            plain.append((t, tuple(stack)))
        return FlightCapture(
            batch=batch,
            start_ns=start_ns,
            end_ns=end_ns,
            interval_ns=self.interval_ns,
            pid=os.getpid(),
            tid=self.thread.native_id or 0,
            frames=frames,
            samples=plain,
            clock=(pair.wall_ns, pair.python_us) if pair is not None else None,
            truncated=cut,
        )


def _sample(owner: weakref.ref[FlightRecorder], stop: threading.Event) -> None:
    """The sampler thread's loop: ends with ``stop``, with the training thread, or with its owner."""
    current_frames, now = sys._current_frames, time.perf_counter_ns
    while True:
        recorder = owner()
        if recorder is None or recorder.stopped or not recorder.thread.is_alive():
            return
        armed = recorder.armed()
        wait_s = recorder.interval_ns / 1e9 if armed else IDLE_S
        tick = now()
        if armed and (recorder.due is None or recorder.due(tick)):
            frame = current_frames().get(recorder.thread.ident or 0)
            codes = []
            while frame is not None:
                codes.append(frame.f_code)
                frame = frame.f_back
            recorder.ring.append((tick, tuple(codes)))
            del frame
        del recorder
        if stop.wait(wait_s):
            return


class FlightSide:
    """A window's side recorder: the sampler stops while the window traces; a slow-step window gets samples."""

    name = "flight"

    def __init__(self, recorder: FlightRecorder, target: Window, python_clock_us: Callable[[], float]) -> None:
        self.recorder = recorder
        self.target = target
        self.python_clock_us = python_clock_us

    def start(self) -> None:
        self.recorder.pause()

    def stop(self) -> None:
        self.recorder.resume()

    def collect(self) -> Any:
        capture = self.recorder.take(self.target.warmup_start, self.python_clock_us)
        return capture.as_dict() if capture is not None else None


def flight_for(slow: SlowStep | None, clock: Callable[[], int]) -> FlightRecorder | None:
    """A started flight recorder for the slow-step trigger; None when it is off, or its clock is not
    ``perf_counter_ns`` (the sampler's)."""
    if slow is None or clock is not time.perf_counter_ns:
        return None

    def running_long(now_ns: int) -> bool:
        """The step under way has run for more than ``LATE_FRACTION`` of the median step."""
        started, median = slow.last, slow.baseline_ns
        return started > 0 and median is not None and now_ns - started > LATE_FRACTION * median

    recorder = FlightRecorder(lambda: slow.armed, due=running_long)
    recorder.start()
    return recorder


def flight_side(target: Window, python_clock_us: Callable[[], float]) -> list[FlightSide]:
    """The window's flight side recorder, if a flight recorder samples this (the training) thread."""
    recorder = _ARMED.get(threading.get_ident())
    return [FlightSide(recorder, target, python_clock_us)] if recorder is not None and not recorder.stopped else []


def _forget_in_forked_child() -> None:
    """The child has no sampler thread, and must never hand the parent's samples to a window."""
    for recorder in list(_ARMED.values()):
        recorder.sampler = None
        recorder.stopped = True
    _ARMED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_forked_child)
