"""Other profilers in this process: a window yields to them, whenever they start.

Two torch profilers at once crashed the process (a segfault when the window stopped, 6 of 6 runs
with a user's ``torch.profiler.profile()`` around a step of a window), and on Python 3.12+ a
``cProfile`` started mid-window raised ``ValueError: Another profiling tool is already active``
(VizTracer holds ``sys.monitoring``'s profiler id) and stopped training. So while a window is live
(from its warmup to its close) ``RivalGuard`` intercepts the entry points another profiler starts
through, and lets the window stop cleanly *before* the other tool starts:

- ``torch.autograd.profiler.profile._prepare_trace`` / ``_start_trace`` (every torch profiler,
  Lightning's ``PyTorchProfiler`` included, starts through them);
- ``cProfile.Profile.enable`` (``cProfile.run``, ``with cProfile.Profile()``, ``profile.enable()``);
- ``sys.monitoring.use_tool_id`` for the profiler id (3.12+: any tool, cProfile's C code included).

A tool that starts some other way (``sys.setprofile``, a C extension) is caught at the window's next
step boundary (``ProfilingWindow.check_rivals``), which then yields too. The patches exist only
while a window is live; our own calls into torch and VizTracer run inside ``own_calls()``.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RivalProfiler(RuntimeError):
    """Another profiler started (or holds what a window needs): the window yields to it."""


_state = threading.local()


def _owned() -> bool:
    return getattr(_state, "own", 0) > 0


@contextmanager
def own_calls() -> Iterator[None]:
    """Our own calls into torch.profiler / VizTracer: the guard lets them through."""
    _state.own = getattr(_state, "own", 0) + 1
    try:
        yield
    finally:
        _state.own -= 1


_installed: weakref.WeakSet[RivalGuard] = weakref.WeakSet()


def _remove_in_forked_child() -> None:
    """A DataLoader worker forked during a window has no window: its profilers start freely."""
    for guard in list(_installed):
        guard.remove()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_remove_in_forked_child)


class RivalGuard:
    """Patches installed for one live window; ``on_rival(name)`` makes the window yield."""

    def __init__(self, on_rival: Callable[[str], None]) -> None:
        self.on_rival = on_rival
        self.installed = False
        self._restore: list[Callable[[], None]] = []

    def _rival(self, name: str) -> None:
        if self.installed and not _owned():
            self.remove()  # first: the other tool's own calls must go straight through
            try:
                self.on_rival(name)
            except Exception:  # the other tool's call goes on whatever our callback does
                pass

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        _installed.add(self)
        try:
            self._patch_torch()
            self._patch_cprofile()
            self._patch_viztracer()
            if sys.version_info >= (3, 12):
                self._patch_monitoring()
        except BaseException:  # cleanup: a half install is removed; re-raised
            self.remove()
            raise

    def remove(self) -> None:
        """Undo every patch (each one only if it is still ours); never raises."""
        self.installed = False
        _installed.discard(self)
        restore, self._restore = self._restore, []
        for undo in reversed(restore):
            try:
                undo()
            except Exception:  # best-effort undo: every other patch is still undone
                pass

    # ------------------------------------------------------------------ the patches
    def _patch_method(self, owner: Any, name: str, label: str) -> None:
        had_own = name in owner.__dict__
        original = owner.__dict__[name] if had_own else getattr(owner, name)
        guard = self

        def intercepted(*args: Any, **kwargs: Any) -> Any:
            guard._rival(label)
            return original(*args, **kwargs)

        intercepted.__wrapped__ = original  # type: ignore[attr-defined]
        intercepted._vt_lightning_guard = True  # type: ignore[attr-defined]

        def undo() -> None:
            if owner.__dict__.get(name) is intercepted:
                if had_own:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)

        setattr(owner, name, intercepted)
        self._restore.append(undo)

    def _patch_torch(self) -> None:
        try:
            from torch.autograd.profiler import profile
        except ImportError:  # pragma: no cover - torch is a dependency
            return
        self._patch_method(profile, "_prepare_trace", "a torch profiler")
        self._patch_method(profile, "_start_trace", "a torch profiler")

    def _patch_viztracer(self) -> None:
        """The user's own VizTracer: its construction installs hooks on Python <= 3.11 and its
        start() takes the profile hook (or sys.monitoring's profiler id) that ours holds."""
        try:
            from viztracer import VizTracer
        except ImportError:  # pragma: no cover - viztracer is a dependency
            return
        self._patch_method(VizTracer, "__init__", "VizTracer")
        self._patch_method(VizTracer, "start", "VizTracer")

    def _patch_cprofile(self) -> None:
        import cProfile

        self._patch_method(cProfile.Profile, "enable", "cProfile")

    def _patch_monitoring(self) -> None:  # pragma: no cover - Python 3.12+
        if sys.version_info < (3, 12):
            return
        monitoring = sys.monitoring
        original = monitoring.use_tool_id
        guard = self

        def use_tool_id(tool_id: int, name: str) -> None:
            if tool_id == monitoring.PROFILER_ID:
                guard._rival(f"{name} (sys.monitoring)")
            return original(tool_id, name)

        use_tool_id.__dict__["_vt_lightning_guard"] = True  # a function attribute, typed or not

        def undo() -> None:
            if monitoring.use_tool_id is use_tool_id:
                monitoring.use_tool_id = original

        monitoring.use_tool_id = use_tool_id
        self._restore.append(undo)


def guard_installed() -> bool:
    """Whether any patch of ours is in place (tests assert none is left behind)."""
    import cProfile

    from torch.autograd.profiler import profile
    from viztracer import VizTracer

    patched = [
        profile.__dict__.get("_prepare_trace"),
        profile.__dict__.get("_start_trace"),
        cProfile.Profile.__dict__.get("enable"),
        VizTracer.__dict__.get("__init__"),
        VizTracer.__dict__.get("start"),
    ]
    if sys.version_info >= (3, 12):
        patched.append(sys.monitoring.use_tool_id)
    return any(getattr(f, "_vt_lightning_guard", False) for f in patched)
