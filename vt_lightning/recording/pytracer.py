"""VizTracer's C tracer per window. On Python <= 3.11 VizTracer installs its hook when constructed and
everything runs ~3x slower until its first ``stop()``: it is built at the first window's start.
Running threads are hooked by ``thread_hooks``; the buffer leaves through ``viztracer_dump``."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from vt_lightning.recording import children, thread_keys
from vt_lightning.recording.rivals import own_calls
from vt_lightning.recording.thread_hooks import (
    NEEDS_THREAD_CLEANUP,
    c_api,
    current_thread_state,
    hook_existing_threads,
    monitoring_callbacks_of,
    remove_profile_hooks,
    stop_adopting,
)
from vt_lightning.recording.viztracer_dump import (
    HeldDump,
    flush_held,
    forget_held_dumps,
    in_dump_child,
    note_threads,
    write_dump,
)

_active: weakref.WeakSet[PythonTracer] = weakref.WeakSet()


def _stop_in_forked_child() -> None:
    """A forked child inherits a running tracer never saved, and held calls that are the parent's to write."""
    if in_dump_child():
        return  # the dump child needs the buffer as it is
    children.dump_children.clear()  # the parent's children: the parent reaps them
    for tracer in list(_active):
        tracer._stop_after_fork()
    forget_held_dumps()


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


def foreign_profiler() -> str | None:
    """Name the tool that already owns the profile hook, or None when it is free."""
    from viztracer import get_tracer

    if getattr(get_tracer(), "enable", False):
        return "VizTracer (e.g. the `viztracer` command)"
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


