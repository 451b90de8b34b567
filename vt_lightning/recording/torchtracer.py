"""torch.profiler for a window: prepare (warmup), start, per-step ranges, stop, save. One long-lived
``torch.profiler.profile`` per process and configuration (``shared_profile``): its constructor leaks
host memory each time. Driven by hand, not by torch's schedule, so window bounds are batch bounds.
Each window keeps its own session's results (taken at ``stop``): the next ``prepare`` never touches
one whose export, on the writer thread (``ClosedWindow.collect``), is pending."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._profiler import _RecordFunctionFast
from torch.profiler import ProfilerActivity

from vt_lightning.constants import KINETO_LOG_LEVEL, STEP_PREFIX
from vt_lightning.recording.native_threads import collectives_on_gloo, wait_for_native_threads
from vt_lightning.recording.rivals import RivalProfiler, own_calls

_recording: weakref.WeakSet[TorchTracer] = weakref.WeakSet()
_kineto_started = False  # a window has started torch's profiler in this process (kineto is up)
_PROFILES: dict[tuple[TorchTracerConfig, bool], Any] = {}  # see ``shared_profile``
# Kineto prints two lines per window on stderr (its level 5) unless KINETO_LOG_LEVEL, read once
# when kineto starts, is above 5.
QUIET_KINETO_LEVEL = "6"


def _disable_in_forked_child() -> None:
    """A child forked while a window records would record its ops for life, never saved."""
    _PROFILES.clear()  # the parent's sessions: a child never stops or exports them
    if _kineto_started:
        _skip_static_destructors_at_exit()
    if not _recording:
        return
    _recording.clear()
    try:
        if torch._C._autograd._profiler_enabled() and not torch.cuda.is_initialized():
            torch._C._autograd._disable_profiler()  # the child's copy of the events: dropped
        torch.autograd.profiler._is_profiler_enabled = False
    except Exception:  # at a fork, in the child: the user's fork must never fail for our sake
        pass


def _skip_static_destructors_at_exit() -> None:
    """Kineto's ConfigLoader (torch 2.13) hangs a forked child's ``exit()`` in its static destructor: there
    ``_exit`` with the same status runs once Python has finished, as multiprocessing's children do."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)  # called as _exit(status, arg)
    except (AttributeError, OSError):  # not glibc
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_in_forked_child)


@dataclass(frozen=True)
class TorchTracerConfig:
    record_shapes: bool = False
    profile_memory: bool = True
    with_flops: bool = False


def torch_profiler_active() -> bool:
    """True when some torch profiler (the user's, Lightning's, ours) is recording in this process."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


def profiler_range(name: str) -> Any:
    """A torch.profiler range, not yet entered: ``_RecordFunctionFast`` (~0.7 µs, not ~6 µs)."""
    return _RecordFunctionFast(name)


def experimental_config(all_threads: bool) -> Any:
    """``trace_only`` where this torch has it; ``all_threads`` only without ``profile_memory`` (torch
    2.13 then drops the ``[memory]`` events)."""
    from torch._C._profiler import _ExperimentalConfig

    wanted: dict[str, Any] = {"trace_only": True, "profile_all_threads": all_threads}
    for drop in ((), ("trace_only",), ("trace_only", "profile_all_threads")):
        options = {k: v for k, v in wanted.items() if k not in drop}
        try:
            return _ExperimentalConfig(**options)
        except TypeError:  # an older torch without the option
            continue
    return None  # pragma: no cover


def shared_profile(config: TorchTracerConfig, cuda_available: bool) -> Any:
    """The process's one ``torch.profiler.profile`` for ``config`` (its constructor leaks; reuse does not)."""
    key = (config, cuda_available)
    profile = _PROFILES.get(key)
    if profile is None:
        profile = _PROFILES[key] = torch.profiler.profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda_available else [ProfilerActivity.CPU],
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_flops=config.with_flops,
            experimental_config=experimental_config(all_threads=not config.profile_memory),
        )
    return profile


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Kineto's per-window lines off the console unless the user chose a level; removed after its read."""
    ours = not _kineto_started and KINETO_LOG_LEVEL not in os.environ
    if ours:
        os.environ[KINETO_LOG_LEVEL] = QUIET_KINETO_LEVEL
    try:
        yield
    finally:
        if ours:
            os.environ.pop(KINETO_LOG_LEVEL, None)


