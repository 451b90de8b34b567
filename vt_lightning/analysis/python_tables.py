"""The Python tables: per thread, per function and per package and phase, calls, self and
inclusive time, read off the thread's one ``nest.Nest``; and the entry times ``input_bound`` reads.
Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from vt_lightning.analysis.breakdown import OUTSIDE, PhaseSegments
from vt_lightning.analysis.nest import Nest
from vt_lightning.analysis.spans import Span
from vt_lightning.analysis.trace import Calls, Thread
from vt_lightning.analysis.usercode import GENERATED, function_origin, parse_function
from vt_lightning.constants import GC_SPAN_PREFIX

FOLDED_ORIGINS = ("package", GENERATED)  # folded to one line per package and phase in the rankings
GENERATED_PACKAGE = "torch.compile generated code"  # the one line of every compiler-generated function
# µs per entry, and per entry µs per innermost user callee: ``entry_times``' result
EntryTimes = tuple[dict[str, float], dict[str, dict[str, float]]]


Key = TypeVar("Key")


class Stat:
    __slots__ = ("calls", "functions", "inclusive_us", "self_us")

    def __init__(self) -> None:
        self.calls = 0
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
# One thread's tables: per function, and per package and phase.
ThreadStats = tuple[dict[str, Stat], dict[FoldKey, Stat]]


class PythonStats:
    """Every thread's tables and what each function is; ``merged`` adds up any threads."""

    def __init__(self, command: Container[str] = ()) -> None:
        self.command = command  # the window's `python -c` functions (usercode.function_origin)
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
        origin, package = function_origin(name, self.command)
        if origin == GENERATED:  # a compiler's modules fold to one line, like a package's
            package = GENERATED_PACKAGE
        self.info[name] = {"function": function, "file": path, "line": line, "origin": origin, "package": package}
        self.user[name] = origin == "user" and not name.startswith(GC_SPAN_PREFIX)
        folded = self.package_of[name] = (package or "") if origin in FOLDED_ORIGINS else ""
        return folded

    def add(
        self,
        thread: Thread,
        nest: Nest,
        names: Sequence[str],
        phases: PhaseSegments | None = None,
        began: np.ndarray | None = None,
    ) -> tuple[list[str], np.ndarray]:
        """One thread's calls into its tables: calls, self time (added as calls close) and inclusive time
        (a call inside another of its key counts once). Returns the distinct names and each call's code."""
        distinct, codes = name_codes(names)
        package_of = self.package_of
        functions: dict[str, Stat] = {}
        for name in distinct:
            if name not in package_of:
                self._describe(name)
            functions[name] = Stat()
        packages, call_folds = _folds(distinct, codes, [package_of[name] for name in distinct], phases, began)
        by_close = _close_order(nest)
        _fill(list(functions.values()), nest, codes, by_close)
        if packages:
            _fill(list(packages.values()), nest, call_folds, by_close)
        self.threads[thread] = (functions, packages)
        return distinct, codes

    def entry_times(self, nest: Nest, distinct: list[str], codes: np.ndarray) -> EntryTimes:
        """µs per entry (a user call entered from library code), and per entry per innermost user callee."""
        user_names = np.array([self.user[name] for name in distinct], dtype=bool)
        return _entry_times(nest, codes, user_names, distinct)


class _Codes(dict[str, int]):
    """Each name's index in the order names are first looked up."""

    def __missing__(self, name: str) -> int:
        code = self[name] = len(self)
        return code


