"""VizTracer's memory, read in place before a dump it would crash on (ctypes, known layouts only).

VizTracer's C ``dump`` converts every name it writes (a code object's ``co_name``, ``co_qualname``
and ``co_filename``, a C function's module, a thread's name) with an unchecked
``PyUnicode_AsUTF8``: a name that is not UTF-8 (``unsafe_names.unsafe_file_name``) ends the
process that dumps with SIGSEGV. ``dump_in_process`` reads the ring buffer and the tracer's list of
threads first, and refuses such a dump (``UnsafeDumpName``). Only VizTracer 1.0.1 and 1.1.1 on
64-bit little-endian builds are read, every pointer checked before it is followed; any other
layout concludes nothing (docs/upstream.md).
"""

from __future__ import annotations

import array
import ctypes
import os
import sys
import types
import warnings
from typing import Any

from vt_lightning.recording.children import DumpChildFailed
from vt_lightning.recording.unsafe_names import unsafe_file_name


class UnsafeDumpName(DumpChildFailed):
    """VizTracer's buffer holds a name its C dump would crash on: the window's calls were discarded."""


# VizTracer's buffer, as its C structs lay it out in the versions checked (``TracerObject`` and
# ``EventNode`` in snaptrace.h / eventnode.h; checked on x86-64 Linux, read on any 64-bit
# little-endian build, whose alignment rules give the same offsets): the 64-bit words of the
# tracer object holding the buffer's address, size (entries + 1), head and tail; a node's size, the
# byte of its kind (1: a function entry/exit) and of its event type, and the word holding the code
# object (Python calls) or the module name (C calls). Another version is not read: ``None``.
_BUFFER_WORDS = (13, 14, 15, 16)
_NODE_BYTES = 88
_KIND_BYTE, _TYPE_BYTE, _OBJECT_WORD = 0, 64, 5
_FEE_NODE, _PY_TYPES, _C_TYPES = 1, frozenset((0, 3)), frozenset((4, 6))
_LAYOUT_VERSIONS = frozenset(("1.0.1", "1.1.1"))
# The tracer object's word holding its list of threads met (``metadata_head``: a ``MetadataNode``
# is next, tid, name, thread info), kept for the tracer's life: ``clear()`` and dumps keep it.
_THREADS_WORD, _THREAD_NAME_WORD, _MAX_THREADS = 18, 2, 1 << 16


def _layout_known() -> bool:
    return (
        sys.byteorder == "little" and ctypes.sizeof(ctypes.c_void_p) == 8 and _viztracer_version() in _LAYOUT_VERSIONS
    )


def _heap_pointer(value: int) -> bool:
    """Whether ``value`` can be a pointer into this process's memory: 8-aligned, above the pages
    Linux never maps (``mmap_min_addr``, 64 KiB) and in the 47-bit user space; 0 (the list's end) is not."""
    return 0x10000 <= value < 1 << 47 and not value % 8


def unsafe_thread_name(viz: Any) -> str | None:
    """A thread name VizTracer ``viz`` holds that its C dump cannot write (not UTF-8: a thread named
    with a lone surrogate), described; None when there is none or the layout is not one known.

    VizTracer keeps the name of every thread it has met, for the tracer's life, and its dump
    converts each with the same unchecked ``PyUnicode_AsUTF8``. Every pointer is checked before it
    is followed: aligned, and a name's type ``str``; anything else concludes nothing."""
    if not _layout_known():
        return None
    node = (ctypes.c_int64 * (_THREADS_WORD + 1)).from_address(id(viz))[_THREADS_WORD]
    str_type = id(str)
    for _ in range(_MAX_THREADS):
        if not _heap_pointer(node):
            return None
        fields = (ctypes.c_int64 * 4).from_address(node)
        name = fields[_THREAD_NAME_WORD]
        if not _heap_pointer(name) or (ctypes.c_int64 * 2).from_address(name)[1] != str_type:
            return None
        text = ctypes.cast(name, ctypes.py_object).value
        if unsafe_file_name(text):
            return f"a thread named {text!a}"
        node = fields[0]
    return None