class TorchTracer:
    """torch.profiler for one window (a session of the process's shared profile)."""

    def __init__(self, config: TorchTracerConfig, cuda_available: bool | None = None) -> None:
        self._profile = shared_profile(config, torch.cuda.is_available() if cuda_available is None else cuda_available)
        self._results: Any = None  # this window's session (torch.autograd.profiler.profile), from stop on
        self._step: Any = None
        self.open_step: int | None = None
        self.prepared = False
        self.started = False
        self.stopped = False
        self._starting = False
        self.lost = False  # another tool stopped our session: never stop or export it again
        self._session_closed = False

    def prepare(self) -> None:
        """Warmup: the profiler runs but torch discards what it sees."""
        global _kineto_started
        self._check_free("prepare")
        with own_calls(), _quiet_kineto():
            _kineto_started = True
            self._profile.profiler = None  # a fresh session (the last window's is its own, see stop)
            self._profile.prepare_trace()
        self.prepared = True

    def start(self) -> None:
        if not self.prepared:
            self.prepare()
        self._check_free("start")
        _recording.add(self)
        self._starting = True  # from here on a stop must close our (maybe half-started) session
        with own_calls():
            self._profile.start_trace()
        self.started = True

    def _check_free(self, when: str) -> None:
        """Before we start: no other torch profiler may be recording (two at once crash torch)."""
        if torch_profiler_active():
            raise RivalProfiler(f"a torch profiler that is already recording (found at {when})")

    def check(self) -> None:
        """At a step boundary: ours must still be recording (stopping one another tool stopped crashed)."""
        if self.started and not self.stopped and not torch_profiler_active():
            self.lost = True
            raise RivalProfiler("another tool stopped the window's torch profiler")

    def step_begin(self, batch_idx: int) -> None:
        self.check()
        step = torch.autograd.profiler.record_function(f"{STEP_PREFIX}{batch_idx}")
        step.__enter__()
        self._step = step
        self.open_step = batch_idx

    def step_end(self) -> None:
        self.open_step = None
        if self._step is not None:
            step, self._step = self._step, None
            step.__exit__(None, None, None)

    make_range = staticmethod(profiler_range)

    def stop(self) -> None:
        """Stop recording, in any state, any number of times; torch is left not recording."""
        if self.stopped:
            return
        try:
            self.step_end()
        finally:
            try:
                if self.prepared and not self._session_closed:
                    self._stop_session()
            finally:
                if self._session_closed or not self.prepared:  # else a retry must close it
                    self.stopped = True
                    _recording.discard(self)

    def _stop_session(self) -> None:
        active = torch_profiler_active()
        if (self.started and not active) or (not self._starting and active):
            # Another tool stopped ours (stopping or exporting it again crashes torch), or, ended in
            # warmup, another profiler runs now (starting ours to close it would clash).
            self.lost = self._session_closed = True
            return
        try:
            with own_calls():
                if not self._starting:  # ended during warmup: kineto must be started before it stops
                    self._profile.start_trace()
                    self.started = True
                elif collectives_on_gloo():
                    # A gloo worker may still be ending a collective's range in this session.
                    wait_for_native_threads()
                self._profile.stop_trace()
                # This window's results, for its export; the shared profile lets go of them.
                self._results, self._profile.profiler = self._profile.profiler, None
        except BaseException:  # cleanup: an interrupted stop leaves no profiler recording; re-raised
            self.lost = True
            _force_disable()
            raise
        finally:
            self._session_closed = True

    def save(self, path: str) -> None:
        """Write torch's own chrome trace (C++ exporter) to ``path``."""
        if self.lost or not self.stopped:
            raise RivalProfiler("the window's torch profiler was stopped by another tool; nothing to export")
        results, self._results = self._results, None  # exported once; its memory goes with it
        if results is None:
            raise RivalProfiler("the window's torch profiler recorded no session; nothing to export")
        results.export_chrome_trace(path)


def _force_disable() -> None:
    """Last resort after an interrupted stop: leave no torch profiler recording in this process."""
    try:
        if torch._C._autograd._profiler_enabled():
            torch._C._autograd._disable_profiler()
    except Exception:  # best effort, inside the interrupted stop's cleanup: its own error goes on
        pass
    torch.autograd.profiler._is_profiler_enabled = False
