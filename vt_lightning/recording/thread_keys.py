"""VizTracer's per-thread pthread key, deleted before the interpreter finalizes: its destructor takes
the GIL, and torch's autograd device threads exit after ``Py_Finalize`` (a compiled CUDA job exited
with SIGSEGV after writing every file). VizTracer does not expose the key; its constructor creates
exactly one, so bracketed by two keys of our own (the lowest free index is handed out), the one
between them is VizTracer's when the brackets are exactly two apart. Else nothing is deleted."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_keys: list[int] = []  # VizTracer's keys, to delete at exit
_libc: Any = None


def _pthread() -> Any:
    """libc's pthread key functions (Linux only), or None."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.pthread_key_create.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
            _libc.pthread_key_delete.argtypes = [ctypes.c_uint]
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def build_noting_key(build: Callable[[], T]) -> T:
    """``build()`` (which constructs a VizTracer), noting the pthread key it created."""
    libc = _pthread()
    if libc is None:
        return build()
    before, after = ctypes.c_uint(), ctypes.c_uint()
    if libc.pthread_key_create(ctypes.byref(before), None) != 0:
        return build()
    try:
        built = build()
    finally:
        have_after = libc.pthread_key_create(ctypes.byref(after), None) == 0
        libc.pthread_key_delete(before)
        if have_after:
            libc.pthread_key_delete(after)
    if have_after and after.value - before.value == 2:
        _keys.append(before.value + 1)
    return built


def noted_keys() -> list[int]:
    return list(_keys)


def delete_keys() -> None:
    """Delete the noted keys (at exit, once every tracer is stopped: nothing reads them any more)."""
    libc = _pthread()
    if libc is None:
        return
    while _keys:
        libc.pthread_key_delete(_keys.pop())
