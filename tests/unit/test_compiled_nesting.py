"""Compile ranges that cross Python calls are moved beside their thread's calls, and a call that
outlives its parent is cut (issue 39), on synthetic events (compiled runs on a real Trainer:
tests/integration/test_compiled_nesting.py)."""

from __future__ import annotations

from typing import Any

from conftest import overlaps_without_nesting

from vt_lightning.analysis.nesting import RANGE_TRACK_TID_BASE, separate_crossing_ranges


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 7) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_range_crossing_a_call_moves_beside_its_thread_and_a_call_outliving_its_parent_is_cut():
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "MainThread"}},
        _x("caller", 0.0, 10.0, "FEE"),
        _x("range", 5.0, 10.0),  # crosses the caller's end
        _x("other range", 6.0, 20.0),  # crosses the caller's end and "range"
        _x("child", 8.0, 4.0, "FEE"),  # a call outliving its parent call by 2 µs
    ]
    moved, cut = separate_crossing_ranges(events)
    assert (moved, cut) == (2, 1)
    assert overlaps_without_nesting({"traceEvents": events}) == []
    by_name = {e["name"]: e for e in events if e.get("ph") == "X"}
    assert (by_name["child"]["ts"], by_name["child"]["dur"]) == (8.0, 2.0)
    assert by_name["child"]["args"]["vt_lightning.dur"] == 4.0
    # The two ranges overlap without nesting each other: two lanes, each named after the thread.
    lanes = {by_name["range"]["tid"], by_name["other range"]["tid"]}
    assert len(lanes) == 2 and all(tid >= RANGE_TRACK_TID_BASE for tid in lanes)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    assert {names[tid] for tid in lanes} == {"MainThread · torch ranges", "MainThread · torch ranges 2"}
    assert (by_name["range"]["ts"], by_name["range"]["dur"]) == (5.0, 10.0)
