"""CUDA memory snapshots in the format of ``torch.cuda.memory._snapshot()``: a window's allocator
history (``CudaMemoryRecorder``) and the allocator's state at an out-of-memory error
(``dump_oom_snapshot``). Without allocator history the writer builds the same format from the
trace's ``[memory]`` events (``analysis/memory_snapshot.py``).
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any

from vt_lightning.constants import LOGGER_NAME
from vt_lightning.export.atomic import write_snapshot

log = logging.getLogger(LOGGER_NAME)


class MemorySnapshotError(RuntimeError):
    """Recording or taking a memory snapshot failed; the message says which step and why."""


def is_cuda_oom(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is torch's out-of-memory error."""
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, oom_type):
            return True
        if isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def dump_oom_snapshot(path: str | os.PathLike[str], recorder: CudaMemoryRecorder | None = None) -> Path:
    """Write the allocator's state and history at an out-of-memory error to ``path``, from Lightning's
    ``on_exception`` while history still records (without ``recorder``: the state only)."""
    path = Path(path)
    try:
        write_snapshot(path, recorder.snapshot() if recorder is not None else _cuda_memory()._snapshot())
    except Exception as exc:  # any error of torch's allocator API or of the write, named with the file
        raise MemorySnapshotError(f"could not take or write the out-of-memory snapshot {path}: {exc}") from exc
    log.warning("CUDA out of memory: allocator snapshot written to %s", path)
    return path


def _cuda_memory() -> Any:
    import torch.cuda.memory

    return torch.cuda.memory


class CudaMemoryRecorder:
    """The CUDA caching allocator's history for one window at a time, cleared at each start where torch
    can. A failed ``start()`` leaves recording off; ``stop()`` without one does nothing."""

    def __init__(self, max_entries: int) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.max_entries = max_entries
        self._recording = False

    @property
    def recording(self) -> bool:
        return self._recording

    def start_kwargs(self) -> dict[str, Any]:
        """Arguments for ``_record_memory_history``."""
        kwargs: dict[str, Any] = {
            "enabled": "all",
            "context": "all",
            "stacks": "all",
            "max_entries": self.max_entries,
        }
        memory = _cuda_memory()
        # Some versions hide the parameters behind *args/**kwargs: ask the implementation it forwards to.
        target = getattr(memory, "_record_memory_history_impl", memory._record_memory_history)
        try:
            if "clear_history" in inspect.signature(target).parameters:
                kwargs["clear_history"] = True  # torch >= 2.5: drop the previous window's entries
        except (TypeError, ValueError):  # no signature to read
            pass
        return kwargs

    def start(self) -> None:
        if self._recording:
            return
        memory = _cuda_memory()
        try:
            memory._record_memory_history(**self.start_kwargs())
        except Exception as exc:  # any error of torch's allocator API, named with the step that failed
            try:  # it may have half-enabled: make sure nothing keeps recording
                memory._record_memory_history(enabled=None)
            except Exception:  # best effort: recording is off either way; the start's error is raised
                pass
            raise MemorySnapshotError(
                f"could not start CUDA memory history (max_entries={self.max_entries}): {exc}"
            ) from exc
        self._recording = True

    def snapshot(self) -> dict[str, Any]:
        if not self._recording:
            raise MemorySnapshotError("CUDA memory snapshot requested while history is not recorded")
        try:
            return _cuda_memory()._snapshot()
        except Exception as exc:  # any error of torch's allocator API, named with the step that failed
            raise MemorySnapshotError(f"could not take the CUDA memory snapshot: {exc}") from exc

    def stop(self) -> None:
        if not self._recording:
            return
        self._recording = False  # whatever happens next, this recorder no longer owns a recording
        try:
            _cuda_memory()._record_memory_history(enabled=None)
        except Exception as exc:  # any error of torch's allocator API, named with the step that failed
            raise MemorySnapshotError(f"could not stop CUDA memory history: {exc}") from exc
