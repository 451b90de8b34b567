"""The merge's passes as one pipeline (issue 39 fused some): whatever the events, every thread of
the merged trace nests on the nanosecond grid Perfetto reads; the contract check, the unrun steps'
removal and the per-thread grouping done in one pass behave as the passes run apart (written out
here as the reference); and the DataLoader workers' calls, placed as they are read, merge as if
the merge had placed them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.merge import (
    FALLBACK_CATEGORY,
    PYTHON_CATEGORY,
    STAMP_JITTER_US,
    PythonParts,
    merge_metadata_events,
    merge_trace,
    merge_window,
    rebase_events,
    snap_to_nanoseconds,
    time_origin_us,
)
from vt_lightning.analysis.nesting import (
    repair_boundaries,
    separate_crossing_ranges,
    untangle_annotations,
)
from vt_lightning.analysis.summary import summarize
from vt_lightning.analysis.trace import ThreadSpans, WindowTrace
from vt_lightning.constants import STEP_PREFIX

BASE_NS = 1_700_000_000_000_000_000


def _calibration(uncertainty_us: float = 0.0) -> Calibration:
    pair = ClockPair(python_us=0.0, wall_ns=BASE_NS, round_trip_us=2 * uncertainty_us)
    return Calibration(pair, pair, BASE_NS)


def _crossing_pairs(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """X events of one (pid, tid) that overlap without nesting, in integer ns as Perfetto reads them."""
    by_thread: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            start = round(e["ts"] * 1000)
            by_thread[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000), e["name"]))
    found = []
    for spans in by_thread.values():
        for i, (s1, e1, n1) in enumerate(spans):
            for s2, e2, n2 in spans[i + 1 :]:
                if s1 < s2 < e1 < e2 or s2 < s1 < e2 < e1:
                    found.append((n1, n2))
    return found


call = st.fixed_dictionaries(
    {
        "ph": st.just("X"),
        "name": st.sampled_from(["f (a.py:1)", "g (b.py:2)", "<built-in method h>"]),
        "pid": st.just(1),
        "tid": st.integers(1, 3),  # thread 1 also has ops and a range; 2 and 3 nothing but calls
        "ts": st.floats(min_value=0, max_value=200, allow_nan=False).map(lambda t: round(t, 4)),
        "dur": st.floats(min_value=0, max_value=120, allow_nan=False).map(lambda t: round(t, 4)),
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(call, max_size=25))
def test_every_thread_nests_on_the_nanosecond_grid_whatever_the_calls(calls: list[dict[str, Any]]) -> None:
    # Calls placed anywhere cross each other (a worker's library spans, noted on its side, cross its
    # VizTracer calls so); threads with nothing but calls skip the last nesting pass.
    torch_events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 50.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 60.0, "dur": 30.0},
    ]
    merged = merge_trace(
        {"traceEvents": torch_events}, [dict(c) for c in calls], _calibration(), {"version": "t", "steps": [0]}
    )
    events = merged["traceEvents"]
    assert _crossing_pairs(events) == []
    assert sum(e.get("cat") == PYTHON_CATEGORY for e in events) == len(calls)  # cut, never dropped


def test_unrun_steps_leave_and_are_not_cut_around_while_broken_events_are_fixed() -> None:
    torch_events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0, "dur": 40.0},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 50.0, "dur": 50.0},
        {"ph": "i", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 50.0},
        {"ph": "X", "name": 7, "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0},  # no cat, a number for a name
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20.0},  # no dur
    ]
    # Opens the unrun step's range at 50 and returns at 60: cut only if that range stayed.
    opener = {"ph": "X", "name": "hook (a.py:1)", "pid": 1, "tid": 1, "ts": 45.0, "dur": 15.0}
    merged = merge_trace({"traceEvents": torch_events}, [opener], _calibration(), {"version": "t", "steps": [1]})
    events = merged["traceEvents"]
    names = [e["name"] for e in events]
    assert "ProfilerStep#2" not in names and names.count("ProfilerStep#1") == 1
    assert merged["vt_lightning"]["contract_fixes"] == 3  # the name, the cat, the dur
    fixed = next(e for e in events if e["name"] == "7")
    assert fixed["cat"] == "unknown"
    assert next(e for e in events if e["name"] == "aten::mm")["dur"] == 0.0
    hook = next(e for e in events if e["name"] == "hook (a.py:1)")
    assert (hook["ts"], hook["dur"]) == (45.0, 15.0) and "args" not in hook
    assert merged["vt_lightning"]["nesting"]["cut_at_annotations"] == 0


def shift_python_events(
    events: Iterable[dict[str, Any]], calibration: Calibration, origin_us: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Place VizTracer events on torch's timeline (less ``origin_us``). Returns (timed, metadata).

    Start and end of each call go through the same monotonic map (offset plus interpolated drift),
    so calls that nest on VizTracer's clock nest on torch's; shifting ``ts`` alone and keeping
    ``dur`` would let a child outlast its parent by the drift accumulated between their starts.
    """
    timed: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    # Calibration.python_to_torch_us, inlined: this loop runs once per Python event.
    t0, t1 = calibration.start.python_us, calibration.end.python_us
    offset, drift = calibration.offset_us - origin_us, calibration.drift_us
    slope = drift / (t1 - t0) if t1 > t0 else 0.0
    span = t1 - t0
    for event in events:
        ph = event.get("ph")
        if ph == "M":
            meta.append(event)
            continue
        if "ts" in event:
            ts = float(event["ts"])
            # slope * (ts - t0) clamped to [0, span], written out: min()/max() calls cost a third
            # of this loop, which runs once per Python event.
            since = ts - t0
            drifted = slope * (0.0 if since < 0.0 else span if since > span else since) if slope else 0.0
            start = ts + offset + drifted
            event["ts"] = start
            if ph == "X":
                end_py = ts + float(event.get("dur", 0.0))
                since = end_py - t0
                drifted = slope * (0.0 if since < 0.0 else span if since > span else since) if slope else 0.0
                end = end_py + offset + drifted
                event["dur"] = end - start if end > start else 0.0
        if ph == "X":
            event["cat"] = PYTHON_CATEGORY
            event.setdefault("dur", 0.0)
        elif not isinstance(event.get("cat"), str):
            event["cat"] = PYTHON_CATEGORY
        timed.append(event)
    return timed, meta


