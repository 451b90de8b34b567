"""File names VizTracer cannot take: found before the tracer meets one, so it never crashes on them.

A module whose file name holds a byte that is not UTF-8 (Python decodes it as a lone surrogate,
``caf\\udcff_module.py``) crashes VizTracer 1.1.1 with SIGSEGV at the first traced call of its code:
its C hook asks for the file name as UTF-8, gets NULL, and uses it (reproduced with VizTracer alone).
Such a name cannot be excluded either, as VizTracer's own file filter does the same conversion.

- Loaded before a window: no window records Python calls while it is loaded. ``unsafe_module_file``
  names it, and the window is skipped with a warning (``controller/windows.py``). The check reads
  ``sys.modules`` once per change of its size (a few thousand ``__file__`` strings, about a
  millisecond), not at every window.
- Imported during a window: ``ImportGuard``, first on ``sys.meta_path`` only while the window
  records, sees the module's spec before its code exists. Its callback stops the Python tracer
  (VizTracer's ``collecting`` flag is process-wide, so no thread's hook reads a file name after
  that), and the window is dropped (``UnsafeImport``); the import itself proceeds untouched.

Not covered: code compiled from a string under such a name (``compile(src, "caf\\udcff.py",
"exec")``) or a module executed by hand from ``spec_from_file_location``: only an audit hook would
see those, and an audit hook can never be removed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

_checked: tuple[int, str | None] = (-1, None)  # (len(sys.modules) when last read, what was found)


def unsafe_file_name(name: str) -> bool:
    """Whether ``name`` cannot be encoded as UTF-8 (it holds a lone surrogate)."""
    if name.isascii():
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unsafe_module_file() -> str | None:
    """``module (file)`` of a loaded module whose file name VizTracer cannot take, or None."""
    global _checked
    size = len(sys.modules)
    if size != _checked[0]:
        _checked = (size, _first_unsafe())
    return _checked[1]


def _first_unsafe() -> str | None:
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and unsafe_file_name(path):
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
    """A module whose file name VizTracer cannot take was imported during window ``index``: Python
    tracing stopped before its code ran, and the window is dropped (the message says so)."""

    def __init__(self, unsafe: str, index: int) -> None:
        self.unsafe = unsafe
        super().__init__(
            f"vt_lightning: the module {unsafe}, imported during window {index}, has a file name that is "
            "not valid UTF-8, which crashes VizTracer (SIGSEGV) at its first traced call; Python tracing "
            f"stopped before its code ran, window {index} is dropped, and every later window while it is "
            "loaded is skipped. Rename the file to UTF-8 to profile this run."
        )


class ImportGuard:
    """A ``sys.meta_path`` finder, first in line while a window records: it asks the finders after it
    for the spec (as the import system would, so nothing is searched twice) and hands ``on_unsafe``
    the ``module (file)`` of one whose file name VizTracer cannot take, before the module's code is
    loaded. Finds nothing itself, raises nothing of its own, and in a forked child (or behind a
    legacy finder with no ``find_spec``) leaves the search to the import system."""

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
                file = _unsafe_file_of(spec)
                if file is not None:
                    self._on_unsafe(f"{fullname!a} ({file!a})")
                return spec
        return None


def _unsafe_file_of(spec: Any) -> str | None:
    """The file name of ``spec`` that VizTracer would meet as ``co_filename`` and cannot take, or None."""
    for attribute in ("origin", "cached"):
        try:
            name = getattr(spec, attribute, None)
        except Exception:  # ``cached`` is computed from the origin; a loader may refuse
            continue
        if isinstance(name, str) and unsafe_file_name(name):
            return name
    return None
