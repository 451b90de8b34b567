"""``keep_windows``: only windows this process wrote are deleted, known from their results, never from
a scan: this worker's files (``<worker>.<span>.*``), then the directory once empty."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, MutableSequence
from typing import Any

from lightning.fabric.utilities.cloud_io import get_filesystem

from vt_lightning.constants import TRACE_SUFFIX
from vt_lightning.export.job import URL, Location, WindowResult


class Retention:
    """Counts finished windows in order and hands the oldest past ``keep`` to ``submit``."""

    def __init__(self, keep: int | None, submit: Callable[..., Any]) -> None:
        self.keep = keep
        self.submit = submit
        self._kept: deque[Location] = deque()  # trace paths of the windows on disk, oldest first

    def finished(self, result: WindowResult, results: MutableSequence[WindowResult]) -> int:
        """A window's result arrived: delete the oldest windows past ``keep``; how many were."""
        if self.keep is None:
            return 0
        self._kept.append(result.trace_path)
        deleted = 0
        while len(self._kept) > self.keep:
            trace = self._kept.popleft()
            for old in [r for r in results if r.trace_path == trace]:  # its files are gone: forget it
                results.remove(old)
            self.submit(delete_window_files, trace)
            deleted += 1
        return deleted


def delete_window_files(trace: Location) -> int:
    """How many of this worker's files of the window were removed (its directory too, if empty)."""
    if isinstance(trace, URL):
        return _delete_remote(trace)
    run_dir = os.path.dirname(os.fspath(trace))
    prefix = _prefix(os.path.basename(os.fspath(trace)))
    removed = 0
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(prefix) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed += 1
    with contextlib.suppress(OSError):
        os.rmdir(run_dir)  # only when empty: another rank's files (or anyone's) keep it
    return removed


def _prefix(trace_name: str) -> str:
    """``host_0.0000000012.pt.trace.json.gz`` -> ``host_0.0000000012.``: the worker's files of a window."""
    return trace_name.removesuffix(TRACE_SUFFIX) + "."


def _delete_remote(trace: URL) -> int:
    fs = get_filesystem(trace)
    run_dir, prefix = trace.parent, _prefix(trace.name)
    removed = 0
    for path in fs.ls(run_dir, detail=False):
        if str(path).rstrip("/").rpartition("/")[2].startswith(prefix):
            fs.rm(path)
            removed += 1
    try:
        if not fs.ls(run_dir, detail=False):
            fs.rmdir(run_dir)
    except Exception:  # object stores have no directories to remove
        pass
    return removed
