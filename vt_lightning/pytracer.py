"""VizTracer's C tracer behind a small interface: start/stop per window, raw events out.

VizTracer installs its profile hook when it is *constructed* (Python <= 3.11) and keeps it until the
first ``stop()``, so the tracer is built only at the first window's start, right before ``start()``;
between windows it exists with no hook installed. Events leave the ring buffer through VizTracer's C
``dump`` (a tenth of the cost of ``load()`` into Python objects): the training thread pays only that.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

_active: weakref.WeakSet[PythonTracer] = weakref.WeakSet()


def _stop_in_forked_child() -> None:
    """A forked child (DataLoader worker) inherits a running tracer that would never be saved."""
    for tracer in list(_active):
        tracer._stop_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_stop_in_forked_child)


@dataclass(frozen=True)
class PythonTracerConfig:
    """The VizTracer options a user can set (see ``VizTraceCallback``)."""

    tracer_entries: int = 1_000_000
    max_stack_depth: int = -1
    min_duration: float = 0.0
    include_files: tuple[str, ...] | None = None
    exclude_files: tuple[str, ...] | None = None
    ignore_c_function: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def foreign_profiler() -> str | None:
    """Name the tool that already owns the profile hook, or None when it is free."""
    try:
        from viztracer import get_tracer

        if get_tracer() is not None and getattr(get_tracer(), "enable", False):
            return "VizTracer (e.g. the `viztracer` command)"
    except ImportError:  # pragma: no cover - viztracer is a dependency
        pass
    hook = sys.getprofile()
    if hook is not None:
        return f"another tool's sys.setprofile hook ({type(hook).__name__})"
    thread_hook = threading.getprofile()
    if thread_hook is not None and not _idle_viztracer_hook(thread_hook):
        return f"another tool's threading.setprofile hook ({type(thread_hook).__name__})"
    if sys.version_info >= (3, 12):
        tool = sys.monitoring.get_tool(sys.monitoring.PROFILER_ID)
        if tool is not None:
            return f"another tool using sys.monitoring ({tool})"
    return None


def _idle_viztracer_hook(hook: Any) -> bool:
    """VizTracer leaves its thread hook installed after it stops; a stopped tracer's is harmless."""
    owner = getattr(hook, "__self__", None)
    return type(owner).__module__.startswith("viztracer") and not getattr(owner, "enable", True)


class PythonTracer:
    """One VizTracer instance reused for every window of a run."""

    def __init__(self, config: PythonTracerConfig) -> None:
        self.config = config
        self._tracer: Any = None
        self._running = False
        self._pid = os.getpid()
        self._previous_thread_hook: Any = None

    @property
    def running(self) -> bool:
        return self._running

    def clock_us(self) -> float:
        """VizTracer's own clock (µs), the one its events' ``ts`` use."""
        return self._ensure_tracer().getts()

    def base_time_ns(self) -> int:
        """Wall-clock time (ns) of VizTracer's clock zero, fixed once at import."""
        return int(self._ensure_tracer().get_base_time())

    def start(self) -> None:
        tracer = self._ensure_tracer()
        if sys.version_info < (3, 12):
            # Threads started during the window are traced too (VizTracer's own behaviour).
            self._previous_thread_hook = threading.getprofile()
            threading.setprofile(tracer.threadtracefunc)
        tracer.start()
        self._running = True
        _active.add(self)

    def stop(self) -> None:
        """Remove every hook; events stay in the ring buffer."""
        try:
            if self._tracer is not None and self._running:
                self._tracer.stop()
        finally:
            self._running = False
            _active.discard(self)
            self._release_thread_hook()

    def _release_thread_hook(self) -> None:
        # VizTracer sets threading.setprofile at construction and never takes it back.
        if self._tracer is not None and threading.getprofile() == self._tracer.threadtracefunc:
            threading.setprofile(self._previous_thread_hook)
        self._previous_thread_hook = None

    def dump(self, path: str) -> None:
        """Write the ring buffer as JSON to ``path`` and empty it (C code, no Python objects)."""
        self._tracer.dump(path)

    def discard(self) -> None:
        """Drop whatever the buffer holds (an aborted window)."""
        if self._tracer is not None:
            self._tracer.clear()

    def _ensure_tracer(self) -> Any:
        if self._tracer is None:
            from viztracer import VizTracer
            from viztracer.snaptrace import Tracer

            c = self.config
            self._tracer = VizTracer(
                tracer_entries=c.tracer_entries,
                verbose=0,
                max_stack_depth=c.max_stack_depth,
                include_files=list(c.include_files) if c.include_files is not None else None,
                exclude_files=list(c.exclude_files) if c.exclude_files is not None else None,
                ignore_c_function=c.ignore_c_function,
                min_duration=c.min_duration,
                register_global=False,
                **c.extra,
            )
            # Construction installs the hooks on Python <= 3.11; take them off until start().
            Tracer.stop(self._tracer, None)
            self._release_thread_hook()
        return self._tracer

    def _stop_after_fork(self) -> None:
        if os.getpid() != self._pid and self._tracer is not None:
            try:
                self._tracer.stop()
                self._tracer.clear()
            finally:
                self._running = False
                self._release_thread_hook()
