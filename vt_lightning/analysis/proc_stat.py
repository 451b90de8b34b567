"""Reading ``/proc/<pid>/stat`` lines (Linux), shared by the training side and the writer."""

from __future__ import annotations


def scheduler_state(stat: bytes) -> str:
    """The scheduler state letter of a ``/proc/<pid>[/task/<tid>]/stat`` line ("R" running or
    runnable, "S" asleep, "Z" zombie, ...), or "" for a line without one. The process's name comes
    before it in parentheses and may itself hold ")" and spaces, so the state is read after the
    *last* ")"."""
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3].decode("ascii", "replace") if end >= 0 else ""