def interpreter_warning(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str | None:
    """A known interpreter bug that can crash VizTracer on this Python, or None: CPython 3.12.0-3.12.4
    (cpython #122029, viztracer #486)."""
    if (3, 12, 0) <= version[:3] < (3, 12, 5):
        shown = ".".join(str(part) for part in version[:3])
        return (
            f"vt_lightning: Python {shown} has a profiling bug (cpython #122029, fixed in 3.12.5) that can "
            "crash VizTracer (viztracer #486). If this job crashes during or after a window, use Python "
            "3.12.5 or newer, or 3.11 / 3.13."
        )
    return None


def _profiler_in_place() -> Any:
    """What holds this thread's profiling: the profile hook (<= 3.11), or sys.monitoring's tool (3.12+)."""
    if sys.version_info >= (3, 12):
        return sys.monitoring.get_tool(sys.monitoring.PROFILER_ID)
    return sys.getprofile()


def describe_profiler(found: Any) -> str:
    """``found`` (from ``_profiler_in_place``) as the warning names it."""
    if found is None:
        return "another tool (it removed VizTracer's hook)"
    if isinstance(found, str):
        return f"another tool using sys.monitoring ({found})"
    if type(found).__module__ in ("cProfile", "_lsprof"):
        return "cProfile"
    return f"another tool's sys.setprofile hook ({getattr(found, '__qualname__', type(found).__name__)})"


def _reinstall(hook: Any) -> None:
    """Give the profile hook back to the tool VizTracer's stop took it from (Python <= 3.11)."""
    try:
        import _lsprof

        if isinstance(hook, _lsprof.Profiler):
            _lsprof.Profiler.enable(hook)  # cProfile's C hook: only it can install itself again
        elif callable(hook):
            sys.setprofile(hook)
    except Exception:  # an audit hook may refuse it: ``stop`` must still take every hook of ours off
        pass


def _thread_names() -> list[str]:
    return [thread.name for thread in threading.enumerate()]


def _idle_viztracer_hook(hook: Any) -> bool:
    """VizTracer leaves its thread hook installed after it stops; a stopped tracer's is harmless."""
    owner = getattr(hook, "__self__", None)
    return type(owner).__module__.startswith("viztracer") and not getattr(owner, "enable", True)


# One VizTracer per configuration, for the process: deallocating one resets ``threading.setprofile``
# (threads started in another callback's window went untraced), and reuse spares its ring buffer.
_TRACERS: dict[tuple[int, float, bool], Any] = {}


def _release_tracers_at_exit() -> None:
    """Stop and drop every VizTracer before finalization tears it down after the modules it refers to (a
    compiled CUDA job exited with SIGSEGV there)."""
    for tracer in list(_TRACERS.values()):
        try:
            if getattr(tracer, "enable", False):
                tracer.stop()
            if sys.version_info >= (3, 12):
                monitoring_callbacks_of(tracer, release=True)
        except Exception:  # pragma: no cover - at exit: the other tracers and the keys are still released
            pass
    _TRACERS.clear()
    thread_keys.delete_keys()  # no thread-state destructor may run after finalization (thread_keys.py)


atexit.register(_release_tracers_at_exit)


class PythonTracer:
    """One VizTracer instance reused for every window of a run."""

    def __init__(self, config: PythonTracerConfig) -> None:
        self.config = config
        self._tracer: Any = None
        self._running = False
        self._pid = os.getpid()
        self._previous_thread_hook: Any = None
        self._lock = threading.Lock()
        self._own_profiler: Any = None
        self._hooked_threads: dict[int, int] = {}  # thread state -> its id, to unhook at stop()
        self._starter: dict[int, int] = {}  # the thread state that ran start() -> its id (<= 3.11)
        self._new_thread_names: dict[int, str] = {}  # native id -> name of threads started in a window
        self._files_paused = False  # pause_files in effect
        self._files_before: list[str] | None = None

    @property
    def running(self) -> bool:
        return self._running

    def installed_hooks(self) -> list[str]:
        """Every hook of ours in place, described; on 3.12+ sys.monitoring's tool is asked too."""
        found = []
        tracer = self._tracer
        if tracer is not None and sys.getprofile() is tracer:
            found.append("profile hook of this thread (sys.setprofile)")
        thread_hook = threading.getprofile()
        if thread_hook is not None and (
            thread_hook in (self._thread_hook, self._name_hook)
            or (tracer is not None and thread_hook == tracer.threadtracefunc)
        ):
            found.append("profile hook for new threads (threading.setprofile)")
        if self._hooked_threads:
            found.append(f"profile hook of {len(self._hooked_threads)} other thread(s)")
        if sys.version_info >= (3, 12):
            monitoring = sys.monitoring
            if monitoring.get_tool(monitoring.PROFILER_ID) == "viztracer":
                events = monitoring.get_events(monitoring.PROFILER_ID)
                found.append(f"sys.monitoring tool {monitoring.PROFILER_ID} 'viztracer' (events {events:#x})")
            callbacks = monitoring_callbacks_of(tracer, release=False)
            if callbacks:
                found.append(f"{callbacks} VizTracer callback(s) registered with sys.monitoring")
        return found

    def hooks_installed(self) -> bool:
        """Whether any hook of ours is in place (see ``installed_hooks``)."""
        return bool(self.installed_hooks())

    def clock_us(self) -> float:
        """VizTracer's own clock (µs), the one its events' ``ts`` use."""
        return self.ensure_tracer().getts()

    def base_time_ns(self) -> int:
        """Wall-clock time (ns) of VizTracer's clock zero."""
        return int(self.ensure_tracer().get_base_time())

    def start(self) -> None:
        tracer = self.ensure_tracer()
        flush_held(tracer)  # a held window's calls still in the buffer are written first
        self._new_thread_names = {}
        self._previous_thread_hook = threading.getprofile()
        if sys.version_info < (3, 12):
            threading.setprofile(self._thread_hook if NEEDS_THREAD_CLEANUP else tracer.threadtracefunc)
        else:
            # VizTracer names a thread started in the window "Dummy-N": its real name at its first call.
            threading.setprofile(self._name_hook)
        note_threads(tracer, _thread_names())  # those it meets from now on with the names they have
        with self._lock:
            if NEEDS_THREAD_CLEANUP:
                self._hooked_threads.update(hook_existing_threads(tracer))
                state = current_thread_state()
                self._starter = {state: c_api().PyThreadState_GetID(state)} if state else {}
            with own_calls():
                tracer.start()
            self._running = True
        _active.add(self)
        self._own_profiler = _profiler_in_place()

    def rival(self) -> str | None:
        """While running: the tool that took the profile hook (or the profiler id) since ``start``, or None."""
        if not self._running:
            return None
        now = _profiler_in_place()
        if now is self._own_profiler or now == self._own_profiler:
            return None
        return describe_profiler(now)

    @property
    def new_thread_names(self) -> dict[int, str]:
        """Native id -> name of the threads started during the last window (some may have ended)."""
        return dict(self._new_thread_names)

    def _note_thread_name(self) -> None:
        thread = threading.current_thread()
        if thread.native_id is not None:
            self._new_thread_names[thread.native_id] = thread.name

    def _name_hook(self, frame: Any, event: str, arg: Any) -> None:
        """Python 3.12+: first profile event of a thread started during the window; removes itself."""
        sys.setprofile(None)
        self._note_thread_name()

    def _thread_hook(self, frame: Any, event: str, arg: Any) -> Any:
        """Python <= 3.11: a new thread's first event handed to VizTracer's C hook; ``stop`` unhooks it."""
        with self._lock:
            if not self._running or self._tracer is None:
                sys.setprofile(None)  # the window closed before this thread ran any code
                return None
            state = current_thread_state()
            if state is not None:
                self._hooked_threads[state] = c_api().PyThreadState_GetID(state)
            self._note_thread_name()
            return self._tracer.threadtracefunc(frame, event, arg)

    def stop(self) -> None:
        """Remove every hook (events stay); another tool's profile hook over VizTracer's is put back."""
        foreign = None
        if sys.version_info < (3, 12) and self._tracer is not None:
            hook = sys.getprofile()
            foreign = hook if hook is not None and hook is not self._tracer else None
        # VizTracer's own ``enable`` knows of a start that an interruption cut short.
        held = self._tracer is not None and (self._running or bool(getattr(self._tracer, "enable", False)))
        try:
            with self._lock:
                self._running = False
                if held:
                    with own_calls():  # calls still open become complete events ending now
                        self._tracer.stop("flush_as_finish")
        finally:
            stop_adopting()
            if held:  # and those started meanwhile, alive or not
                note_threads(self._tracer, [*_thread_names(), *self._new_thread_names.values()])
            if foreign is not None and sys.getprofile() is not foreign:
                _reinstall(foreign)
            self._running = False
            _active.discard(self)
            self._release_thread_hook()
            hooked, self._hooked_threads = self._hooked_threads, {}
            starter, self._starter = self._starter, {}
            if starter and current_thread_state() not in starter:
                hooked.update(starter)  # stopped from another thread (``ImportGuard``)
            remove_profile_hooks(hooked)
            if held and sys.version_info >= (3, 12):
                # Only after our own session: releasing those of the user's VizTracer stops it.
                monitoring_callbacks_of(self._tracer, release=True)

    def _release_thread_hook(self) -> None:
        if self._tracer is not None and threading.getprofile() in (
            self._tracer.threadtracefunc,
            self._thread_hook,
            self._name_hook,
        ):
            threading.setprofile(self._previous_thread_hook)
        self._previous_thread_hook = None

    def pause_files(self, prefixes: tuple[str, ...]) -> bool:
        """Record no call into files under ``prefixes``, nor below one, until ``resume_files``; False where
        ``include_files`` is set. Not VizTracer's ``pause()``: resumed from another frame, it stops recording."""
        tracer = self.ensure_tracer()
        if tracer.include_files is not None:
            return False
        if not self._files_paused:
            self._files_before = tracer.exclude_files
            self._files_paused = True
        tracer.exclude_files = [*(self._files_before or ()), *prefixes]
        return True

    def resume_files(self) -> None:
        """Undo ``pause_files`` (a no-op when nothing is paused)."""
        if self._files_paused and self._tracer is not None:
            self._tracer.exclude_files = self._files_before
        self._files_paused = False
        self._files_before = None

    def dump(self, path: str, *, hold: bool = False) -> int | HeldDump | None:
        """Write the buffer as JSON to ``path`` and empty it: by a forked child where safe (its pid: wait for it
        before reading), else here (None); with ``hold`` the returned ``HeldDump`` writes it later."""
        if hold and self._tracer is not None:
            return HeldDump(self._tracer, self.config.tracer_entries, path)
        return write_dump(self._tracer, self.config.tracer_entries, path, fork=True)

    def discard(self) -> None:
        """Drop whatever the buffer holds (an aborted window), a held window's calls written first."""
        if self._tracer is not None:
            flush_held(self._tracer)
            self._tracer.clear()

    def ensure_tracer(self) -> Any:
        """This configuration's one VizTracer, built on first use and kept for the process."""
        if self._tracer is None:
            c = self.config  # include/exclude/max_stack_depth are applied after recording: not in the key
            key = (c.tracer_entries, c.min_duration, c.ignore_c_function)
            self._tracer = _TRACERS.get(key)
            if self._tracer is None:
                self._tracer = _TRACERS[key] = thread_keys.build_noting_key(self._build_tracer)
        return self._tracer

    def _build_tracer(self) -> Any:
        from viztracer import VizTracer
        from viztracer.snaptrace import Tracer

        c = self.config
        # No include_files / exclude_files / max_stack_depth: VizTracer would drop the whole subtree
        # under a filtered frame, the user's code with it (``analysis/filters.py`` applies them).
        with own_calls():  # the rival guard lets our own VizTracer through
            tracer = VizTracer(
                tracer_entries=c.tracer_entries,
                verbose=0,
                ignore_c_function=c.ignore_c_function,
                min_duration=c.min_duration,
                register_global=False,
            )
        # Construction hooks on Python <= 3.11: off until start(). Not on 3.12+, where it hooks
        # nothing and stop() would free sys.monitoring's tool 2 even when another tool holds it.
        if sys.version_info < (3, 12):
            Tracer.stop(tracer, None)
        if threading.getprofile() == tracer.threadtracefunc:
            threading.setprofile(None)  # VizTracer sets it at construction and never takes it back
        return tracer

    def _stop_after_fork(self) -> None:
        if os.getpid() != self._pid and self._tracer is not None:
            try:
                self._tracer.stop()
                self._tracer.clear()
            finally:
                self._running = False
                self._hooked_threads = {}  # the child has only the forking thread
                self._lock = threading.Lock()  # another thread may have held it at fork time
                self._release_thread_hook()
