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
from typing import Any, TypeVar

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
        ``Stat`` counts its own open calls."""
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
