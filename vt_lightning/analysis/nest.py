"""The one nesting engine: a thread's intervals ordered, nested and walked, once (no other module keeps
a stack of open intervals; ``tests/unit/test_nesting_engine.py`` checks it). Pure. Sums by
``np.bincount`` add in order from 0.0: the same doubles as a loop in the walk's order."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from itertools import compress, islice
from operator import eq, itemgetter, le, lt
from typing import Any

import numpy as np

# Below this many intervals the walk's loop (~0.25 µs an interval) beats numpy's fixed costs.
ARRAY_NEST_MIN = 1000
_NAN = math.nan  # the end of "no parent": no comparison pops it or cuts against it
Interval = tuple[Any, ...]  # ``(start, end, *what it stands for)``
_TS, _DUR = itemgetter("ts"), itemgetter("dur")


def outer_first(items: list[Any], start: Callable[[Any], Any] = _TS, length: Callable[[Any], Any] = _DUR) -> list[Any]:
    """``items`` by ``start``, the longer (``length``) first at equal starts, ties in order: one C-level
    sort on the start (none when already strictly increasing), then only runs of equal starts."""
    # lazily, so items out of order (a raw dump's, by end) cost only the first few keys
    if all(map(lt, map(start, items), map(start, islice(items, 1, None)))):
        return list(items)
    starts = list(map(start, items))
    if all(map(le, starts, islice(starts, 1, None))):  # in order but for ties: only those are sorted
        ordered = list(items)
    else:
        starts.sort()  # the same order as the items', without reading each item's key again
        ordered = sorted(items, key=start)
        if all(map(lt, starts, islice(starts, 1, None))):  # no equal starts, the usual case
            return ordered
    run_end = -1
    # i where starts[i] == starts[i + 1], found without a Python-level loop over every item
    for i in compress(range(len(starts) - 1), map(eq, starts, islice(starts, 1, None))):
        if i < run_end:
            continue  # inside the run sorted already
        run_end = i + 1
        while run_end < len(starts) and starts[run_end] == starts[i]:
            run_end += 1
        ordered[i:run_end] = sorted(ordered[i:run_end], key=length, reverse=True)  # keeps equal ones in order
    return ordered


def outer_first_order(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``outer_first`` puts intervals in, from their starts and lengths (or ends)."""
    order = np.argsort(starts, kind="stable")
    in_order = starts[order]
    if (in_order[1:] == in_order[:-1]).any():
        order = np.lexsort((-lengths, starts))
    return order


SKIP = "skip"  # a crossing policy's answer: leave the interval out of the nest (never a parent)
DROP_PARENT = "drop parent"  # ... take the parent out of the nest and try the interval again
# ``crossing(i, parent, parent_end)``: interval ``i`` ends after ``parent_end``, ``parent``'s nested
# end; returns the end it nests with (and may edit what it stands for), ``SKIP`` or ``DROP_PARENT``.
Crossing = Callable[[int, int, float], Any]


def walk(
    starts: Iterable[float], ends: Iterable[float], crossing: Crossing | None = None, clip: bool = True
) -> tuple[list[int], list[float]]:
    """``(parents, nested ends)`` of intervals in ``outer_first`` order: the parent is the innermost
    open interval (-1: none), an end past it is cut (``clip``) or goes to ``crossing``. The open
    intervals are the innermost one's chain of parents, so no stack is kept."""
    parents: list[int] = []
    nested: list[float] = []
    add_parent, add_end = parents.append, nested.append
    top, top_end = -1, _NAN
    for i, (start, end) in enumerate(zip(starts, ends)):
        while top_end <= start:
            top = parents[top]
            top_end = nested[top] if top >= 0 else _NAN
        if end > top_end:
            if crossing is None:
                if clip:
                    end = top_end
            else:
                answer = crossing(i, top, top_end)
                while answer is DROP_PARENT:
                    top = parents[top]
                    top_end = nested[top] if top >= 0 else _NAN
                    while top_end <= start:
                        top = parents[top]
                        top_end = nested[top] if top >= 0 else _NAN
                    answer = crossing(i, top, top_end) if end > top_end else end
                if answer is SKIP:
                    add_parent(top)
                    add_end(end)
                    continue
                end = answer
        add_parent(top)
        add_end(end)
        top, top_end = i, end
    return parents, nested


