"""Other profilers in this process: a window yields to them, whenever they start (two torch profilers
at once crash the process; a ``cProfile`` started mid-window raises on Python 3.12+). While a window
is live, ``RivalGuard`` intercepts the entry points another profiler starts through and stops the
window cleanly first; one started another way is caught at the next step boundary
(``ProfilingWindow.check_rivals``). Our own calls into torch and VizTracer run in ``own_calls()``."""

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
        """Inside the other tool's call, which goes on: ``on_rival`` must raise nothing."""
        if self.installed and not _owned():
            self.remove()  # first: the other tool's own calls must go straight through
            self.on_rival(name)

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        _installed.add(self)
        try:
            import cProfile

            from torch.autograd.profiler import profile
            from viztracer import VizTracer

            self._patch_method(profile, "_prepare_trace", "a torch profiler")
            self._patch_method(profile, "_start_trace", "a torch profiler")
            self._patch_method(cProfile.Profile, "enable", "cProfile")
            # The user's own VizTracer: its construction hooks on Python <= 3.11, its start() takes ours.
            self._patch_method(VizTracer, "__init__", "VizTracer")
            self._patch_method(VizTracer, "start", "VizTracer")
            if sys.version_info >= (3, 12):
                self._patch_monitoring()
        except BaseException:  # cleanup: a half install is removed; re-raised
            self.remove()
            raise

    def remove(self) -> None:
        """Undo every patch (each one only if it is still ours)."""
        self.installed = False
        _installed.discard(self)
        restore, self._restore = self._restore, []
        for undo in reversed(restore):
            undo()

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
