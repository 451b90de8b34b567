"""The one interval sweep: one thread's calls (or ops) nested by time. Pure.

Every per-thread table reads the same structure: ``python_tables.python_stats`` (self and inclusive time
per function), ``summary.top_ops`` (self time per op) and the verdicts' ``Timeline`` (which call
owns each instant). ``nest`` sorts a thread's intervals once, outer call first, and gives each the
call it started in; the readers then walk the result with a stack of indices, on plain tuples and
lists (a NamedTuple or an object per call costs several times as much in these loops).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from vt_lightning.analysis.nesting import outer_first

# An interval as the readers pass it: ``(start µs, end µs, *fields)``; nest keeps the tuple as is.
Interval = tuple[Any, ...]
# ``nest``'s result: ``(ordered, ends, parents)``.
Nested = tuple[list[Interval], list[float], list[int]]


_FOREVER = float("inf")
_START, _END = itemgetter(0), itemgetter(1)


def by_start(intervals: Iterable[Interval]) -> list[Interval]:
    """``intervals`` in ``nest``'s order: by start, the longer first on a tie, then as given
    (``nesting.outer_first`` on the tuples' first two fields: a thread already in strict start
    order, as a DataLoader worker's is, is checked at C speed and not sorted)."""
    return outer_first(list(intervals), _START, _END)


def nest(intervals: Iterable[Interval], clip: bool = True) -> Nested:
    """``(ordered, ends, parents)``: ``intervals`` sorted by start, the longer first on a tie (then
    in the order given), each one's end (``clip``: cut to the end of the call it started in, as a
    trace viewer nests them; else as recorded) and the index in ``ordered`` of that call (-1: at
    the top). A call starts inside another when it starts before that one ends.

    Readers walk ``ordered`` keeping a stack of open indices: before call ``i``, pop while the top
    is not ``parents[i]``; the popped calls are those that ended, innermost first."""
    ordered = by_start(intervals)
    ends: list[float] = []
    parents: list[int] = []
    add_end, add_parent = ends.append, parents.append
    # The open calls are the innermost one's chain of parents: closing the top one opens its
    # parent, whose (clipped) end is in ``ends`` already, so no stack of its own is kept.
    top_end, parent = _FOREVER, -1
    for i, interval in enumerate(ordered):
        start, end = interval[0], interval[1]
        while top_end <= start:
            parent = parents[parent]
            top_end = ends[parent] if parent >= 0 else _FOREVER
        if clip and end > top_end:
            end = top_end
        add_parent(parent)
        add_end(end)
        top_end, parent = end, i
    return ordered, ends, parents
