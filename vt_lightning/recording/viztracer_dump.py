"""VizTracer's C dump of a window's calls: forked, held for later (``HeldDump``), or in process. Forked
on Linux, so that a crash of the dump on a name that is not UTF-8 ends only the child and its window;
``setpid()`` first (the dump writes the dumping process's pid). A dump in this process is refused
once a thread whose name the dump cannot write has met the tracer (``note_threads``)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from vt_lightning.recording import children
from vt_lightning.recording.children import DumpChildFailed, wait_for_dump
from vt_lightning.recording.unsafe_names import unsafe_thread_name

_dump_child = False  # True only in the child ``write_dump`` forks to write the buffer
_TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGQUIT}
# By ``id`` of a VizTracer (each lives for the process): the name, not UTF-8, of a thread alive while
# it recorded. VizTracer keeps every thread's name for its life: every later dump of it could crash.
_unsafe_threads: dict[int, str] = {}


class UnsafeDumpName(DumpChildFailed):
    """A dump that would crash this process was refused: the window's calls were discarded."""


def in_dump_child() -> bool:
    """Whether this process is the child ``write_dump`` forked (it needs the buffer as it is)."""
    return _dump_child


def note_threads(viz: Any, names: Iterable[str]) -> None:
    """Note the names of the threads ``viz`` may have met: alive while it records, or started then."""
    if id(viz) not in _unsafe_threads:
        name = unsafe_thread_name(names)
        if name is not None:
            _unsafe_threads[id(viz)] = name


def write_dump(viz: Any, entries: int, path: str, *, fork: bool) -> int | None:
    """Write ``viz``'s buffer as JSON to ``path`` and empty it: by a forked child where ``fork`` allows (its
    pid), else here (None). Once a thread whose name could crash the dump has met ``viz``: forked where
    that is safe, else refused (``UnsafeDumpName``)."""
    global _dump_child
    thread = _unsafe_threads.get(id(viz))
    if (fork or thread is not None) and sys.platform.startswith("linux") and not children.FORK_CAN_DEADLOCK:
        pid: int | None = None
        _dump_child = True
        viz.setpid()  # events keep this process's pid, not the child's
        # Ctrl-C reaches the whole process group: the child writes on with it blocked.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _TERMINAL_SIGNALS)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
                pid = os.fork()
        except OSError:
            pid = None
        finally:
            if pid != 0:
                _dump_child = False
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                viz.setpid(0)
        if pid == 0:  # the child: write, and leave without running any exit handler
            code = 1
            try:
                viz.dump(path)
                code = 0
            finally:
                os._exit(code)
        if pid is not None:
            # What its death of a signal most likely means, for ``wait_for_dump``.
            hint = f" (a thread named {thread!a}, not valid UTF-8, ran while VizTracer recorded)"
            children.dump_children[pid] = hint if thread is not None else ""
            viz.clear()
            return pid
    if thread is not None:
        viz.clear()
        raise UnsafeDumpName(
            f"a thread named {thread!a} ran while VizTracer recorded, and its name, not valid UTF-8, crashes "
            "VizTracer's dump (SIGSEGV) for the rest of the run: the window's calls were discarded, not "
            "written. Give the thread a UTF-8 name"
        )
    viz.dump(path)
    return None


# The held dumps (``HeldDump``) not written yet, by ``id`` of the VizTracer whose buffer holds them.
_held_dumps: dict[int, HeldDump] = {}


class HeldDump:
    """A closed window's calls left in VizTracer's buffer until the end of fit (no fork while training
    steps), written once by whichever comes first: the window's job (``write``) or the next recording
    (``flush``). ``drop``: the window was abandoned."""

    def __init__(self, viz: Any, entries: int, path: str) -> None:
        self.path = path
        self.viz = viz
        self._entries = entries
        self._lock = threading.Lock()
        self._written = False
        self._pid: int | None = None
        self._refused: UnsafeDumpName | None = None  # for the window's job, whoever wrote
        _held_dumps[id(self.viz)] = self

    def _empty(self, *, drop: bool = False, in_process: bool = False) -> None:
        """Under the lock, once: write the calls or ``drop`` them. This dump leaves ``_held_dumps`` only once
        the buffer is empty, or the next recording's first calls would go into this window's file."""
        if self._written:
            return
        self._written = True
        try:
            if drop:
                self.viz.clear()
            else:
                self._pid = write_dump(self.viz, self._entries, self.path, fork=not in_process)
        except UnsafeDumpName as err:  # the window's, not the next recording's: its job says so
            self._refused = err
        finally:
            if _held_dumps.get(id(self.viz)) is self:
                del _held_dumps[id(self.viz)]

    def flush(self) -> None:
        """The buffer is needed for new calls: fork the dump now (the job reaps the child)."""
        with self._lock:
            self._empty()

    def write(self, *, in_process: bool) -> int | None:
        """Complete the dump for the window's job; the child to reap, or None."""
        with self._lock:
            self._empty(in_process=in_process)
            if self._refused is not None:
                raise self._refused
            pid, self._pid = self._pid, None
            return pid

    def drop(self) -> None:
        """The window is given up: its calls leave the buffer unwritten."""
        with self._lock:
            self._empty(drop=True)
            pid, self._pid = self._pid, None
        try:
            wait_for_dump(pid)
        except (OSError, RuntimeError):
            pass


def flush_held(viz: Any) -> None:
    """Write a held window's calls out of ``viz`` before it records anything else."""
    held = _held_dumps.get(id(viz))
    if held is not None:
        held.flush()


def forget_held_dumps() -> None:
    """In a forked child: the held windows' calls are the parent's to write."""
    for held in _held_dumps.values():  # not through its methods: another thread may hold its lock
        held.viz.clear()
    _held_dumps.clear()
