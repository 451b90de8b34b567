"""The training process's side of the writer: one background thread that hands windows, in order,
to the writer process (``_writer.py``) and bounds how many are pending.

Parsing, merging, encoding and compression run in the writer process, never on the training thread
(nor in its process, where they would compete for the GIL). At most ``max_in_flight`` windows are
pending, so memory stays bounded: when windows come faster than the disk takes them, the next window
waits for room at its start (and says so) rather than growing the queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


# Finish windows in a separate writer process (see ``_writer.py``); False keeps everything on the
# writer thread of the training process (tests that inject faults into ``finish`` use that).
USE_WRITER_PROCESS = True


class BackgroundWriter:
    """One worker thread that finishes windows in order, handing the heavy part to a writer process.

    The thread is started before any window opens, so it never inherits a tracer hook; the process
    is a fresh interpreter (``python -m vt_lightning._writer``), which inherits none either.
    """

    def __init__(self, max_in_flight: int = 2, use_process: bool | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.use_process = USE_WRITER_PROCESS if use_process is None else use_process
        self.process: Any = None
        self.process_error: BaseException | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vt_lightning-writer")
        self._futures: list[Future[Any]] = []
        self._lock = threading.Lock()
        # Create the thread now, outside any window, so no tracer hook is inherited by it.
        self._executor.submit(lambda: None).result()

    def writer_process(self) -> Any:
        """The writer process, started at the first window's hand-off (on the writer thread, so
        quiet steps before the first window never share the CPU with its start-up); None when
        there is none (disabled, or it could not start: windows are then finished on this thread)."""
        if self.process is None and self.use_process and self.process_error is None:
            from ._writer import WriterProcess

            try:
                self.process = WriterProcess()
            except Exception as err:
                self.process_error = err
        return self.process

    def in_flight(self) -> int:
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            return len(self._futures)

    def busy(self) -> bool:
        return self.in_flight() >= self.max_in_flight

    def wait_for_room(self) -> float:
        """Block until fewer than ``max_in_flight`` windows are pending; returns seconds waited."""
        start = time.perf_counter()
        while True:
            with self._lock:
                self._futures = [f for f in self._futures if not f.done()]
                if len(self._futures) < self.max_in_flight:
                    break
                oldest = self._futures[0]
            try:
                oldest.result()
            except Exception:
                pass
        return time.perf_counter() - start

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future = self._executor.submit(fn, *args)
        with self._lock:
            self._futures.append(future)
        return future

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every submitted window is on disk (or failed)."""
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            try:
                future.result(timeout=timeout)
            except Exception:  # already reported by the job itself
                pass

    def close(self, timeout: float | None = None) -> None:
        self.drain(timeout)
        self._executor.shutdown(wait=True)
        if self.process is not None:
            self.process.close()
            self.process = None



