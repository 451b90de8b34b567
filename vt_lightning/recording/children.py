"""The children ``viztracer_dump.write_dump`` forks: every wait on one is bounded.

A dump child that does not end (stopped, or deadlocked before its first line: ``FORK_CAN_DEADLOCK``)
is killed and reaped at its bound, and its window dropped (``DumpTimeout``); one that dies of a
signal (VizTracer's dump crashing on a name that is not UTF-8) drops only its window.
"""

from __future__ import annotations

import os
import signal
import sys
import time

# Dump children not reaped yet -> the likely cause of a death by signal (""). A job reaps its own;
# one whose window was interrupted before the hand-off is reaped at the end of fit.
dump_children: dict[int, str] = {}
# A full default buffer (1,000,000 calls, ~0.9 µs each) dumps in about a second.
DUMP_TIMEOUT_S = 60.0
# CPython before 3.11 can deadlock a forked child in ``PyOS_AfterFork_Child`` when another thread
# held the interpreter's head lock at the fork (seen in CI): dump in this process there.
FORK_CAN_DEADLOCK = sys.version_info < (3, 11)


class DumpChildFailed(RuntimeError):
    """The dump child ended without its file for a reason of its own, not the spool's."""


class DumpTimeout(DumpChildFailed):
    """The dump child did not finish within ``DUMP_TIMEOUT_S``; it was killed and reaped."""


def wait_for_dump(pid: int | None, timeout: float | None = None) -> None:
    """Reap a dump child; raise if it did not write its file (``DumpTimeout`` once killed at ``timeout``)."""
    if pid is None:
        return
    limit = DUMP_TIMEOUT_S if timeout is None else timeout
    try:
        status = _reap_within(pid, limit)
    finally:
        hint = dump_children.pop(pid, "")
    if status is None:
        raise DumpTimeout(f"the VizTracer dump process did not finish in {limit:g} s and was killed")
    if os.WIFSIGNALED(status):  # a crash in VizTracer's C dump, e.g. on a name that is not UTF-8
        raise DumpChildFailed(f"the VizTracer dump process died of {signal.Signals(os.WTERMSIG(status)).name}{hint}")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the VizTracer dump process exited with {os.waitstatus_to_exitcode(status)}")


def _reap_within(pid: int, timeout: float) -> int | None:
    """The child's wait status, or None when it was killed (and reaped) at the bound."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # SIGKILL ends even a stopped child
            return None
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.02)


def reap_dump_children(timeout: float = 5.0) -> None:
    """Reap every dump child no job took; one still writing after ``timeout`` in all is killed first."""
    deadline = time.monotonic() + timeout
    for pid in list(dump_children):
        try:
            _reap_within(pid, deadline - time.monotonic())
        except (ChildProcessError, ProcessLookupError):
            pass
        dump_children.pop(pid, None)
