"""Before torch's profiler stops where collectives run on gloo: wait, briefly and bounded, until no
native thread of the process is running. gloo completes a collective's future before its thread
ends the collective's profiler range; a window closed then corrupted the heap on torch 2.4 and 2.5.
Linux only (``/proc``). NCCL ends its ranges on the launching thread: nothing waits there."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from vt_lightning.export.atomic import scheduler_state

SETTLE_TIMEOUT_S = 0.02  # the most a window's close waits (0.75 ms mean, 10 ms at most under load)
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


def wait_for_native_threads(
    timeout_s: float = SETTLE_TIMEOUT_S, skip: set[int] | None = None, task_dir: Path = TASK_DIR
) -> float | None:
    """Wait until no thread outside ``skip`` (default: the Python threads) runs; the seconds waited, or
    None when one still ran after ``timeout_s``."""
    if skip is None:
        skip = {t.native_id for t in threading.enumerate() if t.native_id is not None}
    start = time.perf_counter()
    while running_threads(skip, task_dir):
        if time.perf_counter() - start >= timeout_s:
            return None
        time.sleep(_POLL_S)
    return time.perf_counter() - start


def collectives_on_gloo() -> bool:
    """True when torch.distributed's default group runs on gloo (CPU DDP)."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo")
    except Exception:  # pragma: no cover - a half-torn-down group: nothing to wait for
        return False
