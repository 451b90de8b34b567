"""The Python tables: per thread, per function and per package and phase, calls, self and
inclusive time, from one ``sweep.nest`` and one stack walk per thread. Pure.

``summary.py`` ranks them (the window's ``top_python``), ``workers.worker_summary`` reads the
DataLoader workers' threads whole; ``PythonStats.sweep_entries`` walks a whole thread once for its
tables and for the ``input_bound`` verdict's entry times (``verdicts/window.entry_times``' sums),
nesting the calls as it goes (no ``sweep.nest`` of its own), and ``steps.WindowData.walk`` keeps
that walk per thread, so a worker thread is walked once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, TypeVar

import numpy as np

from vt_lightning.analysis.nested_walk import NestedWalk, first_opened, inherited, walk_nested
from vt_lightning.analysis.phases import PhaseSegments
from vt_lightning.analysis.spans import Span
from vt_lightning.analysis.sweep import Nested, nest
from vt_lightning.analysis.usercode import GENERATED, code_origin, parse_function
from vt_lightning.constants import GC_SPAN_PREFIX, PYTHON_CATEGORY

FOLDED_ORIGINS = ("package", GENERATED)  # folded to one line per package and phase in the rankings
GENERATED_PACKAGE = "torch.compile generated code"  # the one line of every compiler-generated function
# Per entry (the user call that entered user code from library code), µs; and per entry, µs per
# innermost user callee: ``verdicts/window.entry_times``' result.
EntryTimes = tuple[dict[str, float], dict[str, dict[str, float]]]


Key = TypeVar("Key")
_OUTSIDE_USER = (None, None, False)  # ``sweep_entries``' (user, entry, is_user) of a top library call
# A thread of at least this many calls is walked as arrays (``nested_walk``) where none is cut:
# below it, numpy's fixed costs outweigh the loop's ~1.5 µs a call.
ARRAY_WALK_MIN_CALLS = 1000
_START, _END, _NAME = itemgetter(0), itemgetter(1), itemgetter(2)  # of a call (start, end, name)


class Stat:
    __slots__ = ("calls", "functions", "inclusive_us", "open_calls", "self_us")

    def __init__(self) -> None:
        self.calls = 0
        self.open_calls = 0  # a sweep's calls of it still open (an attribute: cheaper than a dict)
        self.self_us = 0.0
        self.inclusive_us = 0.0
        self.functions: set[str] = set()

    def add(self, other: Stat) -> None:
        self.calls += other.calls
        self.self_us += other.self_us
        self.inclusive_us += other.inclusive_us
        self.functions |= other.functions


def _add_into(into: dict[Key, Stat], part: Mapping[Key, Stat]) -> None:
    for key, stat in part.items():
        found = into.get(key)
        if found is None:
            found = into[key] = Stat()
        found.add(stat)


FoldKey = tuple[str, str]  # (package, phase): one folded line; phase "" in a window without phases
Thread = tuple[Any, Any]  # (pid, tid)
# One thread's tables: per function, and per package and phase.
ThreadStats = tuple[dict[str, Stat], dict[FoldKey, Stat]]


class PythonStats:
    """``python_stats``'s result: every thread's tables (``threads``) and what each function is
    (``info``); ``merged`` adds up any threads, so one sweep per thread feeds every table that
    reads them (the window's, each DataLoader worker's, all workers')."""

    def __init__(self) -> None:
        self.threads: dict[Thread, ThreadStats] = {}
        self.info: dict[str, dict] = {}
        self.package_of: dict[str, str] = {}  # function name -> its package when folded, else ""
        self.user: dict[str, bool] = {}  # function name -> the user's own code (a gc pause never is)

    def merged(self, threads: Iterable[Thread] | None = None) -> ThreadStats:
        """The tables of ``threads`` (all by default) added up, in their order."""
        chosen = [self.threads[t] for t in (self.threads if threads is None else threads) if t in self.threads]
        if len(chosen) == 1:
            return chosen[0]
        functions: dict[str, Stat] = {}
        packages: dict[FoldKey, Stat] = {}
        for thread_functions, thread_packages in chosen:
            _add_into(functions, thread_functions)
            _add_into(packages, thread_packages)
        return functions, packages

    def _describe(self, name: str) -> str:
        function, path, line = parse_function(name)
        origin, package = code_origin(path)
        if origin == GENERATED:  # a compiler's modules fold to one line, like a package's
            package = GENERATED_PACKAGE
        self.info[name] = {"function": function, "file": path, "line": line, "origin": origin, "package": package}
        self.user[name] = origin == "user" and not name.startswith(GC_SPAN_PREFIX)
        folded = self.package_of[name] = (package or "") if origin in FOLDED_ORIGINS else ""
        return folded

    def sweep(self, thread: Thread, nested: Nested, phases: PhaseSegments | None) -> None:
        """One thread's calls, ``sweep.nest``-ed, into its tables: each call ``(start, end, name,
        began)`` (``began``: before clipping to the region; read only with ``phases``, so a window's
        unclipped ``(start, end, name)`` calls do too); runs once per Python event, so it is written
        for speed."""
        functions: dict[str, Stat] = {}
        packages: dict[FoldKey, Stat] = {}
        package_of = self.package_of
        ordered, ends, parents = nested
        count = len(ordered)
        child_us = [0.0] * count
        stats: list[Stat] = [None] * count  # type: ignore[list-item]
        folds: list[Stat | None] = [None] * count
        fold_keys: list[FoldKey | None] = [None] * count
        stack: list[int] = []
        open_count: dict[str, int] = defaultdict(int)  # open calls per function name
        open_folds: dict[FoldKey, int] = defaultdict(int)  # open calls per fold key

        for i, call in enumerate(ordered):
            start, name = call[0], call[2]
            parent = parents[i]
            while stack and stack[-1] != parent:
                done = stack.pop()
                own = ends[done] - ordered[done][0] - child_us[done]  # its self time
                if own > 0:
                    stats[done].self_us += own
                    if folds[done] is not None:
                        folds[done].self_us += own  # type: ignore[union-attr]
                open_count[ordered[done][2]] -= 1
                if fold_keys[done] is not None:
                    open_folds[fold_keys[done]] -= 1  # type: ignore[index]
            dur = ends[i] - start
            fstat = functions.get(name)
            if fstat is None:
                package = package_of.get(name)
                if package is None:
                    package = self._describe(name)
                fstat = functions[name] = Stat()
            else:
                package = package_of[name]
            stats[i] = fstat
            fstat.calls += 1
            if not open_count[name]:
                fstat.inclusive_us += dur
            open_count[name] += 1
            if package:
                fkey = (package, phases.at(call[3]) if phases is not None else "")
                pstat = packages.get(fkey)
                if pstat is None:
                    pstat = packages[fkey] = Stat()
                pstat.calls += 1
                pstat.functions.add(name)
                if not open_folds[fkey]:
                    pstat.inclusive_us += dur
                open_folds[fkey] += 1
                folds[i], fold_keys[i] = pstat, fkey
            if parent >= 0:
                child_us[parent] += dur
            stack.append(i)
        for done in stack:
            own = ends[done] - ordered[done][0] - child_us[done]
            if own > 0:
                stats[done].self_us += own
                if folds[done] is not None:
                    folds[done].self_us += own  # type: ignore[union-attr]
        self.threads[thread] = (functions, packages)

    def sweep_entries(self, thread: Thread, ordered: Sequence[tuple[float, float, str]]) -> EntryTimes:
        """``sweep(thread, nest(ordered), None)`` and ``verdicts/window.entry_times(nest(ordered))``
        in one walk over a whole thread's calls, already in ``sweep.by_start`` order: the same
        tables, and the same entry times to the last bit (each sum the same subtractions, added in
        the same order as the timeline's segments). The walk nests the calls itself (a worker's
        163k calls are walked once, not twice). Without phases a function's fold line is fixed by
        its name, so one lookup per call finds both its stats and whether it is the user's; each
        ``Stat`` counts its own open calls. A long thread none of whose calls the walk cuts (a
        DataLoader worker's) is walked as arrays instead (``_sweep_entries_as_arrays``)."""
        if len(ordered) >= ARRAY_WALK_MIN_CALLS:
            as_arrays = self._sweep_entries_as_arrays(thread, ordered)
            if as_arrays is not None:
                return as_arrays
        functions: dict[str, Stat] = {}
        packages: dict[FoldKey, Stat] = {}
        package_of, user_of = self.package_of, self.user
        # name -> (its Stat, its fold line's Stat or None, the user's own code)
        seen: dict[str, tuple[Stat, Stat | None, bool]] = {}
        seen_get = seen.get
        count = len(ordered)
        ends: list[float] = []  # each call's end, cut to the end of the call it started in (nest's)
        add_end = ends.append
        child_us = [0.0] * count
        stats: list[Stat] = [None] * count  # type: ignore[list-item]
        folds: list[Stat | None] = [None] * count
        stack: list[int] = [-1]  # open calls' indices on a sentinel -1, the parent of a top call
        push, pop = stack.append, stack.pop
        entries: dict[str, float] = defaultdict(float)
        callees: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        opened: list[tuple[str | None, str | None, bool]] = []  # per call: user, entry, is_user
        add_open = opened.append
        cursor = 0.0
        top_end = math.inf  # the innermost open call's (cut) end

        for i, call in enumerate(ordered):
            start, end, name = call[0], call[1], call[2]
            while top_end <= start:  # the open calls that ended before this one, innermost first
                done = pop()
                done_end = top_end
                own = done_end - ordered[done][0] - child_us[done]
                dstat = stats[done]
                dfold = folds[done]
                if own > 0:
                    dstat.self_us += own
                    if dfold is not None:
                        dfold.self_us += own
                dstat.open_calls -= 1
                if dfold is not None:
                    dfold.open_calls -= 1
                if done_end > cursor:
                    user, entry, _ = opened[done]
                    if entry:
                        entries[entry] += done_end - cursor
                        if user and user != entry:
                            callees[entry][user] += done_end - cursor
                cursor = done_end
                top_end = ends[stack[-1]] if len(stack) > 1 else math.inf
            parent = stack[-1]
            if end > top_end:
                end = top_end
            add_end(end)
            dur = end - start
            found = seen_get(name)
            if found is None:
                package = package_of.get(name)
                if package is None:
                    package = self._describe(name)
                fstat = functions[name] = Stat()
                pstat = None
                if package:
                    fkey = (package, "")
                    pstat = packages.get(fkey)
                    if pstat is None:
                        pstat = packages[fkey] = Stat()
                    pstat.functions.add(name)
                is_user = user_of[name]
                seen[name] = (fstat, pstat, is_user)
            else:
                fstat, pstat, is_user = found
            stats[i] = fstat
            fstat.calls += 1
            if not fstat.open_calls:
                fstat.inclusive_us += dur
            fstat.open_calls += 1
            if pstat is not None:
                pstat.calls += 1
                if not pstat.open_calls:
                    pstat.inclusive_us += dur
                pstat.open_calls += 1
                folds[i] = pstat
            if parent >= 0:
                child_us[parent] += dur
                above = opened[parent]
                user, entry, parent_is_user = above
                if start > cursor and entry:
                    entries[entry] += start - cursor
                    if user and user != entry:
                        callees[entry][user] += start - cursor
                if is_user:
                    add_open((name, entry if parent_is_user else name, True))
                else:  # a library call under a library call shares its parent's (equal) tuple
                    add_open(above if not parent_is_user else (user, entry, False))
            else:
                add_open((name, name, True) if is_user else _OUTSIDE_USER)
            push(i)
            cursor, top_end = start, end
        del stack[0]
        for done in stack:
            own = ends[done] - ordered[done][0] - child_us[done]
            if own > 0:
                stats[done].self_us += own
                if folds[done] is not None:
                    folds[done].self_us += own  # type: ignore[union-attr]
        while stack:
            done = stack.pop()
            done_end = ends[done]
            if done_end > cursor:
                user, entry, _ = opened[done]
                if entry:
                    entries[entry] += done_end - cursor
                    if user and user != entry:
                        callees[entry][user] += done_end - cursor
            cursor = done_end
        self.threads[thread] = (functions, packages)
        return entries, callees

    def _sweep_entries_as_arrays(
        self, thread: Thread, ordered: Sequence[tuple[float, float, str]]
    ) -> EntryTimes | None:
        """``sweep_entries`` from ``nested_walk``'s arrays, or None where the walk would cut a call.
        Each sum adds the loop's doubles in the loop's order (``np.bincount``); each dict gets its
        keys in the order the loop first touches them."""
        count = len(ordered)
        walk = walk_nested(
            np.fromiter(map(_START, ordered), dtype=float, count=count),
            np.fromiter(map(_END, ordered), dtype=float, count=count),
        )
        if walk is None:
            return None
        names, codes = _name_codes(ordered)
        functions: dict[str, Stat] = {}
        packages: dict[FoldKey, Stat] = {}
        fold_of = np.full(len(names), -1, dtype=np.intp)
        folds: list[Stat] = []
        fold_index: dict[FoldKey, int] = {}
        for i, name in enumerate(names):  # first seen in this order, as the loop sees them
            package = self.package_of.get(name)
            if package is None:
                package = self._describe(name)
            functions[name] = Stat()
            if package:
                fkey = (package, "")
                at = fold_index.get(fkey)
                if at is None:
                    at = fold_index[fkey] = len(folds)
                    folds.append(Stat())
                    packages[fkey] = folds[at]
                folds[at].functions.add(name)
                fold_of[i] = at
        call_folds = fold_of[codes]
        _fill(list(functions.values()), walk, codes, len(names))
        if folds:
            _fill(folds, walk, call_folds, len(folds))
        self.threads[thread] = (functions, packages)
        user_names = np.array([self.user[name] for name in names], dtype=bool)
        return _entry_times(walk, codes, user_names, names)


class _Codes(dict[str, int]):
    """Each name's index in the order names are first looked up: one dict lookup per call, at C
    speed but for each name's first."""

    def __missing__(self, name: str) -> int:
        code = self[name] = len(self)
        return code


def _name_codes(ordered: Sequence[tuple[float, float, str]]) -> tuple[list[str], np.ndarray]:
    """The distinct names of ``ordered``'s calls in the order they first occur, and each call's
    index in them."""
    code_of = _Codes()
    codes = np.fromiter(map(code_of.__getitem__, map(_NAME, ordered)), dtype=np.intp, count=len(ordered))
    return list(code_of), codes


def _fill(stats: list[Stat], walk: NestedWalk, keys: np.ndarray, count: int) -> None:
    """Each call's counts into ``stats[keys]`` (-1: none) as the loop adds them: calls; inclusive
    time where no call of its key is open at its start, in order; self time where positive, in the
    order calls close (the ones open at the end outermost first); open calls at the end."""
    keyed = keys >= 0
    calls = np.bincount(keys[keyed], minlength=count)
    outer = keyed & first_opened(walk, keys)
    inclusive = np.bincount(keys[outer], weights=walk.lengths[outer], minlength=count)
    still_open = walk.open_at_end
    closed = walk.closing[: len(walk.closing) - len(still_open)]
    by_close = np.concatenate((closed, still_open))
    adds = by_close[(walk.own[by_close] > 0) & keyed[by_close]]
    own = np.bincount(keys[adds], weights=walk.own[adds], minlength=count)
    open_calls = np.bincount(keys[still_open][keyed[still_open]], minlength=count)
    for stat, n, incl, self_us, left in zip(
        stats, calls.tolist(), inclusive.tolist(), own.tolist(), open_calls.tolist(), strict=True
    ):
        stat.calls += n
        stat.inclusive_us += incl
        stat.self_us += self_us
        stat.open_calls += left


def _entry_times(walk: NestedWalk, codes: np.ndarray, user_names: np.ndarray, names: list[str]) -> EntryTimes:
    """The loop's entry times: the time from each start or close to the next, owned by the call
    open then (the parent of a starting call, the closing call), added to its entry (the user call
    that entered user code from library code) and to its innermost user call under that entry."""
    count = len(codes)
    user_calls = user_names[codes]
    parent_is_user = np.where(walk.parents >= 0, user_calls[np.maximum(walk.parents, 0)], False)
    users = inherited(walk, codes, user_calls)
    entries_of = inherited(walk, codes, user_calls & ~parent_is_user)
    # The walk's moments: each close (before the start that closes it) and each start, in order.
    closing = walk.closing
    keys = np.concatenate((2 * walk.closed_before[closing], 2 * np.arange(count) + 1))
    order = np.argsort(keys, kind="stable")
    times = np.concatenate((walk.ends[closing], walk.starts))[order]
    owners = np.concatenate((closing, walk.parents))[order]
    spans = times - np.concatenate(([0.0], times[:-1]))
    named = np.array([bool(name) for name in names] + [False], dtype=bool)  # [-1]: none
    entry = np.where(owners >= 0, entries_of[owners], -1)
    user = np.where(owners >= 0, users[owners], -1)
    counted = (spans > 0) & named[entry]
    entries: dict[str, float] = defaultdict(float)
    callees: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, total in _sums_in_first_order(entry[counted], spans[counted]):
        entries[names[key]] = total
    under = counted & named[user] & (user != entry)
    pairs = entry[under] * len(names) + user[under]
    for key, total in _sums_in_first_order(pairs, spans[under]):
        callees[names[key // len(names)]][names[key % len(names)]] = total
    return entries, callees


def _sums_in_first_order(keys: np.ndarray, values: np.ndarray) -> list[tuple[int, float]]:
    """``(key, sum of its values added in order)`` for each key, in the order keys first occur."""
    if not len(keys):
        return []
    distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=values)
    order = np.argsort(first, kind="stable")
    return list(zip(distinct[order].tolist(), sums[order].tolist(), strict=True))


def python_stats(
    events: Sequence[Mapping[str, Any]], region: Span | None = None, phases: PhaseSegments | None = None
) -> PythonStats:
    """Per thread, per function and per package and phase (the breakdown part its call started in,
    from ``phases``; "" without them): calls, self time, inclusive time (a recursive call or a call
    under another call of the same package and phase is counted once), of the calls within
    ``region`` (each clipped to it; a call that started before it is in phase ``other``). One pass
    over the events, then one ``sweep.nest`` and one stack walk per thread."""
    by_thread: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for event in events:
        if event.get("cat") == PYTHON_CATEGORY:
            start = float(event["ts"])
            by_thread[(event.get("pid"), event.get("tid"))].append(
                (start, start + float(event.get("dur", 0.0) or 0.0), event.get("name", ""))
            )
    return python_stats_of(by_thread, region, phases)


def python_stats_of(
    calls: Mapping[Thread, Sequence[tuple[float, float, str]]],
    region: Span | None = None,
    phases: PhaseSegments | None = None,
) -> PythonStats:
    """``python_stats`` of calls already read per thread (``WindowData.python_calls``)."""
    lo, hi = region if region is not None else (float("-inf"), float("inf"))
    out = PythonStats()
    for thread, found in calls.items():
        kept = [(max(s, lo), min(e, hi), name, s) for s, e, name in found if e > lo and s < hi]
        if kept:
            out.sweep(thread, nest(kept), phases)
    return out
