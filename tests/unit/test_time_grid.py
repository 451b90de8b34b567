"""What nests before encoding still nests after it, as Perfetto reads the file.

torch stamps events in µs of its steady clock: 4.5e12 µs after 52 days of uptime, where a double
resolves only ~0.001 µs. Written as-is, a Python call cut at a range's end could end 1 ns after the
range once parsed (the nesting test failed in about a third of runs on such a machine). These tests
put events at that magnitude on purpose, so they fail on any merge that computes there.
"""

from __future__ import annotations

import orjson
from conftest import overlaps_without_nesting, span_ns
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.merge import PYTHON_CATEGORY, encode_trace, merge_trace

UPTIME_US = 4_544_795_022_893.214  # a torch timestamp seen on a machine up for 52 days
BASE_NS = 1_700_000_000_000_000_000


def _calibration(offset_us: float, drift_us: float = 0.0, span_us: float = 1e6) -> Calibration:
    """Python-clock 0 maps to ``offset_us`` on torch's timeline; ``drift_us`` more at ``span_us``."""
    start = ClockPair(python_us=0.0, wall_ns=BASE_NS + round(offset_us * 1000), round_trip_us=0.0)
    end = ClockPair(
        python_us=span_us, wall_ns=BASE_NS + round((offset_us + span_us + drift_us) * 1000), round_trip_us=0.0
    )
    return Calibration(start, end, BASE_NS)


def _roundtrip(merged: dict) -> dict:
    return orjson.loads(encode_trace(merged))


def test_python_calls_cut_at_a_range_end_nest_after_encoding_at_large_timestamps():
    # A Lightning range opened and closed by Python calls, as `[pl][profile]...backward` is: the
    # calls that close it start inside it and are cut at its end by the merge.
    range_start, range_dur = UPTIME_US + 1461.0, 167.58
    torch_events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#3",
            "pid": 1,
            "tid": 1,
            "ts": UPTIME_US,
            "dur": 5000.123,
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "[pl][profile]backward",
            "pid": 1,
            "tid": 1,
            "ts": range_start,
            "dur": range_dur,
        },
    ]
    offset = UPTIME_US - 10.0  # Python clock 10 µs <-> torch UPTIME_US
    end_py = range_start + range_dur - offset
    python_events = []
    for depth in range(6):  # a chain of __exit__ -> next -> stop -> ... all straddling the end
        python_events.append(
            {
                "ph": "X",
                "name": f"exit_{depth}",
                "pid": 1,
                "tid": 1,
                "ts": end_py - 1.5 + 0.1 * depth,
                "dur": 2.1 - 0.2 * depth,
            }
        )
    merged = merge_trace(
        {"baseTimeNanoseconds": BASE_NS, "traceEvents": torch_events},
        python_events,
        _calibration(offset),
        {"version": "t"},
    )
    decoded = _roundtrip(merged)
    assert overlaps_without_nesting(decoded) == []
    assert decoded["vt_lightning"]["nesting"]["cut_at_annotations"] >= 6
    # The range keeps torch's nanoseconds exactly, and absolute time is unchanged.
    (rng,) = [e for e in decoded["traceEvents"] if e["name"] == "[pl][profile]backward"]
    origin = decoded["vt_lightning"]["time_origin_us"]
    assert origin > 0 and decoded["baseTimeNanoseconds"] == BASE_NS + origin * 1000
    assert span_ns(rng) == (
        round(range_start * 1000) - origin * 1000,
        round(range_start * 1000) - origin * 1000 + 167_580,
    )


def test_a_child_ending_with_its_parent_keeps_nesting_under_clock_drift():
    # Drift shifts later instants more than earlier ones; shifting only `ts` and keeping `dur`
    # pushed a child that ends with its parent past the parent's end.
    python_events = [
        {"ph": "X", "name": "parent", "pid": 1, "tid": 1, "ts": 100.0, "dur": 899_900.0},
        {"ph": "X", "name": "child", "pid": 1, "tid": 1, "ts": 800_000.0, "dur": 100_000.0},
    ]
    merged = merge_trace(
        {"baseTimeNanoseconds": BASE_NS, "traceEvents": []},
        python_events,
        _calibration(UPTIME_US, drift_us=40.0),
        {"version": "t"},
    )
    decoded = _roundtrip(merged)
    parent, child = sorted((e for e in decoded["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    assert span_ns(child)[1] == span_ns(parent)[1]
    assert overlaps_without_nesting(decoded) == []


def _tree(draw, start: int, end: int, depth: int, out: list[dict]) -> None:
    """Nested calls in [start, end] ns, children possibly touching each other and the parent's edges."""
    cursor = start
    for _ in range(draw(st.integers(0, 3 if depth < 4 else 0))):
        if cursor >= end:
            break
        child_start = draw(st.integers(cursor, end))
        child_end = draw(st.integers(child_start, end))
        out.append(
            {
                "ph": "X",
                "name": f"d{depth}",
                "pid": 1,
                "tid": 1,
                "ts": child_start / 1000,
                "dur": (child_end - child_start) / 1000,
            }
        )
        _tree(draw, child_start, child_end, depth + 1, out)
        cursor = child_end


@st.composite
def call_trees(draw) -> list[dict]:
    out: list[dict] = []
    root_start = draw(st.integers(0, 10**9))
    _tree(draw, root_start, root_start + draw(st.integers(0, 10**7)), 0, out)
    return out


@settings(max_examples=200, deadline=None)
@given(call_trees(), st.floats(-50, 50), st.floats(0, 0.999), st.integers(0, 10**6))
def test_nested_python_calls_stay_nested_on_torchs_timeline(calls, drift_us, offset_fraction, offset_ns):
    offset = UPTIME_US + offset_ns / 1000 + offset_fraction
    torch_events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::op", "pid": 1, "tid": 2, "ts": UPTIME_US + 0.123, "dur": 1.0}
    ]  # another thread: only sets the origin
    merged = merge_trace(
        {"baseTimeNanoseconds": BASE_NS, "traceEvents": torch_events},
        [dict(c) for c in calls],
        _calibration(offset, drift_us=drift_us),
        {"version": "t"},
    )
    decoded = _roundtrip(merged)
    assert overlaps_without_nesting(decoded) == []
    assert sum(e.get("cat") == PYTHON_CATEGORY for e in decoded["traceEvents"]) == len(calls)
