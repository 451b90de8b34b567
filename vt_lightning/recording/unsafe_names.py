"""File names VizTracer cannot take: found before a window starts, so the tracer never meets one.

A module whose file name holds a byte that is not UTF-8 (Python decodes it as a lone surrogate,
``caf\\udcff_module.py``) crashes VizTracer 1.1.1 with SIGSEGV at the first traced call of its code:
its C hook asks for the file name as UTF-8, gets NULL, and uses it (reproduced with VizTracer alone).
Such a name cannot be excluded either, as VizTracer's own file filter does the same conversion. So
while such a module is loaded, no window records Python calls: ``unsafe_module_file`` names it, and
the window is skipped with a warning (``controller/windows.py``).

The check reads ``sys.modules`` once per change of its size (a few thousand ``__file__`` strings,
about a millisecond), not at every window.
"""

from __future__ import annotations

import sys

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
