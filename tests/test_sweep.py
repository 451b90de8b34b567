"""The one interval sweep (analysis/sweep.py) and the Python tables it feeds: every per-thread table
(python stats, top ops, the verdicts' timeline) reads the same nesting, and the workers' tables
come from one sweep per thread."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning.analysis import python_tables
from vt_lightning.analysis.nested_walk import walk_nested
from vt_lightning.analysis.python_tables import PythonStats
from vt_lightning.analysis.steps import read_window
from vt_lightning.analysis.summary import top_python
from vt_lightning.analysis.sweep import by_start, nest
from vt_lightning.analysis.verdicts.window import Timeline, entry_times
from vt_lightning.analysis.workers import FETCH_CATEGORY, worker_summary
from vt_lightning.constants import PYTHON_CATEGORY

USER = "/home/me/project/data.py"
LIB = "/usr/lib/python3.11/site-packages/PIL/Image.py"

pytestmark = pytest.mark.unit


def test_nest_orders_outer_first_clips_to_the_parent_and_names_it() -> None:
    calls = [
        (5.0, 20.0, "child sticking out"),  # starts inside "outer", ends after it
        (0.0, 10.0, "outer"),
        (0.0, 3.0, "first child"),
        (12.0, 14.0, "after"),
        (0.0, 10.0, "outer twin"),  # same span as "outer": after it, in the order given
    ]
    ordered, ends, parents = nest(calls)
    names = [c[2] for c in ordered]
    assert names == ["outer", "outer twin", "first child", "child sticking out", "after"]
    assert ends == [10.0, 10.0, 3.0, 10.0, 14.0]  # clipped to the call it started in
    assert parents == [-1, 0, 1, 1, -1]
    _, raw_ends, _ = nest(calls, clip=False)  # torch's ops keep their own ends
    assert raw_ends == [10.0, 10.0, 3.0, 20.0, 14.0]


def test_timeline_segments_belong_to_the_innermost_call() -> None:
    fetch = f"__getitem__ ({USER}:10)"
    crop = f"crop ({LIB}:99)"
    timeline = Timeline([(0.0, 10.0, fetch), (2.0, 6.0, crop)])
    owners = [(start, end, call, entry) for start, end, call, _, entry, _ in timeline.segments]
    assert owners == [(0.0, 2.0, fetch, fetch), (2.0, 6.0, crop, fetch), (6.0, 10.0, fetch, fetch)]


def _call(name: str, ts: float, dur: float, pid: int, tid: int) -> dict[str, Any]:
    return {"ph": "X", "cat": PYTHON_CATEGORY, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def _worker_events() -> list[dict[str, Any]]:
    """Two workers, the second with two threads; the same user functions in each."""
    events = []
    for pid, tids, scale in ((101, (1,), 1.0), (202, (2, 3), 2.5)):
        for tid in tids:
            for i in range(4):
                base = 100.0 * i
                events.append(_call(f"__getitem__ ({USER}:10)", base, 50.0 * scale, pid, tid))
                events.append(_call(f"augment ({USER}:20)", base + 1, 30.0 * scale, pid, tid))
                events.append(_call(f"resize ({LIB}:5)", base + 2, 10.0 * scale, pid, tid))
    return events


def test_worker_tables_from_one_sweep_equal_a_pass_per_table() -> None:
    """Each worker's table and the all-workers table, taken from the per-thread sweep, are what
    ranking that worker's (or every worker's) calls on their own gives."""
    events = _worker_events()
    workers = [{"pid": 101, "worker": 0, "rank": 0}, {"pid": 202, "worker": 1, "rank": 0}]
    summary = worker_summary(events, workers, [])
    for entry in summary["workers"]:
        own = [e for e in events if e["pid"] == entry["pid"]]
        expected = [e for e in top_python(own, 1, limit=10)["by_self"] if e["origin"] == "user"]
        assert entry["top_python"] == expected[: len(entry["top_python"])]
        assert entry["top_python"], entry
    overall = top_python(events, 1, limit=10)["by_self"]
    assert summary["top_python"] == overall[: len(summary["top_python"])]
    augment = next(e for e in summary["top_python"] if e["function"] == "augment")
    assert augment["calls"] == 12  # 4 calls on each of the three threads, added up


def _random_calls(seed: int, count: int = 400) -> list[tuple[float, float, str]]:
    """Calls of user and library functions (a gc pause among them), nested, overlapping, tied and
    crossing at random, with float times that do not add up exactly."""
    rng = random.Random(seed)
    names = [
        f"__getitem__ ({USER}:10)",
        f"augment ({USER}:20)",
        f"jitter ({USER}:30)",
        f"resize ({LIB}:5)",
        f"crop ({LIB}:9)",
        "<built-in method sleep>",
        "[gc] generation 0",
    ]
    calls = []
    for _ in range(count):
        start = round(rng.uniform(0.0, 1000.0), rng.choice((0, 1, 3)))
        calls.append((start, start + rng.uniform(0.01, 80.0) * rng.random(), rng.choice(names)))
    return calls


@pytest.mark.parametrize("seed", range(5))
def test_entry_times_are_the_timelines_sums(seed: int) -> None:
    """``input_bound`` reads a worker's whole thread through ``entry_times``, which skips building
    the timeline: it must give what summing the timeline's segments gives, to the last bit (the
    summary is compared byte for byte before and after)."""
    calls = _random_calls(seed)
    entries: dict[str, float] = defaultdict(float)
    callees: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for start, end, _, user, entry, _ in Timeline(calls).segments:
        if entry:
            entries[entry] += end - start
            if user and user != entry:
                callees[entry][user] += end - start
    assert entries, "the random calls should enter user code"
    found_entries, found_callees = entry_times(nest(calls))
    assert dict(found_entries) == dict(entries)
    assert {k: dict(v) for k, v in found_callees.items()} == {k: dict(v) for k, v in callees.items()}


def test_worker_tables_from_the_windows_nesting_equal_the_events_path() -> None:
    """The summary hands ``worker_summary`` its ``WindowData`` (whose per-thread nesting the
    verdicts share): the tables are those read from the events alone."""
    events = _worker_events()
    events += [  # and a fetch span per worker: the busy time and batches come from them
        {
            "ph": "X",
            "cat": FETCH_CATEGORY,
            "name": "fetch batch 3",
            "ts": 0.0,
            "dur": 70.0,
            "pid": 101,
            "tid": 1,
            "args": {"batch": 3},
        },
        {
            "ph": "X",
            "cat": FETCH_CATEGORY,
            "name": "fetch batch 4",
            "ts": 5.0,
            "dur": 90.0,
            "pid": 202,
            "tid": 2,
            "args": {"batch": 4},
        },
    ]
    workers = [{"pid": 202, "worker": 1, "rank": 0}, {"pid": 101, "worker": 0, "rank": 0}]
    window = read_window({"traceEvents": events})
    assert worker_summary(events, workers, [], window) == worker_summary(events, workers, [])
    assert [w["batches"] for w in worker_summary(events, workers, [], window)["workers"]] == [[3], [4]]


def _tables(stats: PythonStats, thread: tuple[int, int]) -> list[Any]:
    functions, packages = stats.threads[thread]
    return [
        [(k, s.calls, s.self_us, s.inclusive_us, sorted(s.functions)) for k, s in table.items()]
        for table in (functions, packages)
    ]


def _listed(callees: dict[str, dict[str, float]]) -> list[Any]:
    return [(k, list(v.items())) for k, v in callees.items()]


@pytest.mark.parametrize("seed", range(5))
def test_one_walk_gives_the_tables_and_the_entry_times_of_two(seed: int) -> None:
    """A worker thread is walked once for its tables and ``input_bound``'s entry times
    (``PythonStats.sweep_entries``): both, keys in the same order, equal to the bit what the two
    walks give (``sweep`` and ``entry_times``)."""
    nested = nest(_random_calls(seed))
    thread = (101, 1)
    apart, fused = PythonStats(), PythonStats()
    apart.sweep(thread, nested, None)
    found_entries, found_callees = fused.sweep_entries(thread, nested[0])
    entries, callees = entry_times(nested)
    assert list(found_entries.items()) == list(entries.items()) and entries
    assert _listed(found_callees) == _listed(callees)
    assert _tables(fused, thread) == _tables(apart, thread)
    assert fused.info == apart.info and fused.package_of == apart.package_of


def _nest_by_definition(calls: list[Any]) -> tuple[list[Any], list[float], list[int]]:
    """``nest`` as its docstring defines it: one sort on (start, -end), then a stack of open calls."""
    ordered = sorted(calls, key=lambda c: (c[0], -c[1]))
    ends: list[float] = []
    parents: list[int] = []
    stack: list[int] = []
    for i, (start, end, *_) in enumerate(ordered):
        while stack and ends[stack[-1]] <= start:
            stack.pop()
        parent = stack[-1] if stack else -1
        ends.append(min(end, ends[parent]) if parent >= 0 else end)
        parents.append(parent)
        stack.append(i)
    return ordered, ends, parents


@pytest.mark.parametrize("seed", range(5))
def test_nest_of_calls_given_in_order_is_the_definitions(seed: int) -> None:
    """A worker thread's calls come ordered by start, and ``nest`` then keeps them as given; calls
    in start order that tie (the shorter first) or that are out of order must still come out
    outer-first, with the same ends and parents."""
    calls = _random_calls(seed)
    in_order = sorted(calls, key=lambda c: (c[0], -c[1]))
    distinct = list({c[0]: c for c in in_order}.values())  # strictly increasing starts
    tie_shorter_first = sorted(calls, key=lambda c: (c[0], c[1]))
    assert len(distinct) < len(in_order), "the random calls should have equal starts"
    for calls_given in (distinct, in_order, tie_shorter_first, calls):
        assert nest(calls_given) == _nest_by_definition(calls_given)


def _nested_calls(rng: random.Random, count: int) -> list[tuple[float, float, str]]:
    """Calls that nest, as a DataLoader worker's do once placed: each ends within the call it
    starts in; children that start or end with their parent, zero-length calls, siblings that
    touch, a function inside itself, library code under user code and the other way round."""
    names = [
        f"__getitem__ ({USER}:10)",
        f"augment ({USER}:20)",
        f"resize ({LIB}:5)",
        f"crop ({LIB}:9)",
        "<built-in method sleep>",
        "[gc] generation 0",
    ]
    calls: list[tuple[float, float, str]] = []

    def fill(lo: float, hi: float, depth: int) -> None:
        at = lo
        while len(calls) < count and at < hi and rng.random() < 0.8:
            start = at if rng.random() < 0.3 else rng.uniform(at, at + (hi - at) * rng.random())
            start = min(max(round(start, rng.choice((2, 9))), at), hi)  # ties among the starts
            pick = rng.random()
            end = start if pick < 0.05 else hi if pick < 0.2 else rng.uniform(start, hi)
            calls.append((start, end, rng.choice(names)))
            if depth < 10 and end > start:
                fill(start, end, depth + 1)
            at = end

    origin = 0.1
    while len(calls) < count:
        region_end = origin + rng.uniform(1.0, 500.0)
        fill(origin, region_end, 0)
        origin = region_end + rng.choice((0.0, 0.3))
    return calls


def _stat_rows(stats: PythonStats, thread: tuple[int, int]) -> list[Any]:
    functions, packages = stats.threads[thread]
    return [
        [(k, s.calls, s.open_calls, s.self_us.hex(), s.inclusive_us.hex(), list(s.functions)) for k, s in t.items()]
        for t in (functions, packages)
    ]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from((1, 2, 7, 60, 400, 1500)))
def test_a_nested_thread_walked_as_arrays_is_the_loops_walk_to_the_bit(seed: int, count: int) -> None:
    """A worker thread of many calls is walked as arrays (``nested_walk``) where none is cut: its
    tables (calls, open calls at the end, self and inclusive time, functions per package), its
    entry times and the order of every key are the loop's, each double the same."""
    rng = random.Random(seed)
    ordered = by_start(_nested_calls(rng, count))
    thread = (101, 1)
    as_arrays, as_loop = PythonStats(), PythonStats()
    found = as_arrays._sweep_entries_as_arrays(thread, ordered)
    assert found is not None, "nested calls are walked as arrays"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(python_tables, "ARRAY_WALK_MIN_CALLS", len(ordered) + 1)
        expected = as_loop.sweep_entries(thread, ordered)
    hexed = [
        [(k, [(c, v.hex()) for c, v in d.items()]) for k, d in part.items()] for part in ({"": found[0]}, found[1])
    ]
    wanted = [
        [(k, [(c, v.hex()) for c, v in d.items()]) for k, d in part.items()]
        for part in ({"": expected[0]}, expected[1])
    ]
    assert hexed == wanted
    assert _stat_rows(as_arrays, thread) == _stat_rows(as_loop, thread)
    assert as_arrays.info == as_loop.info and as_arrays.package_of == as_loop.package_of


def test_a_thread_whose_walk_cuts_a_call_is_not_walked_as_arrays() -> None:
    """A call that ends after the call it starts in is cut by the walk: the arrays do not model
    that, so ``sweep_entries`` walks such a thread in its loop, with the same result either way."""
    calls = by_start(_random_calls(0, count=2000))
    starts = np.array([c[0] for c in calls])
    ends = np.array([c[1] for c in calls])
    assert walk_nested(starts, ends) is None
    nested = by_start(_nested_calls(random.Random(1), 2000))
    walk = walk_nested(np.array([c[0] for c in nested]), np.array([c[1] for c in nested]))
    assert walk is not None
    ordered, _, parents = nest(nested)
    assert ordered == nested and walk.parents.tolist() == parents
    thread = (101, 1)
    whole = PythonStats()
    assert whole.sweep_entries(thread, calls) == PythonStats().sweep_entries(thread, nest(calls)[0])