def name_codes(names: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct ``names`` in the order they first occur, and each one's index in them."""
    code_of = _Codes()
    codes = np.fromiter(map(code_of.__getitem__, names), dtype=np.intp, count=len(names))
    return list(code_of), codes


def _first_order(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``values`` in the order they first occur, and each value's index in them."""
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(distinct), dtype=np.intp)
    rank[order] = np.arange(len(distinct))
    return distinct[order], rank[inverse.ravel()]


def _folds(
    distinct: list[str],
    codes: np.ndarray,
    folded: list[str],
    phases: PhaseSegments | None,
    began: np.ndarray | None,
) -> tuple[dict[FoldKey, Stat], np.ndarray]:
    """The (package, phase) fold lines in first-call order, with their functions, and each call's line."""
    package_names = list(dict.fromkeys(package for package in folded if package))
    package_code = {package: i for i, package in enumerate(package_names)}
    name_package = np.array([package_code.get(package, -1) for package in folded], dtype=np.intp)
    call_package = name_package[codes]
    has = call_package >= 0
    if phases is None or began is None:
        parts, call_part = [""], np.zeros(len(codes), dtype=np.intp)
    else:
        parts = list(dict.fromkeys([OUTSIDE, *phases.parts]))
        segment_part = np.array([parts.index(part) for part in (OUTSIDE, *phases.parts)], dtype=np.intp)
        call_part = segment_part[phases.segments_at(began)]
    lines, line_of = _first_order((call_package * len(parts) + call_part)[has])
    packages = {(package_names[key // len(parts)], parts[key % len(parts)]): Stat() for key in lines.tolist()}
    call_folds = np.full(len(codes), -1, dtype=np.intp)
    call_folds[has] = line_of
    stats = list(packages.values())
    for pair in np.unique(line_of * len(distinct) + codes[has]).tolist():
        stats[pair // len(distinct)].functions.add(distinct[pair % len(distinct)])
    return packages, call_folds


def _close_order(nest: Nest) -> np.ndarray:
    """Calls as they close, then the ones open at the end, outermost first: self times' order."""
    closing = nest.closing
    still_open = nest.open_at_end
    return np.concatenate((closing[: len(closing) - still_open], closing[len(closing) - still_open :][::-1]))


def _fill(stats: list[Stat], nest: Nest, keys: np.ndarray, by_close: np.ndarray) -> None:
    """Each call's counts into ``stats[keys]`` (-1: none), in the walk's orders."""
    count = len(stats)
    keyed = keys >= 0
    calls = np.bincount(keys[keyed], minlength=count)
    outer = keyed & nest.first_opened(keys)
    inclusive = np.bincount(keys[outer], weights=nest.lengths[outer], minlength=count)
    own = nest.own
    adds = by_close[(own[by_close] > 0) & keyed[by_close]]
    self_us = np.bincount(keys[adds], weights=own[adds], minlength=count)
    for stat, n, incl, own_us in zip(stats, calls.tolist(), inclusive.tolist(), self_us.tolist(), strict=True):
        stat.calls += n
        stat.inclusive_us += incl
        stat.self_us += own_us


def _entry_times(nest: Nest, codes: np.ndarray, user_names: np.ndarray, names: list[str]) -> EntryTimes:
    """Each stretch's time to its owner's entry, and to its innermost user call under that entry."""
    count = len(codes)
    parents = nest.parents
    user_calls = user_names[codes] if count else np.empty(0, dtype=bool)
    parent_is_user = np.where(parents >= 0, user_calls[np.maximum(parents, 0)], False) if count else user_calls
    users = nest.inherited(codes, user_calls)
    entries_of = nest.inherited(codes, user_calls & ~parent_is_user)
    times, owners = nest.moments
    spans = times - np.concatenate(([0.0], times[:-1]))
    named = np.array([bool(name) for name in names] + [False], dtype=bool)  # [-1]: none
    entry = np.where(owners >= 0, entries_of[np.maximum(owners, 0)], -1) if count else owners
    user = np.where(owners >= 0, users[np.maximum(owners, 0)], -1) if count else owners
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
    distinct, index = _first_order(keys)
    return list(zip(distinct.tolist(), np.bincount(index, weights=values).tolist(), strict=True))


def python_stats_of(
    calls: Mapping[Thread, Calls],
    region: Span | None = None,
    phases: PhaseSegments | None = None,
    command: Container[str] = (),
) -> PythonStats:
    """Each thread's tables of the calls within ``region`` (clipped), folded by the phase they began in."""
    lo, hi = region if region is not None else (float("-inf"), float("inf"))
    out = PythonStats(command)
    for thread, found in calls.items():
        kept, began = found.within(lo, hi)
        if len(kept):
            out.add(thread, kept.nest, kept.ordered_names, phases, began[kept.nest.order])
    return out
