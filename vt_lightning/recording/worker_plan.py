"""The plan DataLoader workers read per fetch (``SharedPlan``), and what a worker is sent to set itself
up (``WorkerSetup``). Workers fetch ahead, so they cannot be armed when a window opens: each decides
per fetch from a small memory-mapped file in the spool (the epoch's first global batch, its length,
the next windows' active ranges); a fetch's task number plus the epoch's first batch is its batch."""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from vt_lightning.analysis.workers import NO_LIMIT, PLAN_SLOTS, Range
from vt_lightning.recording.clock_probes import sample_pair
from vt_lightning.recording.pytracer import PythonTracerConfig

CLOCK_ROUNDS = 16  # clock pairs read at each edge of a part (worker) or window (training process)
WORKERS_DIR = "workers"

# The plan, int64s: seq (odd while being written), epoch_base, epoch_limit, count, PLAN_SLOTS ranges.
_PLAN_BYTES = 8 * (4 + 2 * PLAN_SLOTS)


class SharedPlan:
    """A seqlock over a memory-mapped file: one writer, many readers; an unchanged plan costs one load."""

    def __init__(self, path: str, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, _PLAN_BYTES)
            access = mmap.ACCESS_WRITE if create else mmap.ACCESS_READ
            self._map = mmap.mmap(fd, _PLAN_BYTES, access=access)
        finally:
            os.close(fd)
        self._view: memoryview | None = memoryview(self._map).cast("q")
        self._seq = -1
        self._last: tuple[int, int, list[Range]] = (0, 0, [])

    def publish(self, epoch_base: int, epoch_limit: int, ranges: list[Range]) -> None:
        view = self._view
        if view is None:
            return
        seq = view[0] + 1 | 1
        view[0] = seq  # odd: readers retry
        view[1], view[2], view[3] = epoch_base, min(epoch_limit, NO_LIMIT), min(len(ranges), PLAN_SLOTS)
        for i, (first, end) in enumerate(ranges[:PLAN_SLOTS]):
            view[4 + 2 * i], view[5 + 2 * i] = first, end
        view[0] = seq + 1

    def read(self) -> tuple[int, int, list[Range]]:
        """(epoch_base, epoch_limit, ranges); no ranges when the plan could not be read."""
        view = self._view
        if view is None:
            return 0, 0, []
        if view[0] == self._seq:  # the fast path: nothing published since the last read
            return self._last
        for _ in range(1000):
            seq = view[0]
            if seq & 1:
                continue
            count = min(view[3], PLAN_SLOTS)
            plan = (view[1], view[2], [(view[4 + 2 * i], view[5 + 2 * i]) for i in range(count)])
            if view[0] == seq:
                self._seq, self._last = seq, plan
                return plan
        return 0, 0, []

    def close(self) -> None:
        view, self._view = self._view, None
        try:
            if view is not None:
                view.release()
            self._map.close()
        except (BufferError, ValueError):
            pass


def clock_reading(python_clock_us: Callable[[], float]) -> tuple[float, int]:
    """(Python tracer µs, CLOCK_MONOTONIC ns) at one instant: the clock workers and training share."""
    pair = sample_pair(python_clock_us, time.monotonic_ns, rounds=CLOCK_ROUNDS)
    return pair.python_us, pair.wall_ns


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs, sent with its ``worker_init_fn`` (pickled under spawn)."""

    plan_path: str
    out_dir: str
    rank: int
    config: PythonTracerConfig
    calls: str = "user"  # ``worker_calls``: "user" or "all"