def nests(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether no interval (in ``outer_first`` order) outlasts its parent: ``walk`` cuts none."""
    return not len(starts) or _levels(starts, ends) is not None


def _levels(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``walk``'s parents and depths by sorted searches where no interval outlasts its parent (None
    where one does, or a time is not finite): then an interval closes before the first later start."""
    count = len(starts)
    if not (np.isfinite(starts).all() and np.isfinite(ends).all()) or not (starts[1:] >= starts[:-1]).all():
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
        return None
    return parents, depths


class Nest:
    """One thread's intervals walked in ``outer_first`` order (``order``: their input indices)."""

    def __init__(self, starts: Any, ends: Any, clip: bool = True) -> None:
        starts = np.asarray(starts, dtype=float)
        ends = np.asarray(ends, dtype=float)
        self.order = outer_first_order(starts, ends)
        starts, ends = starts[self.order], ends[self.order]
        self.starts = starts
        self.clip = clip
        self._depths: np.ndarray | None = None
        levels = _levels(starts, ends) if len(starts) >= ARRAY_NEST_MIN else None
        if levels is not None:
            self.parents, self._depths = levels
            self.ends = ends
        else:
            parents, nested = walk(starts.tolist(), ends.tolist(), clip=clip)
            self.parents = np.array(parents, dtype=np.intp)
            self.ends = np.array(nested, dtype=float)

    def __len__(self) -> int:
        return len(self.starts)

    @cached_property
    def depths(self) -> np.ndarray:
        """How many intervals are open around each one (pointer doubling up the parents)."""
        if self._depths is not None:
            return self._depths
        up = self.parents
        depths = (up >= 0).astype(np.intp)  # the steps from each interval to ``up``
        while (up >= 0).any():
            has = up >= 0
            above = np.maximum(up, 0)
            depths = np.where(has, depths + depths[above], depths)
            up = np.where(has, up[above], -1)
        return depths

    @cached_property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    @cached_property
    def own(self) -> np.ndarray:
        """Each interval's self time: its length less its children's, added in order."""
        inner = self.parents >= 0
        return self.lengths - np.bincount(self.parents[inner], weights=self.lengths[inner], minlength=len(self))

    @cached_property
    def closed_before(self) -> np.ndarray:
        """The index of the interval whose start closes each one (``len``: open at the end)."""
        count = len(self)
        index = np.arange(count)
        closed = np.maximum(np.searchsorted(self.starts, self.ends, side="left"), index + 1)
        if not self.clip:  # an interval closes only once the ones it holds did, which may end later
            parents = self.parents.tolist()
            listed = closed.tolist()
            for i in range(count - 1, -1, -1):
                parent = parents[i]
                if parent >= 0 and listed[i] > listed[parent]:
                    listed[parent] = listed[i]
            closed = np.array(listed, dtype=np.intp)
        return closed

    @cached_property
    def closing(self) -> np.ndarray:
        """The indices as the walk closes them: each run before a start, the rest innermost first."""
        return np.lexsort((-np.arange(len(self)), self.closed_before))

    @cached_property
    def open_at_end(self) -> int:
        """How many intervals are still open after the last one starts (``closing``'s last)."""
        return int(np.count_nonzero(self.closed_before == len(self)))

    def first_opened(self, keys: np.ndarray) -> np.ndarray:
        """Per interval, whether none of the same key is open at its start (a recursion counts once)."""
        count = len(keys)
        sorted_ends = np.sort(self.ends)
        end_rank = np.searchsorted(sorted_ends, self.ends, side="left")  # ends before this one
        start_rank = np.searchsorted(sorted_ends, self.starts, side="right")  # ends at or before the start
        order = np.argsort(keys, kind="stable")
        group = (keys[order].astype(np.int64) + 1) * (count + 1)  # each key's ranks apart, -1's too
        running = np.maximum.accumulate(group + end_rank[order])
        before = np.concatenate(([-1], running[:-1]))
        out = np.empty(count, dtype=bool)
        out[order] = before < group + start_rank[order]
        return out

    def inherited(self, values: np.ndarray, keeps: np.ndarray) -> np.ndarray:
        """Per interval, ``values`` where ``keeps`` is true, else its parent's result (-1 at the top)."""
        count = len(self)
        source = np.where(keeps, np.arange(count), self.parents)  # who decides it, or -1
        while True:
            undecided = (source >= 0) & ~keeps[np.maximum(source, 0)]
            if not undecided.any():
                break
            source = np.where(undecided, source[np.maximum(source, 0)], source)
        return np.where(source >= 0, values[np.maximum(source, 0)], -1)

    @cached_property
    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(times, owners)``: starts and closes in the walk's order, and who owns the stretch up to each
        (a starting interval's parent, a closing interval itself)."""
        count = len(self)
        closing = self.closing
        keys = np.concatenate((2 * self.closed_before[closing], 2 * np.arange(count) + 1))
        order = np.argsort(keys, kind="stable")
        times = np.concatenate((self.ends[closing], self.starts))[order]
        owners = np.concatenate((closing, self.parents))[order]
        return times, owners

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(starts, ends, owners)``: the innermost open interval over each stretch, in time order."""
        times, owners = self.moments
        previous = np.concatenate(([0.0], times[:-1]))
        kept = (times > previous) & (owners >= 0)
        return previous[kept], times[kept], owners[kept]


def covering(intervals: Sequence[Interval], times: Iterable[float], inclusive: bool = True) -> list[list[Interval]]:
    """For each of ``times`` (ascending), the intervals containing it, outermost first, in one pass."""
    out: list[list[Interval]] = []
    open_: list[Interval] = []  # intervals started, their ends not yet known to be passed
    i, count = 0, len(intervals)
    for t in times:
        while i < count and (intervals[i][0] <= t if inclusive else intervals[i][0] < t):
            start = intervals[i][0]
            while open_ and open_[-1][1] < start:
                open_.pop()
            open_.append(intervals[i])
            i += 1
        alive = [iv for iv in open_ if iv[1] >= t] if inclusive else [iv for iv in open_ if iv[1] > t]
        if len(alive) != len(open_):
            open_ = alive.copy()  # those that ended hold no later instant; a copy: more are pushed
        out.append(alive)
    return out


def lanes(starts: Sequence[int], ends: Sequence[int]) -> list[int]:
    """For intervals in ``outer_first`` order, the first track on which each nests."""
    tracks: list[list[int]] = []  # each track's open ends, innermost last
    out: list[int] = []
    for start, end in zip(starts, ends):
        number = 0
        while number < len(tracks):
            track = tracks[number]
            while track and track[-1] <= start:
                track.pop()
            if not track or track[-1] >= end:
                break
            number += 1
        if number == len(tracks):
            tracks.append([])
        tracks[number].append(end)
        out.append(number)
    return out