def settle_contract(events: list[dict[str, Any]], steps: list[int]) -> tuple[int, ThreadSpans]:
    """Every event named, every X event with a string cat and a ts and dur (counting the fixes, an
    unrun step's too), the ``ProfilerStep#N`` ranges of batches that never ran removed, the rest
    grouped: the contract as its own pass."""
    ran = {f"{STEP_PREFIX}{step}" for step in steps}
    fixed = 0
    kept = []
    for event in events:
        if not isinstance(event.get("name"), str):
            event["name"] = str(event.get("name", ""))
            fixed += 1
        if event.get("ph") == "X":
            if not isinstance(event.get("cat"), str):
                event["cat"] = FALLBACK_CATEGORY
                fixed += 1
            for key in ("ts", "dur"):
                if key not in event:
                    event[key] = 0.0
                    fixed += 1
        if not (event["name"].startswith(STEP_PREFIX) and event["name"] not in ran):
            kept.append(event)
    events[:] = kept
    return fixed, ThreadSpans(events)


def _passes_apart(
    torch_trace: dict[str, Any], python_events: list[dict[str, Any]], calibration: Calibration, steps: list[int]
) -> tuple[list[dict[str, Any]], int, int]:
    """``merge_trace``'s events as its passes make them run one after the other, each over the whole
    window (before issue 39 fused the shift, the contract and the snap into the loops around them)."""
    torch_events = list(torch_trace["traceEvents"])
    origin = time_origin_us(torch_events)
    rebase_events(torch_events, origin)
    timed, meta = shift_python_events(python_events, calibration, origin)
    events = merge_metadata_events(torch_events, meta)
    events.extend(timed)
    fixed, threads = settle_contract(events, steps)
    repair_boundaries(events, calibration.uncertainty_us + STAMP_JITTER_US, threads)
    cut = untangle_annotations(events, threads)
    snap_to_nanoseconds(events)
    separate_crossing_ranges(events, threads, calls_nest=True)
    return events, fixed, cut


