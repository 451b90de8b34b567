"""The children ``viztracer_dump.write_dump`` forks to write VizTracer's buffer: every wait on one is bounded.

A dump child normally ends within milliseconds. One that does not (stopped; or, on CPython before
3.11, deadlocked in ``PyOS_AfterFork_Child`` before its first line: ``FORK_CAN_DEADLOCK``) is
killed and reaped at its bound, so no writer thread waits forever and no copy of the training
process stays behind; its window is dropped (``DumpTimeout``). One that dies of a signal (VizTracer's
dump crashing on a name that is not UTF-8: docs/upstream.md) drops only its window
(``DumpChildFailed``).
"""

from __future__ import annotations

import os
import signal
import sys
import time

# Dump children not reaped yet, each with what its death of a signal most likely means ("" when
# nothing is known). A job reaps its own (``wait_for_dump``); one whose window was interrupted
# between the fork and the hand-off is reaped at the end of fit (``reap_dump_children``).
dump_children: dict[int, str] = {}
# Seconds a dump child may take before it is killed (``wait_for_dump``): a full default buffer
# (1,000,000 calls, ~0.9 µs each) dumps in about a second; a child stuck before its first line
# (``FORK_CAN_DEADLOCK``) or stopped never ends by itself.
DUMP_TIMEOUT_S = 60.0
# CPython before 3.11 can deadlock a forked child in ``PyOS_AfterFork_Child``: it deletes the other
# threads' states while holding the interpreter's head lock and re-initialises that lock only after,
# so a thread that held it at the fork (one being created or ending, ``sys._current_frames()``)
# leaves the child waiting forever (seen in CI on a window's dump child). Dump in this process there.
FORK_CAN_DEADLOCK = sys.version_info < (3, 11)


class DumpChildFailed(RuntimeError):
    """The dump child ended without its file for a reason of its own, not the spool's."""


class DumpTimeout(DumpChildFailed):
    """The dump child did not finish within ``DUMP_TIMEOUT_S``; it was killed and reaped."""


def wait_for_dump(pid: int | None, timeout: float | None = None) -> None:
    """Reap the child ``viztracer_dump.write_dump`` forked; raise if it did not write its file. A child
    still running after ``timeout`` seconds (default ``DUMP_TIMEOUT_S``) is killed and reaped, and
    ``DumpTimeout`` raised: no wait on it is unbounded, and no process stays behind."""
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
    """The child's wait status, or None when it was killed (and reaped) at the bound. Polls with a
    delay that grows from 1 ms to 20 ms: a dump of a few thousand calls ends within milliseconds."""
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
    """Reap every dump child no job took (no zombie stays behind); one that is still writing after
    ``timeout`` seconds in all (a hung spool filesystem) is killed first."""
    deadline = time.monotonic() + timeout
    for pid in list(dump_children):
        try:
            _reap_within(pid, deadline - time.monotonic())
        except (ChildProcessError, ProcessLookupError):
            pass
        dump_children.pop(pid, None)
