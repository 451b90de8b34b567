"""The training process's side of the writer: a daemon thread hands windows, in order, to the writer
process (``export/writer_process.py``), off training's GIL. At most ``max_in_flight`` are pending, and
training waits for the writer at most ``timeout`` seconds in all; a writer past it is abandoned (its
windows dropped, its process killed) and a fresh thread writes later windows, never waited for."""

from __future__ import annotations

import contextlib
import gc
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, wait
from typing import Any, cast

from vt_lightning.constants import WRITER_TIMEOUT_S
from vt_lightning.controller.inbox import Dropped, Notice, Outcome
from vt_lightning.controller.messages import GOES_ON, Warn, say
from vt_lightning.controller.remote import deliver
from vt_lightning.export.atomic import remove_stale_temporaries
from vt_lightning.export.job import WindowJob, WindowResult
from vt_lightning.export.pipeline import finish_window, remove_raw

# Imported here, on the thread that imports the package, never first on the writer thread: its
# os.register_at_fork would then race a fork of the training thread (after_in_parent without before).
from vt_lightning.export.writer_process import WriterProcess
from vt_lightning.recording.children import DumpChildFailed
from vt_lightning.recording.spool import SpoolError
from vt_lightning.recording.window import ClosedWindow

# False finishes windows on the writer thread, with no writer process (fault-injection tests).
USE_WRITER_PROCESS = True
PRESTART_LEAD_BATCHES = 8  # the writer process starts ahead of a window this far off (``prestart``)
# CPU training starts the writer at the first hand-off: its start-up cannot hide on a spare core
# (docs/performance.md, "Short runs"). False starts it ahead (the benchmark's ``vt_ahead``).
HAND_OFF_START_ON_CPU = True
FINISH_AT_END_WITHIN_S = 5.0  # seconds of steps before the run's end for ``finishes_at_end``; 0: off
SAY_WAIT_S = 0.25  # an end-of-run wait for the writer at least this long is said on the console


def finishes_at_end(cpu_bound: bool, process_started: bool, batches_left: int | None, step_s: float | None) -> bool:
    """Whether a closing window is held and finished in this process once training stops: where the
    writer process would start for it and the run's known end is within ``FINISH_AT_END_WITHIN_S``."""
    if not (cpu_bound and HAND_OFF_START_ON_CPU) or process_started:
        return False
    if batches_left is None or step_s is None or batches_left < 0 or step_s <= 0:
        return False
    return batches_left * step_s <= FINISH_AT_END_WITHIN_S


class WriterAbandoned(RuntimeError):
    """The window was pending when its writer was abandoned for taking too long."""


