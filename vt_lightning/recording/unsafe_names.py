"""Names VizTracer cannot take (not UTF-8: it crashes with SIGSEGV, docs/upstream.md), found in plain
Python before the tracer meets them: a loaded module's file (``unsafe_module_file``: the window is
skipped), one imported during a window (``ImportGuard``, first on ``sys.meta_path`` while the window
records: the window is dropped), both in a DataLoader worker's fetch (``TracingGuard``), and a
thread's name (``unsafe_thread_name``). Code compiled by hand under such a name is left to VizTracer
(docs/troubleshooting.md)."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

_checked: tuple[int, str | None] = (-1, None)  # (len(sys.modules) when last read, what was found)


def unsafe_name(name: str) -> bool:
    """Whether ``name`` cannot be encoded as UTF-8 (it holds a lone surrogate)."""
    if name.isascii():
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unsafe_thread_name(names: Iterable[str]) -> str | None:
    """The first of ``names`` (threads' names) VizTracer's dump cannot write, or None."""
    return next((name for name in names if unsafe_name(name)), None)


def unsafe_module_file() -> str | None:
    """``module (file)`` of a loaded module whose file name VizTracer cannot take, or None (read again
    only when ``sys.modules`` changes size)."""
    global _checked
    size = len(sys.modules)
    if size != _checked[0]:
        _checked = (size, _first_unsafe())
    return _checked[1]


def _first_unsafe() -> str | None:
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and unsafe_name(path):
            return f"{name!a} ({path!a})"
    return None


def skipped_message(unsafe: str, index: int) -> str:
    """The warning of a window skipped because ``unsafe`` (``module (file)``) is loaded."""
    return (
        f"vt_lightning: the loaded module {unsafe} has a file name that is not valid UTF-8, which "
        f"crashes VizTracer (SIGSEGV) at its first traced call; window {index} and every later "
        "one while it is loaded are skipped. Rename the file to UTF-8 to profile this run."
    )


class UnsafeImport(RuntimeError):
    """A module whose file name VizTracer cannot take was imported during window ``index``."""

    def __init__(self, unsafe: str, index: int) -> None:
        self.unsafe = unsafe
        super().__init__(
            f"vt_lightning: the module {unsafe}, imported during window {index}, has a file name that is "
            "not valid UTF-8, which crashes VizTracer (SIGSEGV) at its first traced call; Python tracing "
            f"stopped before its code ran, window {index} is dropped, and every later window while it is "
            "loaded is skipped. Rename the file to UTF-8 to profile this run."
        )


class ImportGuard:
    """A ``sys.meta_path`` finder: it asks the finders after it for the spec and hands ``on_unsafe`` one
    whose file name VizTracer cannot take, before its code is loaded; it raises nothing into the import."""

    def __init__(self, on_unsafe: Callable[[str], None]) -> None:
        self._on_unsafe = on_unsafe
        self._pid = os.getpid()

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if os.getpid() != self._pid:
            return None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:  # a legacy finder: the import system's own search keeps its precedence
                return None
            spec = find(fullname, path, target)
            if spec is not None:
                # The module code's ``co_filename``: its source, or a sourceless module's ``.pyc``.
                origin = getattr(spec, "origin", None)
                if isinstance(origin, str) and unsafe_name(origin):
                    try:
                        self._on_unsafe(f"{fullname!a} ({origin!a})")
                    except Exception:  # a fault boundary: inside the user's import, which goes on
                        pass
                return spec
        return None


class TracingGuard:
    """The checks above around a DataLoader worker's traced fetch: ``start`` is False (nothing started)
    once such a name was met; ``stop`` is True then (trace no more). One warning per process."""

    def __init__(self) -> None:
        self.met: str | None = None
        self._tracer: Any = None
        self._imports = ImportGuard(self._unsafe_import)

    def start(self, tracer: Any) -> bool:
        if self.met is None:
            module = unsafe_module_file()
            if module is not None:
                self._met(f"the module {module}, loaded in this worker,")
        if self.met is not None:
            return False
        self._tracer = tracer
        self._imports.install()  # before the tracer, so that nothing is imported unseen while it runs
        try:
            tracer.start()
        except BaseException:  # the guard comes off again, and the error goes on as it was
            self.stop()
            raise
        return True

    def stop(self, tracer: Any = None) -> bool:
        self._tracer = None
        try:
            if tracer is not None:
                tracer.stop()
        finally:
            self._imports.remove()
        return self.met is not None

    def _unsafe_import(self, unsafe: str) -> None:
        self._met(f"the module {unsafe}, imported during a traced fetch,")

    def _met(self, what: str) -> None:
        first = self.met is None
        if first:
            self.met = what  # before the stop: whatever it raises, this worker traces no more
        tracer = self._tracer
        if tracer is not None:
            tracer.stop()
        if first:
            warnings.warn(
                f"vt_lightning: DataLoader worker pid {os.getpid()}: {what} has a file name that is not "
                "valid UTF-8, which crashes VizTracer (SIGSEGV) at its first traced call; this worker's "
                "tracing stopped before that code ran and stays off for the rest of its life (its events "
                "recorded before are kept). Give it a UTF-8 file name to profile its fetches.",
                RuntimeWarning,
                stacklevel=2,
            )
