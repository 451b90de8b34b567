"""Trace fidelity (issue 3), the pure parts: the clock samples and markers that calibrate a window,
drift across it, and the repairs of calls that cross a range (real windows:
tests/integration/test_fidelity.py)."""

from __future__ import annotations

import pytest

from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.merge import PYTHON_CATEGORY
from vt_lightning.analysis.nesting import count_crossings, repair_boundaries
from vt_lightning.recording.clock_probes import sample_pair

# ---------------------------------------------------------------- pure calibration maths


def test_sample_pair_keeps_the_tightest_round_trip():
    readings = iter([0.0, 10.0, 100.0, 100.5, 200.0, 230.0])
    walls = iter([5_000, 100_250, 215_000])
    pair = sample_pair(lambda: next(readings), lambda: next(walls), rounds=3)
    assert pair == ClockPair(python_us=100.25, wall_ns=100_250, round_trip_us=0.5)
    assert pair.uncertainty_us == 0.25


def test_a_marker_bracket_bounds_the_offset_to_torchs_own_timeline():
    from vt_lightning.analysis.clock import MarkerPair, best_marker_pair

    # Python read at 100 and 101.0 µs; torch recorded the range at [5100.3, 5100.5] on its timeline.
    pair = MarkerPair(before_us=100.0, after_us=101.0, torch_start_us=5100.3, torch_end_us=5100.5)
    # The offset lies in [5100.5 - 101, 5100.3 - 100] = [4999.5, 5000.3].
    assert pair.offset_us(0) == pytest.approx(4999.9)
    assert pair.uncertainty_us == pytest.approx(0.4) and pair.round_trip_us == pytest.approx(0.8)
    samples = [("m#0", 100.0, 103.0), ("m#1", 200.0, 200.5), ("m#2", 300.0, 300.1)]
    spans = {"m#0": (5100.0, 5101.0), "m#1": (5200.1, 5200.3)}  # m#2 was not recorded
    best = best_marker_pair(samples, spans)
    assert best is not None and best.before_us == 200.0
    assert best_marker_pair(samples, {}) is None


def test_drift_is_interpolated_across_the_window():
    start = ClockPair(python_us=1_000.0, wall_ns=11_000_000, round_trip_us=0.2)  # offset 10 000 µs
    end = ClockPair(python_us=2_000.0, wall_ns=12_004_000, round_trip_us=0.4)  # offset 10 004 µs
    cal = Calibration(start, end, base_ns=0)
    assert cal.offset_us == 10_000 and cal.drift_us == pytest.approx(4.0)
    assert cal.python_to_torch_us(1_000.0) == pytest.approx(11_000.0)
    assert cal.python_to_torch_us(1_500.0) == pytest.approx(11_502.0)
    assert cal.python_to_torch_us(2_000.0) == pytest.approx(12_004.0)
    assert cal.uncertainty_us == pytest.approx(0.2)
    assert set(cal.metadata()) >= {"offset_us", "uncertainty_us", "drift_us", "method"}


def _x(ts, dur, cat, tid=1):
    return {"ph": "X", "name": cat, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_crossings_within_tolerance_are_clamped_and_counted():
    caller = _x(100.0, 10.0, PYTHON_CATEGORY)  # ends 0.05 µs before its op does
    op = _x(105.0, 5.05, "cpu_op")
    far = _x(200.0, 10.0, PYTHON_CATEGORY)  # crosses its op by 3 µs: beyond tolerance
    far_op = _x(207.0, 6.0, "cpu_op")
    other_thread = _x(105.0, 5.05, PYTHON_CATEGORY, tid=2)
    events = [caller, op, far, far_op, other_thread]
    assert count_crossings(events) == 2
    repaired, unrepaired = repair_boundaries(events, tolerance_us=0.1)
    assert (repaired, unrepaired) == (1, 0)
    assert caller["ts"] == 100.0 and caller["ts"] + caller["dur"] == pytest.approx(110.05)
    assert op["ts"] == 105.0 and op["dur"] == 5.05  # torch's timeline is never moved
    assert count_crossings(events) == 1 and len(events) == 5


def test_calls_that_open_or_close_a_range_are_cut_at_its_edges():
    from vt_lightning.analysis.nesting import untangle_annotations

    step = {
        "ph": "X",
        "name": "ProfilerStep#3",
        "cat": "user_annotation",
        "ts": 100.0,
        "dur": 100.0,
        "pid": 1,
        "tid": 1,
    }
    opener = _x(90.0, 15.0, PYTHON_CATEGORY)  # hook that opens the step, returns at 105
    opener_child = _x(95.0, 8.0, PYTHON_CATEGORY)  # record_function.__enter__, returns at 103
    closer = _x(195.0, 10.0, PYTHON_CATEGORY)  # hook that closes it at 200, returns at 205
    inside = _x(120.0, 10.0, PYTHON_CATEGORY)  # ordinary call inside the step: untouched
    outer = _x(50.0, 200.0, PYTHON_CATEGORY)  # the loop around everything: untouched
    events = [step, opener, opener_child, closer, inside, outer]
    assert untangle_annotations(events) == 3
    assert (opener["ts"], opener["ts"] + opener["dur"]) == (90.0, 100.0)
    assert (opener_child["ts"], opener_child["ts"] + opener_child["dur"]) == (95.0, 100.0)
    assert (closer["ts"], closer["ts"] + closer["dur"]) == (200.0, 205.0)
    assert opener["args"]["vt_lightning.dur"] == 15.0 and closer["args"]["vt_lightning.ts"] == 195.0
    assert (inside["ts"], inside["dur"], outer["ts"], outer["dur"]) == (120.0, 10.0, 50.0, 200.0)