class StallAllowance:
    """``timeout`` less the waits since the writer last finished a window, proof it was not stuck (once
    one was abandoned, all waits): a long run's back-pressure never adds up to an abandon."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.blocked = 0.0  # seconds waited that count
        self.for_good = False  # a writer was abandoned: every wait counts from now on
        self._progress_at = -math.inf  # time.monotonic() when the writer last finished a window

    def progressed(self) -> None:
        """On the writer thread: a job ended."""
        self._progress_at = time.monotonic()
        if not self.for_good:
            self.blocked = 0.0

    def left(self) -> float:
        return max(0.0, self.timeout - self.blocked)

    def waited(self, start: float) -> None:
        """A wait that began at ``start`` ended: the part of it after the last finished window counts."""
        now = time.monotonic()
        self.blocked += now - start if self.for_good else now - max(start, min(self._progress_at, now))


class BackgroundWriter:
    """One thread finishing windows in order through a writer process, both started outside windows."""

    def __init__(
        self,
        max_in_flight: int = 2,
        use_process: bool | None = None,
        timeout: float = WRITER_TIMEOUT_S,
        on_problem: Warn | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.use_process = USE_WRITER_PROCESS if use_process is None else use_process
        self.timeout = timeout
        self.on_problem = on_problem or (lambda key, message: None)
        self.process: Any = None
        self.process_error: BaseException | None = None
        self.abandoned = 0  # how many times a stuck writer was given up
        self.allowance = StallAllowance(timeout)  # how long training may still wait for it
        self._futures: dict[Future[Any], int | None] = {}  # pending, in order; a hand-off's window index
        self._held: dict[Future[Any], ClosedWindow] = {}  # held hand-offs not done (abandon drops queued ones)
        self._lock = threading.Lock()
        self._generation = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Held windows (``finishes_at_end``) wait for this; ``_ending``: released by the run's end.
        self._released = threading.Event()
        self._ending = False
        self._thread = self._start_thread()

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(
            target=self._loop,
            args=(self._queue, self._generation),
            name=f"vt_lightning-writer-{self._generation}",
            daemon=True,
        )
        thread.start()
        return thread

    def _loop(self, jobs: queue.SimpleQueue[Any], generation: int) -> None:
        while True:
            item = jobs.get()
            if item is None or generation != self._generation:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as err:  # the writer thread's top level: every outcome goes to the job's future
                _settle(future, error=err)
            else:
                _settle(future, result=result)
            self.allowance.progressed()

    def submit(self, fn: Callable[..., Any], *args: Any, window: int | None = None) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._futures[future] = window
            self._queue.put((future, fn, args))
        return future

    def writer_process(self) -> Any:
        """The writer process, started on this thread; None when off or failed (then windows are written here)."""
        if self.process is None and self.use_process and self.process_error is None:
            try:
                self.process = WriterProcess()
            except Exception as err:  # no writer process: windows are finished on this thread instead
                self.process_error = err
        return self.process

    def prestart(self, first_warmup: float, now: int, run_end: int | None, *, cpu_bound: bool = False) -> None:
        """Start the writer process when a first window is far enough ahead and before ``run_end``."""
        if cpu_bound and HAND_OFF_START_ON_CPU:
            return
        if math.isinf(first_warmup) or first_warmup - now < PRESTART_LEAD_BATCHES:
            return
        if run_end is not None and first_warmup >= run_end:
            return
        self.submit(self.writer_process)

    @property
    def process_started(self) -> bool:
        """Whether a writer process is (being) started: holding a window would save nothing."""
        return self.process is not None or not self.use_process or self.process_error is not None

    def hand_off(self, closed: ClosedWindow, *, at_end: bool = False) -> Future[Outcome]:
        """Queue a closed window (``at_end``: held, see ``finishes_at_end``); its future answers once, never raises."""
        if not at_end:
            self._release(ending=False)
        window = closed.job.metadata.get("window")
        future = self.submit(self._finish, closed, at_end, window=window if isinstance(window, int) else None)
        if at_end:
            with self._lock:
                self._held[future] = closed
        return future

    def _finish(self, closed: ClosedWindow, at_end: bool = False) -> Outcome:
        """On the writer thread: the window's result, or why it was dropped."""
        job = closed.job
        try:
            return deliver(job, self.run(closed, at_end), self.in_writer)  # claim released; a remote root gets its copy
        except WriterAbandoned:  # reported once, when the writer was given up
            return Dropped(None)
        except DumpChildFailed as err:  # a dump child stuck (killed and reaped) or crashed
            key, text = f"dump:{type(err).__name__}", f"window dropped: {err}; {GOES_ON}"
        except SpoolError as err:  # the raw dumps, not the output directory, are the problem
            key, text = f"spool:{err.errno}", f"window dropped: {err.strerror}; training goes on."
        except Exception as err:  # the writer job's boundary: any fault drops this window with one notice
            key = f"write:{type(err).__name__}:{job.run_dir.parent}"
            text = f"could not write the window to {job.run_dir} ({type(err).__name__}: {err}); {GOES_ON}"
        return Dropped(Notice(key, f"vt_lightning: {text}"))

    def in_writer(self, work: Callable[[], Any]) -> Any:
        """On the writer thread: ``work`` in the writer process when one runs (off training's GIL), else here."""
        process = self.process
        return process.call(work) if process is not None and process.alive() else work()

    def run(self, closed: ClosedWindow, at_end: bool = False) -> WindowResult:
        """On the writer thread: complete the raw dumps, then write the window in the writer process or here."""
        job = closed.job
        generation = self._generation
        here = False  # released by the run's end with no writer process: finish it on this thread
        if at_end:
            self._released.wait()
            if generation != self._generation:  # abandoned while held: its future is settled already
                closed.drop()
                remove_raw(job)
                raise WriterAbandoned("the writer was abandoned while this window was pending")
            here = self._ending and self.process is None
        process = None if here else self.writer_process()  # first: its start-up overlaps torch's export
        try:
            closed.collect(in_process=self._ending)  # a held dump: here once training has stopped
        except BaseException:  # cleanup: the raw dumps go whatever stopped the collect; re-raised
            remove_raw(job)
            raise
        if here:
            return _finish_with_collector_paused(job)
        if process is None:
            return finish_window(job)
        try:
            return cast(WindowResult, process.call(job))
        except (EOFError, OSError, ValueError) as err:  # the process died (killed, crashed) mid-window
            process.close(timeout=1.0)  # reap it
            remove_stale_temporaries(job.run_dir.parent, pid=process.pid)
            if generation != self._generation:
                remove_raw(job)
                raise WriterAbandoned("the writer was abandoned while this window was pending") from err
            if self.process is process:
                self.process = None
                self.process_error = err
            self.on_problem(
                "writer-died",
                f"vt_lightning: the writer process stopped ({type(err).__name__}); windows are now written "
                "from a thread of the training process.",
            )
            return finish_window(job)

    def _pending(self) -> list[Future[Any]]:
        with self._lock:
            self._futures = {f: window for f, window in self._futures.items() if not f.done()}
            self._held = {f: c for f, c in self._held.items() if not f.done()}
            return list(self._futures)

    def in_flight(self) -> int:
        return len(self._pending())

    def wait_for_room(self) -> tuple[float, bool]:
        """(seconds waited, room?) within the allowance; past it the writer is abandoned, and no window waits again."""
        limit = self.allowance.left()
        start = time.monotonic()
        try:
            return self._wait_for_room(limit, start)
        finally:
            self.allowance.waited(start)

    def _wait_for_room(self, limit: float, start: float) -> tuple[float, bool]:
        while True:
            pending = self._pending()
            if len(pending) < self.max_in_flight:
                return time.monotonic() - start, True
            self._release(ending=False)  # training waits: a held window goes to the writer process now
            left = limit - (time.monotonic() - start)
            if self.abandoned or left <= 0 or not _settles(pending[0], left):
                break
        waited = time.monotonic() - start
        if not self.abandoned or self._pending():
            self.abandon()
        return waited, False

    def drain(self) -> bool:
        """Wait until every submitted window is written (or failed), within the allowance; else abandon."""
        start = time.monotonic()
        deadline = start + self.allowance.left()
        self._release(ending=True)  # training has stopped: held windows are finished on the writer thread
        pending = self._pending()
        windows = sorted(window for window in self._futures.values() if window is not None)
        try:
            for future in pending:
                if not _settles(future, deadline - time.monotonic()):
                    self.abandon()
                    return False
            return True
        finally:
            waited = time.monotonic() - start
            self.allowance.waited(start)
            if waited >= SAY_WAIT_S and windows:  # rank 0 only
                which = f"window {windows[0]}" if len(windows) == 1 else "windows " + ", ".join(map(str, windows))
                say(f"vt_lightning: waited {waited:.1f} s for the writer to finish {which}")

    def abandon(self) -> None:
        """Drop the pending windows, kill and reap the process, and start a fresh thread."""
        with self._lock:
            self.abandoned += 1
            self.allowance.for_good = True
            self._generation += 1
            self.use_process = False  # the fallback: later windows are written by the fresh thread
            futures, self._futures = self._futures, {}
            old_queue, self._queue = self._queue, queue.SimpleQueue()
            process, self.process = self.process, None
            held, self._held = self._held, {}
        self._release(ending=False)  # a held window's thread wakes, sees the new generation and drops it
        old_queue.put(None)
        for future in futures:
            if future.cancel():
                if future in held:  # never ran: its calls leave VizTracer's buffer unwritten
                    held[future].drop()
            else:
                _settle(future, error=WriterAbandoned("the writer was abandoned while this window was pending"))
        if process is not None:
            process.kill()
        self._thread = self._start_thread()

    def close(self) -> bool:
        """Drain, then stop the thread and the process, also when interrupted; True unless abandoned."""
        finished = False
        try:
            finished = self.drain()
        finally:
            self._queue.put(None)
            try:
                self._thread.join(timeout=1.0)
            finally:
                process, self.process = self.process, None
                if process is not None and finished and not self._pending():
                    process.kill()  # idle: every window answered and written. No wait for a niced exit
                elif process is not None:
                    process.close(timeout=5.0)
        return finished

    def _release(self, *, ending: bool) -> None:
        """End the hold of held windows (``hand_off(at_end=True)``); ``ending``: training stopped."""
        if ending:
            self._ending = True
        self._released.set()


def _finish_with_collector_paused(job: WindowJob) -> WindowResult:
    """A held window, the collector paused as in the writer process: collections over training's heap cost half."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return finish_window(job)
    finally:
        if was_enabled:
            gc.enable()


def _settles(future: Future[Any], timeout: float) -> bool:
    """Whether ``future`` is done in time; never raises its outcome, only a signal handler's exception."""
    done, _ = wait([future], timeout=max(0.0, timeout))
    return bool(done)


def _settle(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless it already is (abandoned, or settled by the other side)."""
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