def unsafe_name_in_buffer(viz: Any, entries: int) -> str | None:
    """A name in VizTracer ``viz``'s buffer that its C dump cannot write (the code's ``co_name``,
    ``co_qualname`` or ``co_filename``, or a C function's module, not UTF-8), described; None when
    there is none, or when this VizTracer's layout is not one known (then nothing is read).

    VizTracer's dump converts each name with an unchecked ``PyUnicode_AsUTF8`` and crashes on NULL:
    run in the training process (``children.FORK_CAN_DEADLOCK``, or a held window), that ends
    training. Reads the buffer's nodes in place (their kinds and types must be the known ones, or
    nothing is concluded), and each distinct object once: about 0.05 µs per recorded call, a fifth
    of the dump's own time (docs/upstream.md)."""
    if not _layout_known():
        return None
    words = (ctypes.c_int64 * (_BUFFER_WORDS[-1] + 1)).from_address(id(viz))
    address, size, head, tail = (words[i] for i in _BUFFER_WORDS)
    if not address or size != entries + 1 or not (0 <= head < size and 0 <= tail < size):
        return None
    memory = memoryview((ctypes.c_char * (size * _NODE_BYTES)).from_address(address)).cast("B")
    spans = [(head, tail)] if head <= tail else [(head, size), (0, tail)]
    objects: set[int] = set()
    for start, end in spans:
        live = memory[start * _NODE_BYTES : end * _NODE_BYTES]
        if not live:
            continue
        kinds = bytes(live[_KIND_BYTE::_NODE_BYTES])
        types_seen = set(bytes(live[_TYPE_BYTE::_NODE_BYTES]))
        if kinds.count(_FEE_NODE) != len(kinds) or not types_seen <= _PY_TYPES | _C_TYPES:
            return None  # not the layout expected: read no pointer
        objects.update(array.array("q", bytes(live.cast("q")[_OBJECT_WORD :: _NODE_BYTES // 8])))
    objects.discard(0)
    for pointer in objects:
        held = ctypes.cast(pointer, ctypes.py_object).value  # the node holds a reference to it
        if isinstance(held, types.CodeType):
            for name in (held.co_name, getattr(held, "co_qualname", ""), held.co_filename):
                if unsafe_file_name(name):
                    return f"code named {held.co_name!a} (file {held.co_filename!a}, line {held.co_firstlineno})"
        elif isinstance(held, str) and unsafe_file_name(held):
            return f"a C function of the module {held!a}"
    return None


def _viztracer_version() -> str | None:
    try:
        from viztracer import __version__
    except ImportError:  # pragma: no cover - viztracer is a dependency
        return None
    return str(__version__)


def dump_in_process(viz: Any, entries: int, path: str, *, in_worker: bool = False) -> None:
    """VizTracer ``viz``'s C dump to ``path``, in this process; but not when it holds a name that dump
    would crash on (``unsafe_name_in_buffer``, ``unsafe_thread_name``): the training process, or a
    DataLoader worker, must not die of it. The buffer is emptied, and ``UnsafeDumpName`` raised; in a
    worker (``in_worker``), an empty part written instead (it stays complete) and one warning given.
    A thread's name stays with the tracer, so every later dump of it is refused the same way."""
    unsafe = unsafe_name_in_buffer(viz, entries) or unsafe_thread_name(viz)
    if unsafe is not None:
        viz.clear()
        message = (
            f"the window's calls include {unsafe}, a name that is not valid UTF-8, which crashes "
            "VizTracer's dump (SIGSEGV); they were discarded, not written. Give that code (or thread) a UTF-8 name"
        )
        if not in_worker:
            raise UnsafeDumpName(message)
        global _worker_warned
        if not _worker_warned:
            _worker_warned = True
            try:
                warnings.warn(
                    f"vt_lightning: DataLoader worker pid {os.getpid()}: {message}.", RuntimeWarning, stacklevel=2
                )
            except Exception:  # warnings made errors (-W error): the dump goes on
                pass
        # Written here, not by VizTracer: its dump writes the threads' names even of an empty buffer.
        with open(path, "wb") as f:
            f.write(b'{"traceEvents": []}')
        return
    viz.dump(path)


_worker_warned = False  # ``dump_in_process`` warned in this worker
