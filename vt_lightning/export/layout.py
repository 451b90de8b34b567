"""Names and paths of what a window leaves on disk (pure: no I/O).

The TensorBoard plugin loads a run directory once, so every window gets a run directory of its own;
it finds traces by ``TRACE_PATTERN`` and compares spans as strings, hence the fixed width.
"""

from __future__ import annotations

import os
import platform
import re

from vt_lightning.constants import MEMORY_SUFFIX, OOM_MEMORY_SUFFIX, SPAN_WIDTH, TRACE_SUFFIX
from vt_lightning.constants import TRACE_PATTERN as TRACE_PATTERN  # re-exported: the plugin's pattern of a trace


def host_name() -> str:
    """Host part of the worker name (the plugin splits at the last ``_<digits>``), without ``socket``."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", platform.node()) or "host"


def worker_name(global_rank: int, host: str | None = None) -> str:
    return f"{host or host_name()}_{global_rank}"


def span_name(first_active_batch: int) -> str:
    return f"{first_active_batch:0{SPAN_WIDTH}d}"


def window_dir_name(
    window_index: int, first_batch: int, last_batch: int, stage: str = "fit", reason: str | None = None
) -> str:
    """A run name that sorts by window and says its batches, stage and trigger
    (``window_003-slow_step-batches_812-814``)."""
    prefix = "" if stage == "fit" else f"{stage}-"
    why = f"-{reason}" if reason else ""
    return f"{prefix}window_{window_index:03d}{why}-batches_{first_batch}-{last_batch}"


def trace_file_name(worker: str, span: str) -> str:
    return f"{worker}.{span}{TRACE_SUFFIX}"


def memory_file_name(worker: str, span: str) -> str:
    return f"{worker}.{span}{MEMORY_SUFFIX}"


def new_job_id() -> str:
    """``<host>-<pid>.<random>``, once per window: the writer's retries of it share it."""
    return f"{host_name()}-{os.getpid()}.{os.urandom(6).hex()}"


def claim_name(trace_name: str, job_id: str) -> str:
    """The hidden second name a window's trace carries until its result is back (``atomic.owns``), in the
    form of a temporary, so a dead process's claim is removed like its temporaries."""
    return f".{trace_name}.{job_id}.tmp"


def oom_file_name(memory_name: str) -> str:
    """``<worker>.<span>.memory_snapshot.pickle`` -> ``<worker>.<span>.oom.memory_snapshot.pickle``."""
    if memory_name.endswith(MEMORY_SUFFIX):
        return memory_name[: -len(MEMORY_SUFFIX)] + OOM_MEMORY_SUFFIX
    stem, dot, ext = memory_name.rpartition(".")
    return f"{stem}.oom.{ext}" if dot and stem else f"{memory_name}.oom"
