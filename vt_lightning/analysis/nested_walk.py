"""A whole thread's calls walked as arrays, as ``python_tables.PythonStats.sweep_entries``' stack
walk walks them, for a thread none of whose calls that walk would cut. Pure.

A DataLoader worker's thread holds most of a window's calls (163k of 170k), and they nest as
placed: the walk's parents, depths, the order it closes calls in, each call's self time and
whether a call of the same key is open when it starts all follow from sorted searches, with the
walk's double operations applied element by element. Sums built from them with ``np.bincount``
(which adds its weights one by one, in their order, from 0.0) are the walk's to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NestedWalk:
    """``starts``/``ends``/``lengths`` (``end - start``): each call's, in the thread's order;
    ``parents``: the index of the call it starts in (-1: at the top); ``depths``: how many calls
    are open around it; ``closed_before``: the index of the call whose start closes it (the
    thread's length: open at the end); ``own``: its self time (``length`` less its children's,
    each added in order); ``closing``: the call indices in the order the walk closes them, the
    ones still open at the end innermost first."""

    starts: np.ndarray
    ends: np.ndarray
    lengths: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    closed_before: np.ndarray
    own: np.ndarray
    closing: np.ndarray

    @property
    def open_at_end(self) -> np.ndarray:
        """The calls still open after the last one started, outermost first."""
        count = len(self.starts)
        return self.closing[len(self.closing) - int(np.count_nonzero(self.closed_before == count)) :][::-1]


def nest_levels(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(parents, depths, closed_before)`` of ``NestedWalk`` for calls in ``sweep.by_start`` order
    (``starts`` never decreasing), or None where the walk would cut a call (one that ends after
    the call it starts in) or a time is not finite.

    The walk closes the open calls that ended before each call starts: a call is closed before the
    first later call that starts at or after its end. A call's depth is then how many earlier calls
    are not closed yet when it starts, and its parent the last call before it one level up. With no
    call ending after its parent, the open calls' ends never decrease down the stack, so this is
    the walk's stack at every step; the first call the walk would cut is one whose end passes its
    parent's here, so none passing means none is cut."""
    count = len(starts)
    if count == 0 or not (np.isfinite(starts).all() and np.isfinite(ends).all()):
        return None
    if count > 1 and not (starts[1:] >= starts[:-1]).all():
        return None
    index = np.arange(count)
    closed_before = np.maximum(np.searchsorted(starts, ends, side="left"), index + 1)
    closed_by = np.cumsum(np.bincount(closed_before, minlength=count + 1)[:count])  # closed before each start
    depths = index - closed_by
    by_level = np.argsort(depths, kind="stable")  # by depth, then in order
    level_keys = depths[by_level] * (count + 1) + index[by_level]
    above = np.searchsorted(level_keys, (depths - 1) * (count + 1) + index, side="left") - 1
    parents = np.where(depths > 0, by_level[np.maximum(above, 0)], -1)
    inner = parents >= 0
    if (ends[inner] > ends[parents[inner]]).any():
        return None  # the walk cuts this one
    return parents, depths, closed_before


def walk_nested(starts: np.ndarray, ends: np.ndarray) -> NestedWalk | None:
    """The walk of calls in ``sweep.by_start`` order, or None where it would cut one
    (``nest_levels``)."""
    levels = nest_levels(starts, ends)
    if levels is None:
        return None
    parents, depths, closed_before = levels
    inner = parents >= 0
    lengths = ends - starts
    children = np.bincount(parents[inner], weights=lengths[inner], minlength=len(starts))
    own = lengths - children
    closing = np.lexsort((-depths, closed_before))  # each closing run innermost first
    return NestedWalk(starts, ends, lengths, parents, depths, closed_before, own, closing)


def inherited(walk: NestedWalk, values: np.ndarray, keeps: np.ndarray) -> np.ndarray:
    """Per call, ``values`` where ``keeps`` is true, else its parent's result (-1 at the top):
    what a value handed down the stack is, computed one depth at a time."""
    out = np.where(keeps, values, -1)
    depths = walk.depths
    by_depth = np.argsort(depths, kind="stable")
    bounds = np.searchsorted(depths[by_depth], np.arange(int(depths.max()) + 2), side="left")
    for depth in range(1, len(bounds) - 1):
        level = by_depth[bounds[depth] : bounds[depth + 1]]
        handed = level[~keeps[level]]
        out[handed] = out[walk.parents[handed]]
    return out


def first_opened(walk: NestedWalk, keys: np.ndarray) -> np.ndarray:
    """Per call, whether no call of the same ``keys`` value (>= 0; -1: none) is open when it
    starts: the calls a recursion or a package's nesting counts once. An earlier call of the same
    key is open at a start exactly when it ends after it, compared here as ranks among the ends so
    one running maximum over each key's calls, in order, answers every call at once."""
    count = len(keys)
    sorted_ends = np.sort(walk.ends)
    end_rank = np.searchsorted(sorted_ends, walk.ends, side="left")  # ends before this one
    start_rank = np.searchsorted(sorted_ends, walk.starts, side="right")  # ends at or before the start
    order = np.argsort(keys, kind="stable")
    group = keys[order].astype(np.int64) * (count + 1)
    running = np.maximum.accumulate(group + end_rank[order])
    before = np.concatenate(([-1], running[:-1]))
    out = np.empty(count, dtype=bool)
    out[order] = before < group + start_rank[order]
    return out
