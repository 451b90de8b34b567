"""Before torch's profiler stops in a process whose collectives run on gloo: wait, briefly and
bounded, until no native thread of the process is running.

Why: gloo completes a collective's future *before* it ends the collective's profiler range on its
worker thread (``ProcessGroupGloo::AsyncWork::finishWorkGloo``: ``returnFutureWithOutput``, then
``finish()``, which runs the range's end callback). DDP's gradient all-reduce waits on that future,
so a window could close while a gloo worker was still recording into the session that
``disableProfiler()`` was tearing down. On torch 2.4 and 2.5 that corrupted the heap: glibc's
``free(): corrupted unsorted chunks`` in ``~KinetoThreadLocalState`` (the freed chunk in the gloo
worker's malloc arena), a SIGSEGV in a native thread, or either one later, anywhere (CI: 2 of 5
fresh runs of tests/test_ddp.py on the lower bounds; here 5 of 36 runs of a 2-rank CPU DDP training
with ~12 windows, and none of 30 with this wait: docs/troubleshooting.md).

After the step every collective's future has been waited on, so no collective is queued: what may
still run is the tail of one. Once every native thread (not a Python thread, not ours) has been
seen asleep, none is in a tail, and none can start one. Linux only (``/proc``); elsewhere, and in
processes without gloo collectives, nothing waits: NCCL ends a collective's range on the thread
that launched it (its CUDA future completes at launch), and its proxy threads may spin.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from vt_lightning.export.atomic import scheduler_state

SETTLE_TIMEOUT_S = 0.02  # the most a window's close waits (measured: 0.75 ms mean, 10 ms max under load)
_POLL_S = 0.0002
TASK_DIR = Path("/proc/self/task")


def running_threads(skip: set[int], task_dir: Path = TASK_DIR) -> list[int]:
    """Native ids of this process's threads that are running or runnable now, but for ``skip``."""
    busy = []
    try:
        entries = list(os.scandir(task_dir))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            with open(entry.path + "/stat", "rb") as stat:
                state = scheduler_state(stat.read())
        except OSError:  # the thread ended meanwhile
            continue
        if state == "R":
            busy.append(int(entry.name))
    return busy


def python_thread_ids() -> set[int]:
    """Native ids of the interpreter's threads (this one, ours, the user's): never in a gloo tail."""
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def wait_for_native_threads(
    timeout_s: float = SETTLE_TIMEOUT_S, skip: set[int] | None = None, task_dir: Path = TASK_DIR
) -> float | None:
    """Wait until no thread outside ``skip`` (default: the Python threads) is running; return the
    seconds waited, or None when one still ran after ``timeout_s`` (then the caller goes on)."""
    skip = python_thread_ids() if skip is None else skip
    start = time.perf_counter()
    while running_threads(skip, task_dir):
        if time.perf_counter() - start >= timeout_s:
            return None
        time.sleep(_POLL_S)
    return time.perf_counter() - start


def collectives_on_gloo() -> bool:
    """True when torch.distributed's default group runs on gloo (CPU DDP): the case above."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo")
    except Exception:  # pragma: no cover - a half-torn-down group: nothing to wait for
        return False