torch_event = st.one_of(
    st.fixed_dictionaries(
        {
            "ph": st.just("X"),
            "cat": st.sampled_from(["cpu_op", "user_annotation", "python_function", "gpu_user_annotation"]),
            "name": st.sampled_from(["aten::mm", "ProfilerStep#0", "ProfilerStep#1", "[pl][module]m: x", "## Call"]),
            "pid": st.just(1),
            "tid": st.integers(1, 2),
            "ts": st.floats(min_value=0, max_value=300, allow_nan=False).map(lambda t: 4.5e12 + round(t, 3)),
            "dur": st.floats(min_value=0, max_value=150, allow_nan=False).map(lambda t: round(t, 3)),
        }
    ),
    st.fixed_dictionaries(  # an allocation: an instant, snapped like every timed event
        {
            "ph": st.just("i"),
            "name": st.just("[memory]"),
            "pid": st.just(1),
            "tid": st.integers(1, 2),
            "ts": st.floats(min_value=0, max_value=300, allow_nan=False).map(lambda t: 4.5e12 + t),
        }
    ),
)
python_event = st.one_of(
    call.map(lambda c: {**c, "ts": c["ts"] + 0.123456789}),  # nanoseconds' digits for the snap to round
    st.fixed_dictionaries(  # broken or unusual ones the contract fixes or keeps
        {
            "ph": st.sampled_from(["X", "i", "C", "M"]),
            "name": st.sampled_from([3, "ProfilerStep#1", "thread_name", "gc"]),
            "pid": st.just(1),
            "tid": st.integers(1, 3),
        },
        optional={
            "ts": st.floats(min_value=-5, max_value=200, allow_nan=False),
            "dur": st.integers(0, 50),
            "cat": st.sampled_from(["gc", 7]),
        },
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(torch_event, max_size=12),
    st.lists(python_event, max_size=30),
    st.floats(min_value=-3, max_value=3, allow_nan=False),  # drift over the window, µs
    st.floats(min_value=0, max_value=0.4, allow_nan=False),  # the calibration's round trip, µs
    st.sampled_from([[0], [0, 1], []]),
)
def test_the_fused_merge_writes_the_bytes_of_its_passes_run_apart(
    torch_events: list[dict[str, Any]],
    python_events: list[dict[str, Any]],
    drift_us: float,
    round_trip_us: float,
    steps: list[int],
) -> None:
    start = ClockPair(python_us=0.0, wall_ns=BASE_NS + 4_500_000_000_000_000, round_trip_us=round_trip_us)
    end = ClockPair(python_us=250.0, wall_ns=start.wall_ns + 250_000 + round(drift_us * 1000), round_trip_us=0.0)
    calibration = Calibration(start, end, BASE_NS)
    copy = orjson.loads(orjson.dumps([torch_events, python_events]))
    expected, fixed, cut = _passes_apart({"traceEvents": copy[0]}, copy[1], calibration, steps)
    merged = merge_trace({"traceEvents": torch_events}, python_events, calibration, {"version": "t", "steps": steps})
    assert orjson.dumps(merged["traceEvents"]) == orjson.dumps(expected)  # the same doubles, keys and order
    assert merged["vt_lightning"].get("contract_fixes", 0) == fixed
    assert merged["vt_lightning"]["nesting"]["cut_at_annotations"] == cut


worker_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "X", "B", "i", "M"]),
        "pid": st.sampled_from([20, 21]),
        "tid": st.sampled_from([20, 21, 3]),
        # a worker's clock, with ns digits; equal starts often (their order is the filter's)
        "ts": st.one_of(st.integers(0, 200_000), st.integers(0, 8).map(lambda t: t * 25_000)).map(
            lambda t: t / 1000 + 9000.0
        ),
        "dur": st.integers(0, 60_000).map(lambda d: d / 1000),
    },
    optional={  # no name: the contract's fix (the filter reads names as strings, as VizTracer writes them)
        "name": st.sampled_from(
            ["f (/u/a.py:1)", "g (/u/vt_lightning/x.py:2)", "builtins.len", "ProfilerStep#1", "ProfilerStep#7"]
        ),
    },
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(torch_event, max_size=8),
    st.lists(python_event.filter(lambda e: isinstance(e["name"], str)), max_size=20),
    st.lists(worker_event, max_size=40),
    st.floats(min_value=-3, max_value=3, allow_nan=False),  # drift over the window, µs
    st.sampled_from([[0], [0, 1], [], None]),
    st.sampled_from([-1, 2]),
)
def test_workers_calls_placed_on_torchs_timeline_as_they_are_read_merge_as_if_the_merge_placed_them(
    torch_events: list[dict[str, Any]],
    python_events: list[dict[str, Any]],
    worker: list[dict[str, Any]],
    drift_us: float,
    steps: list[int] | None,
    max_depth: int,
) -> None:
    # The writer places a DataLoader worker's calls on torch's timeline in the loop that reads
    # them (workers.place_events with a TorchPlacement) and hands them to the merge grouped, which
    # then leaves them alone: the trace (the same doubles, keys, order, contract fixes and unrun
    # steps' removal) and the run must be those of the merge placing them itself.
    from vt_lightning.analysis.filters import PythonFilter, filter_python_events, keeps_whole
    from vt_lightning.analysis.merge import place_python_events, torch_placement
    from vt_lightning.analysis.workers import ThreadCalls, place_events, worker_to_main_us

    torch_events = [  # an origin of 3 s
        {"ph": "i", "s": "t", "name": "start", "pid": 1, "tid": 1, "ts": 3_000_000.0},
        *({**e, "ts": e["ts"] + 3_000_000.0} for e in torch_events),
    ]
    # an offset whose every bit counts, so that any other rounding of the placement shows
    start = ClockPair(python_us=10.123456789, wall_ns=BASE_NS + 3_000_123_457, round_trip_us=0.2)
    end = ClockPair(python_us=260.5, wall_ns=start.wall_ns + 250_000 + round(drift_us * 1000), round_trip_us=0.0)
    calibration = Calibration(start, end, BASE_NS)
    clock = worker_to_main_us([(9000.0, 5_000), (9200.0, 205_003)], [(0.0, 7_000), (300.0, 307_001)])
    metadata = {"version": "t", "steps": steps} if steps is not None else {"version": "t"}
    rules = PythonFilter(max_depth=max_depth, own=("/u/vt_lightning/",), library=())

    def merged(placing: bool, settling: bool = False) -> tuple[bytes, WindowTrace, bytes]:
        torch_copy, main, dump = orjson.loads(orjson.dumps([torch_events, python_events, worker]))
        origin = time_origin_us(torch_copy)
        to_torch = torch_placement(calibration, origin)
        grouped: ThreadCalls = ({}, [])
        ordered: dict[Any, set[Any]] = {}  # the threads placed outer first, and their names
        settled: dict[Any, Any] = {}  # the threads the filter keeps whole, put on the grid as placed
        if placing:
            settle = partial(keeps_whole, rules) if settling else None
            place_events(dump, clock, {3}, grouped, to_torch, ordered, settle, settled)
        else:
            place_events(dump, clock, {3}, grouped)
        others, kept, _ = filter_python_events(main, rules, grouped, ordered)
        from_workers = grouped[0].keys()
        if placing:  # what the writer's place stage places: all but the workers' calls
            place_python_events(
                [*others, *(c for k, calls in kept.items() if k not in from_workers for c in calls)], to_torch
            )
        else:  # everything, the workers' calls from the main process's clock
            place_python_events([*others, *(c for calls in kept.values() for c in calls)], to_torch)
        worker_calls = [call for key, calls in kept.items() if key in from_workers for call in calls]
        # what is not X is snapped once placed (by the merge, or by place_python_events)
        placed_times = orjson.dumps(
            [(e["ts"] if e["ph"] == "X" else round(e["ts"] * 1000) / 1000, e.get("dur"), e["cat"])
             for e in worker_calls]
        )  # fmt: skip
        parts = PythonParts(others, kept, settled=settled, names=ordered)
        trace = merge_window({"traceEvents": torch_copy}, parts, calibration, metadata, origin_us=origin)
        return orjson.dumps(trace.as_dict()), trace, placed_times

    expected, _, expected_placed = merged(placing=False)
    got, _, got_placed = merged(placing=True)
    assert got_placed == expected_placed
    assert got == expected
    got, trace, _ = merged(placing=True, settling=True)
    assert got == expected
    # The calls a thread's table hands the summary (taken as settled where the merge snapped a
    # thread as arrays) are the ones a reader of the written trace reads, and so is the summary.
    read_back = WindowTrace.of(orjson.loads(got))
    for thread in trace.python_threads():
        taken, read = trace.calls(thread), read_back.calls(thread)
        assert (taken.starts.tolist(), taken.ends.tolist(), taken.names) == (
            read.starts.tolist(),
            read.ends.tolist(),
            read.names,
        ), thread
    assert summarize(trace) == summarize(read_back)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from((0.0, 0.5, 1.0, 2.25, 3.0, 1e6 + 0.001, -0.0004, 1.0005)),
            st.sampled_from((0.0, 0.0002, 0.25, 0.5, 1.0, 2.0)),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 60),
)
def test_a_long_thread_of_calls_is_snapped_as_arrays_as_the_walk_snaps_it(
    calls: list[tuple[float, float]], copies: int
) -> None:
    # untangle_annotations snaps a long thread of nothing but calls as arrays where none outlasts
    # its parent (a DataLoader worker's): the times (a -0 rounded, ties, zero lengths, touching
    # ends) and the cuts must be the walk's, whether or not one is cut.
    from vt_lightning.analysis import nesting

    events = [
        {"ph": "X", "cat": PYTHON_CATEGORY, "name": "f", "pid": 1, "tid": 1, "ts": start + 10.0 * n, "dur": length}
        for n in range(copies)
        for start, length in calls
    ]

    def snapped(array_min: int) -> tuple[bytes, int]:
        copy = orjson.loads(orjson.dumps(events))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(nesting, "ARRAY_NEST_MIN", array_min)
            cut = untangle_annotations(copy, snap=True)
        return orjson.dumps(copy), cut

    assert snapped(1) == snapped(len(events) + 1)
