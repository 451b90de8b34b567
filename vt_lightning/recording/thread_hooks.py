"""The thread plumbing of ``pytracer``: VizTracer hooks only the thread that starts it and later ones,
so ``start`` puts a one-shot trampoline on every other thread state (Python <= 3.11, through
CPython's C API, as 3.12's ``threading.setprofile_all_threads()`` does); ``stop`` takes every hook
off again (a hook left makes its thread several times slower for life), and VizTracer's leftover
``sys.monitoring`` callbacks go (3.12+)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from vt_lightning.analysis.usercode import is_own_file
from vt_lightning.constants import THREAD_PREFIX

NEEDS_THREAD_CLEANUP = sys.version_info < (3, 12) and sys.implementation.name == "cpython"
_capi: Any = None
_PROFILE_EVENTS = {0: "call", 3: "return", 4: "c_call", 5: "c_exception", 6: "c_return"}
_adopting: Any = None  # the VizTracer whose window is open, for the trampoline of pre-existing threads
_trampoline: Any = None  # the ctypes function pointer; created once, never freed (threads may hold it)


def _trampoline_marker() -> None:
    """The trampoline's profile object, so that ``sys.getprofile()`` in a thread shows it."""


def c_api() -> Any:
    """Our own handle on the C API (types set here leave ``ctypes.pythonapi`` as it is)."""
    global _capi
    if _capi is None:
        import ctypes

        api = ctypes.PyDLL(None)  # PyDLL: calls keep the GIL
        ptr = ctypes.c_void_p
        for name, restype, argtypes in (
            ("PyThreadState_Get", ptr, []),
            ("PyInterpreterState_Get", ptr, []),
            ("PyInterpreterState_ThreadHead", ptr, [ptr]),
            ("PyThreadState_Next", ptr, [ptr]),
            ("PyThreadState_GetID", ctypes.c_uint64, [ptr]),
            ("PyThreadState_GetFrame", ptr, [ptr]),
            ("Py_DecRef", None, [ptr]),
            ("_PyEval_SetProfile", ctypes.c_int, [ptr, ptr, ptr]),
        ):
            function = getattr(api, name)
            function.restype, function.argtypes = restype, argtypes
        _capi = api
    return _capi


def current_thread_state() -> int | None:
    try:
        return c_api().PyThreadState_Get()
    except Exception:  # pragma: no cover - not CPython, or symbols missing: leave the hook
        return None


def _live_thread_states(api: Any) -> list[int]:
    states = []
    state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while state:
        states.append(state)
        state = api.PyThreadState_Next(state)
    return states


def remove_profile_hooks(thread_states: dict[int, int]) -> None:
    """Remove the profile hook of the given threads (state pointer -> state id), holding the GIL."""
    if not thread_states:
        return
    try:
        api = c_api()
        for state in _live_thread_states(api):
            if state in thread_states and api.PyThreadState_GetID(state) == thread_states[state]:
                api._PyEval_SetProfile(state, None, None)
    except Exception:  # pragma: no cover - best effort: never break stop() over this
        pass


def monitoring_callbacks_of(tracer: Any, release: bool) -> int:
    """Count (and with ``release``, unregister) ``tracer``'s ``sys.monitoring`` callbacks: ``free_tool_id``
    leaves them registered, keeping the tracer alive into finalization. A slot not ours is put back."""
    if sys.version_info < (3, 12):  # no sys.monitoring before 3.12 (and mypy checks for 3.10)
        return 0
    monitoring = sys.monitoring
    tool = monitoring.PROFILER_ID
    if tracer is None or monitoring.get_tool(tool) not in (None, "viztracer"):
        return 0  # another tool holds the id: the callbacks are its own
    found = 0
    single_events = {v for k, v in vars(monitoring.events).items() if k.isupper() and v and v & (v - 1) == 0}
    for event in sorted(single_events):  # the slots a tool can hold a callback in
        previous = monitoring.register_callback(tool, event, None)
        if previous is not None and getattr(previous, "__self__", None) is tracer:
            found += 1
            if release:
                continue
        if previous is not None:
            monitoring.register_callback(tool, event, previous)
    return found


def _package_frames() -> list[Any]:
    """The current frames of our own threads (``vt_lightning-...``)."""
    ours = {t.ident for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)}
    return [frame for ident, frame in sys._current_frames().items() if ident in ours]


def _runs_package_code(api: Any, state: int, our_frames: list[Any]) -> bool:
    """True for our own threads: the writer would drop their frames anyway."""
    import ctypes

    pointer = api.PyThreadState_GetFrame(state)
    if not pointer:
        return False
    try:
        frame = ctypes.cast(pointer, ctypes.py_object).value
    finally:
        api.Py_DecRef(pointer)
    if any(frame is ours for ours in our_frames):
        return True
    while frame is not None:
        if is_own_file(frame.f_code.co_filename):
            return True
        frame = frame.f_back
    return False


def _make_trampoline() -> Any:
    global _trampoline
    if _trampoline is None:
        import ctypes

        prototype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)

        def adopt(_obj: int, frame: int, what: int, arg: int) -> int:
            """A pre-existing thread's first event: VizTracer's ``threadtracefunc`` hooks it and records it."""
            tracer = _adopting
            try:
                if tracer is not None and what in _PROFILE_EVENTS and frame:
                    tracer.threadtracefunc(
                        ctypes.cast(frame, ctypes.py_object).value,
                        _PROFILE_EVENTS[what],
                        ctypes.cast(arg, ctypes.py_object).value if arg else None,
                    )
                    return 0
            except BaseException:  # never raise into another thread's code
                pass
            api = c_api()
            api._PyEval_SetProfile(api.PyThreadState_Get(), None, None)
            return 0

        _trampoline = prototype(adopt)
    return _trampoline


def hook_existing_threads(tracer: Any) -> dict[int, int]:
    """Put the trampoline on every thread but this one and ours; returns {state: state id}."""
    import ctypes

    global _adopting
    _adopting = tracer
    hooked: dict[int, int] = {}
    try:
        api = c_api()
        function = ctypes.cast(_make_trampoline(), ctypes.c_void_p)
        marker = ctypes.c_void_p(id(_trampoline_marker))  # _PyEval_SetProfile takes its own reference
        current = api.PyThreadState_Get()
        our_frames = _package_frames()
        for state in _live_thread_states(api):
            if state == current or _runs_package_code(api, state, our_frames):
                continue
            if api._PyEval_SetProfile(state, function, marker) == 0:
                hooked[state] = api.PyThreadState_GetID(state)
    except Exception:  # pragma: no cover - best effort: the window goes on, those threads untraced
        pass
    return hooked


def stop_adopting() -> None:
    """The window closed: the trampoline of a thread that has not run since hands over to no one."""
    global _adopting
    _adopting = None
