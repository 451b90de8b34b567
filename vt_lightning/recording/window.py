"""One profiling window on the training thread: the tracers started and stopped together, in order.

torch starts first and stops last; the clocks are read just outside the Python tracer's span (so
calibration never depends on traced events); the Python hook goes in last and comes off first.
Closing only stops recording and dumps VizTracer's buffer: the rest is the writer's.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vt_lightning.analysis.clock import ClockPair
from vt_lightning.analysis.schedule import Window
from vt_lightning.constants import PL_PROFILE_PREFIX
from vt_lightning.export.job import Destination, WindowJob
from vt_lightning.export.raw_json import readable
from vt_lightning.recording.children import DumpChildFailed, wait_for_dump
from vt_lightning.recording.clock_probes import emit_markers, sample_pair
from vt_lightning.recording.memory import CudaMemoryRecorder
from vt_lightning.recording.pytracer import HeldDump, PythonTracer, foreign_profiler
from vt_lightning.recording.rivals import RivalGuard, RivalProfiler
from vt_lightning.recording.side import SideRecorder
from vt_lightning.recording.spool import SpoolError
from vt_lightning.recording.torchtracer import TorchTracer
from vt_lightning.recording.unsafe_names import ImportGuard, UnsafeImport


def thread_names_now(started: dict[int, str]) -> dict[int, str]:
    """Native id -> ``readable`` name of the threads alive now and of ``started`` (one name that is not
    UTF-8 would make the writer refuse the window)."""
    names = {**started, **{t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}}
    return {tid: readable(name) for tid, name in names.items()}


class ProfilingWindow:
    """The live state of one scheduled window."""

    def __init__(
        self,
        window: Window,
        python: PythonTracer,
        torch_tracer: TorchTracer,
        memory_recorder: CudaMemoryRecorder | None = None,
        step_hooks: Any = None,
        on_problem: Callable[[str, str], Any] | None = None,
        side: list[SideRecorder] | None = None,
    ) -> None:
        self.window = window
        self.python = python
        self.torch = torch_tracer
        self.memory_recorder = memory_recorder
        self.step_hooks = step_hooks  # e.g. the Lightning view's module hooks
        self.on_problem = on_problem or (lambda key, message: None)
        self.side = list(side or ())  # started at activation, in order; stopped in reverse
        self._side_started: list[SideRecorder] = []
        self.steps: list[int] = []
        self.yielded: str | None = None  # the other profiler this window stopped for
        self._guard = RivalGuard(self._yield_to)
        self.unsafe_import: UnsafeImport | None = None  # set from any thread by ``_imports``
        self._imports = ImportGuard(self._unsafe_import)  # on sys.meta_path only while recording
        self.active = False
        self.closed = False
        self._clock_start: ClockPair | None = None
        self._markers_start: list[tuple[str, float, float]] = []
        self._open_ranges: dict[str, tuple[Any, float, int | None]] = {}  # kind -> (range, t0, step)
        self._range_log: dict[str, list[dict[str, Any]]] = {}

    def warmup(self) -> None:
        """Install the rival guard and start torch's profiler in warmup."""
        try:
            self._guard.install()
            self.torch.prepare()
        except BaseException:  # cleanup: nothing of the window stays installed; re-raised
            self.abort()
            raise

    def activate(self) -> None:
        """Start recording at the first active batch; yield to a profiler started since warmup."""
        self.check_rivals()
        rival = foreign_profiler()
        if rival is not None:
            self._yield_to(rival)
            raise RivalProfiler(rival)
        self.torch.start()
        if self.memory_recorder is not None:
            try:
                self.memory_recorder.start()
            except Exception as err:  # a failing memory recorder costs the snapshot, not the window
                self.memory_recorder = None
                self.on_problem(
                    "memory-start",
                    f"vt_lightning: memory history could not start ({err}); "
                    "windows go on without CUDA memory snapshots.",
                )
        if self.step_hooks is not None:
            self.step_hooks.install()
        self._start_side_recorders()
        self._clock_start = sample_pair(self.python.clock_us)
        self._markers_start = emit_markers(self.python.clock_us, self.torch.make_range, "start")
        self._imports.install()  # before the tracer, so no thread imports unseen while it records
        self.python.start()
        self.active = True

    def check_rivals(self) -> None:
        """At every step boundary and at close: ``RivalProfiler`` (after yielding) if another profiler took
        over unseen, or ``UnsafeImport`` once a module VizTracer cannot take was imported."""
        if self.unsafe_import is not None:
            raise self.unsafe_import
        if self.yielded is None:
            try:
                self.torch.check()
            except RivalProfiler as err:
                self._yield_to(str(err))
            else:
                rival = self.python.rival()
                if rival is not None:
                    self._yield_to(rival)
        if self.yielded is not None:
            raise RivalProfiler(self.yielded)

    def _unsafe_import(self, unsafe: str) -> None:
        """From ``ImportGuard``, before the module's code exists: Python tracing stops for the window."""
        if self.unsafe_import is None:
            self.unsafe_import = UnsafeImport(unsafe, self.window.index)
        self.python.stop()

    def _yield_to(self, rival: str) -> None:
        """Another profiler starts: stop everything now (before it does), keep nothing."""
        if self.yielded is None:
            self.yielded = rival
        self.abort()

    def step_begin(self, step: int) -> None:
        self.check_rivals()
        if not self.active:
            self.activate()
        if self.torch.open_step != step:
            self.torch.step_end()
            self.torch.step_begin(step)
        self.steps.append(step)

    def step_end(self, step: int) -> None:
        """Close ``ProfilerStep#step`` and open the next at once: a step covers fetching its batch, as torch's."""
        self.check_rivals()
        self.torch.step_end()
        if step + 1 < self.window.end:
            self.torch.step_begin(step + 1)

    def begin_range(self, kind: str) -> None:
        """Open a ``[pl][profile]<kind>`` range (validation inside a training window); no-op outside steps."""
        if not self.active or self.closed or kind in self._open_ranges:
            return
        marker = self.torch.make_range(f"{PL_PROFILE_PREFIX}{kind}")
        marker.__enter__()
        self._open_ranges[kind] = (marker, time.perf_counter(), self.torch.open_step)

    def end_range(self, kind: str) -> None:
        opened = self._open_ranges.pop(kind, None)
        if opened is None:
            return
        marker, started, step = opened
        marker.__exit__(None, None, None)
        self._range_log.setdefault(kind, []).append(
            {"in_step": step, "duration_ms": round((time.perf_counter() - started) * 1e3, 3)}
        )

    def range_log(self, kind: str) -> list[dict[str, Any]]:
        """The step each ``kind`` range fell in and how long it took."""
        return list(self._range_log.get(kind, []))

    def close(
        self, spool: str | os.PathLike[str], destination: Destination, *, hold_dump: bool = False
    ) -> ClosedWindow | None:
        """Stop everything, leaving nothing installed whatever fails; the job that writes the window (None:
        nothing recorded). ``hold_dump``: VizTracer's buffer is written when the job is collected."""
        self.closed = True
        try:
            self.check_rivals()
            self.python.stop()
            self._imports.remove()
            thread_names = thread_names_now(self.python.new_thread_names)
            clock_end = sample_pair(self.python.clock_us) if self.active else None
            markers_end = emit_markers(self.python.clock_us, self.torch.make_range, "end") if self.active else []
            memory_snapshot = None
            extras = self._collect_side_recorders() if self.active else {}
            try:
                if self.memory_recorder is not None and self.active:
                    memory_snapshot = self.memory_recorder.snapshot()
            finally:
                try:
                    self._stop_side_tools()
                finally:
                    try:
                        self.torch.stop()
                    finally:
                        self._guard.remove()
            if not self.active or self._clock_start is None or clock_end is None:
                return None
            check_room = getattr(spool, "check_room", None)
            if check_room is not None:
                check_room(self.python.config.tracer_entries)
            stem = os.path.join(spool, f"w{self.window.index}-{os.getpid()}")
            python_raw = Path(f"{stem}.python.json")
            python_dump = self.python.dump(str(python_raw), hold=hold_dump)
        except BaseException:  # cleanup: nothing of the window stays installed; re-raised
            self.abort()
            raise
        job = WindowJob(
            run_dir=destination.run_dir,
            trace_name=destination.trace_name,
            torch_raw=Path(f"{stem}.torch.json"),
            python_raw=python_raw,
            clock_start=self._clock_start,
            clock_end=clock_end,
            import_base_ns=self.python.base_time_ns(),
            metadata=destination.metadata,
            gzip_level=destination.gzip_level,
            memory_name=destination.memory_name,
            memory_snapshot=memory_snapshot,
            thread_names=thread_names,
            clock_markers={"start": self._markers_start, "end": markers_end},
            python_filter=destination.python_filter,
            summary=destination.summary,
            job_id=destination.job_id,
            publish_to=destination.publish_to,
            extras=extras,
        )
        return ClosedWindow(job, self.torch.save, python_dump)

    def abort(self) -> None:
        """Stop every tracer and hook and drop what was recorded; raises only an interruption, at the end."""
        self.closed = True
        interrupted: BaseException | None = None
        for action in (
            self.python.stop,
            self._imports.remove,
            self._stop_side_tools,
            self.torch.stop,
            self._guard.remove,
            self.python.discard,
        ):
            try:
                action()
            except Exception:  # every step of the abort runs; a fault in one is not the user's
                pass
            except BaseException as err:  # an interruption waits for the other steps, then is re-raised
                interrupted = interrupted or err
        if interrupted is not None:
            raise interrupted

    def _side_call(self, recorder: SideRecorder, what: str) -> tuple[bool, Any]:
        """(whether it succeeded, what it returned) of ``recorder.<what>()``."""
        try:
            return True, getattr(recorder, what)()
        except Exception as err:  # a failing side recorder costs itself, never the window
            self.on_problem(
                f"side-{recorder.name}-{what}",
                f"vt_lightning: the {recorder.name} recorder failed to {what} ({type(err).__name__}: {err}); "
                "windows go on without it.",
            )
            return False, None

    def _start_side_recorders(self) -> None:
        for recorder in self.side:
            if self._side_call(recorder, "start")[0]:
                self._side_started.append(recorder)

    def _collect_side_recorders(self) -> dict[str, Any]:
        """Stop the side recorders, then take the data of those that started and stopped cleanly."""
        stopped = self._stop_side_recorders()
        extras: dict[str, Any] = {}
        for recorder in self.side:
            data = self._side_call(recorder, "collect")[1] if recorder in stopped else None
            if data is not None:
                extras[recorder.name] = data
        return extras

    def _stop_side_recorders(self) -> list[SideRecorder]:
        """Stop those started, in reverse; return those that stopped cleanly."""
        started, self._side_started = self._side_started, []
        return [recorder for recorder in reversed(started) if self._side_call(recorder, "stop")[0]]

    def _stop_side_tools(self) -> None:
        try:
            self._stop_side_recorders()
            if self.step_hooks is not None:
                self.step_hooks.remove()
        finally:
            if self.memory_recorder is not None:
                self.memory_recorder.stop()


