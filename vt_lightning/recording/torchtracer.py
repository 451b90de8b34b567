"""torch.profiler behind a small interface: prepare (warmup), start, per-step markers, stop, save.

One long-lived ``torch.profiler.profile`` per process and configuration (``shared_profile``), driven
by hand, window after window, instead of by torch's schedule so that window bounds are
training-batch bounds and ``ProfilerStep#<n>`` carries the global batch index. A fresh ``profile()``
per window grew the training process by 7-12 KiB per window (torch 2.13, CPU; what ``profile()``'s
constructor registers is never freed), one reused profile by 0.0 (docs/architecture.md, "Long
runs"). Each window keeps the results object of its own session (captured at ``stop``), so the next
window's ``prepare`` never touches a window whose export is still pending. ``stop()`` is cheap
(torch post-processes lazily); the trace JSON is written by torch's C++ exporter later, on the
writer thread (``ClosedWindow.collect``).
"""

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
from torch.profiler import ProfilerActivity

from vt_lightning.constants import KINETO_LOG_LEVEL, STEP_PREFIX
from vt_lightning.recording.native_threads import collectives_on_gloo, wait_for_native_threads
from vt_lightning.recording.rivals import RivalProfiler, own_calls

_recording: weakref.WeakSet[TorchTracer] = weakref.WeakSet()
_kineto_started = False  # a window has started torch's profiler in this process (kineto is up)
_PROFILES: dict[tuple[TorchTracerConfig, bool], Any] = {}  # see ``shared_profile``
# Kineto prints two lines per window on stderr (``profiler_start`` / ``profiler_stop``, at its USDT
# level 5, above ERROR) unless KINETO_LOG_LEVEL, read once when kineto starts, is above 5.
QUIET_KINETO_LEVEL = "6"


def _disable_in_forked_child() -> None:
    """A child forked while a window records (a DataLoader worker) inherits torch's profiler
    state and would record its ops in memory for its whole life, never saved."""
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
    """Kineto's ConfigLoader (torch <= 2.13 at least) waits in its static destructor on a condition
    variable its polling thread sleeps on. A forked child has no such thread, so a child that leaves
    through ``exit()`` (``sys.exit``, the end of its script) hangs there forever, once the parent
    has run torch.profiler. In such a child, ``_exit`` with the same status runs after Python has
    finished (``on_exit`` handlers run last-registered first, before that destructor), as
    multiprocessing's children always do. glibc only; elsewhere nothing changes."""
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
    """True when some torch profiler (the user's, Lightning's) is already recording in this process."""
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except AttributeError:  # pragma: no cover - older torch
        return bool(torch._C._autograd._profiler_enabled())


def activities(cuda_available: bool | None = None) -> list[ProfilerActivity]:
    """CPU always, CUDA when this process can use it."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU]
    if cuda_available:
        acts.append(ProfilerActivity.CUDA)
    return acts


def experimental_config(all_threads: bool) -> Any:
    """Skip building Python event objects at stop (``trace_only``) where this torch supports it.

    ``all_threads`` records ops issued by every thread (Python threads do not inherit torch's
    thread-local profiler state), but torch (2.13) then drops the ``[memory]`` events the Memory
    view and snapshots need, so it is used only when ``profile_memory`` is off.
    """
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
    """The process's one ``torch.profiler.profile`` for ``config``, made at its first window and
    reused by every later one (its constructor leaks; its prepare/start/stop do not)."""
    key = (config, cuda_available)
    profile = _PROFILES.get(key)
    if profile is None:
        profile = _PROFILES[key] = torch.profiler.profile(
            activities=activities(cuda_available),
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_flops=config.with_flops,
            experimental_config=experimental_config(all_threads=not config.profile_memory),
        )
    return profile


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Around kineto's start in this process: its per-window lines stay off the console unless the
    user chose a level. Set only for kineto's one read, then removed, so no child inherits it."""
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
        """At a step boundary: ours must still be the one recording; another tool may have
        stopped it (then stopping it again, or exporting it, is what crashed)."""
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

    @staticmethod
    def make_range(name: str) -> Any:
        """A torch range named ``name``, not yet entered (clock markers; see ``clock.emit_markers``)."""
        try:
            from torch._C._profiler import _RecordFunctionFast
        except ImportError:  # pragma: no cover - torch < 2.2
            return torch.autograd.profiler.record_function(name)
        return _RecordFunctionFast(name)

    def stop(self) -> None:
        """Stop recording; safe to call in any state, more than once, and after an interruption
        anywhere in it (each part runs even if an earlier one raised; torch is left not recording)."""
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
        if self.started and not torch_profiler_active():
            self.lost = True  # another tool stopped it: stopping (or exporting) again crashes torch
            self._session_closed = True
            return
        if not self._starting and torch_profiler_active():
            self.lost = True  # another profiler runs now: starting ours to close it would clash
            self._session_closed = True
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
                # This window's results, for its export on the writer thread; the shared profile
                # lets go of them, so the next window's prepare starts afresh.
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
    except Exception:  # last resort after an interrupted stop: best effort
        pass
    try:
        torch.autograd.profiler._is_profiler_enabled = False
    except Exception:  # last resort after an interrupted stop: best effort
        pass