@dataclass(frozen=True)
class ClosedWindow:
    """A closed window on its way to the writer: the job, and what ``collect`` must still do here."""

    job: WindowJob
    export_torch: Callable[[str], None] | None  # torch's exporter: its results live in this process
    python_dump: int | HeldDump | None  # VizTracer's dump: its child to reap, or still held

    def collect(self, *, in_process: bool = False) -> None:
        """Run torch's exporter and complete VizTracer's dump (on the writer thread, once; ``in_process``:
        training has stopped). A failure names the spool directory, not the output directory."""
        job = self.job
        try:
            try:
                if self.export_torch is not None:
                    self.export_torch(str(job.torch_raw))
            finally:
                dump = self.python_dump
                wait_for_dump(dump.write(in_process=in_process) if isinstance(dump, HeldDump) else dump)
        except (RivalProfiler, DumpChildFailed):  # not the spool's fault
            raise
        except Exception as err:  # any error of the dump's writing is the spool's, named there
            spool = job.torch_raw.parent
            raise SpoolError(
                getattr(err, "errno", None) or errno.EIO,
                f"the raw dumps could not be written to the spool directory {spool} ({type(err).__name__}: "
                f"{err}); free space there, or set `spool_dir` (or $TMPDIR) to a roomier disk",
            ) from err

    def drop(self) -> None:
        """The job is given up before ``collect``: a held dump's calls leave VizTracer's buffer."""
        if isinstance(self.python_dump, HeldDump):
            self.python_dump.drop()
