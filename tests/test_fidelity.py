"""Trace fidelity: per-window calibration, nesting proof, overflow and threads (issue 3)."""

from __future__ import annotations

import threading
import time
import warnings

import orjson
import pytest
import torch
from conftest import (
    MarkerModel,
    load_trace,
    loader,
    make_trainer,
    marker_steps,
    overlaps_without_nesting,
    renamed,
    span_ns,
    trace_files,
)
from lightning.pytorch.callbacks import Callback

import vt_lightning.recording.clock_probes as clock_probes
from vt_lightning import VizTraceCallback
from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.merge import PYTHON_CATEGORY
from vt_lightning.analysis.nesting import count_crossings, repair_boundaries
from vt_lightning.recording.clock_probes import sample_pair
from vt_lightning.recording.torchtracer import TorchTracer


def _issuer(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


ISSUERS = [renamed(_issuer, f"issue_{i}") for i in range(200)]


class ManySmallCallers(MarkerModel):
    """Hundreds of tiny Python functions per batch, each issuing exactly one torch op."""

    def training_step(self, batch, batch_idx):
        (x,) = batch
        for fn in ISSUERS:
            x = fn(x)
        return self.layer(x).pow(2).mean()


def _pairs(trace):
    """(python caller, torch op) pairs, matched in order on each thread."""
    events = trace["traceEvents"]
    callers = sorted(
        (e for e in events if e.get("cat") == PYTHON_CATEGORY and e["name"].startswith("issue_")),
        key=lambda e: e["ts"],
    )
    ops = sorted((e for e in events if e.get("name") == "aten::relu"), key=lambda e: e["ts"])
    assert len(callers) == len(ops) > 0
    return list(zip(callers, ops, strict=True))


def _violations(trace):
    """Ops outside their Python caller, with the margins by which they miss it (µs)."""
    bad = []
    for caller, op in _pairs(trace):
        (caller_start, caller_end), (op_start, op_end) = span_ns(caller), span_ns(op)
        inside = caller_start <= op_start and op_end <= caller_end
        if not (inside and caller["tid"] == op["tid"] and caller["pid"] == op["pid"]):
            bad.append(
                {
                    "caller": caller,
                    "op": op,
                    "start_margin": round(op["ts"] - caller["ts"], 3),
                    "end_margin": round(caller["ts"] + caller["dur"] - op["ts"] - op["dur"], 3),
                }
            )
    return bad


def test_every_op_nests_in_its_python_caller_across_windows(tmp_path):
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=3)
    make_trainer(tmp_path, [cb], max_steps=12).fit(ManySmallCallers(), loader())
    files = trace_files(tmp_path)
    assert len(files) == 3
    for path in files:
        trace = load_trace(path)
        assert len(_pairs(trace)) == 2 * len(ISSUERS)
        assert _violations(trace) == [], (trace["vt_lightning"]["calibration"], trace["vt_lightning"]["nesting"])
        assert trace["vt_lightning"]["nesting"]["crossings"] == 0, (
            trace["vt_lightning"]["nesting"],
            overlaps_without_nesting(trace),
        )
        calibration = trace["vt_lightning"]["calibration"]
        assert calibration["uncertainty_us"] < 5.0, calibration
        assert abs(calibration["drift_us"]) < 50.0, calibration


def test_calibration_does_not_depend_on_events_surviving_min_duration(tmp_path):
    cb = VizTraceCallback(wait=0, warmup=1, active=2, repeat=1, min_duration=100)
    make_trainer(tmp_path, [cb], max_steps=4).fit(ManySmallCallers(), loader())
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    # The tiny callers are filtered out, yet the window is calibrated from the clocks themselves.
    kept = [e for e in trace["traceEvents"] if e.get("name", "").startswith("issue_")]
    assert len(kept) < 0.05 * 2 * len(ISSUERS)  # a rare call can exceed 100 µs (GC, page fault)
    calibration = trace["vt_lightning"]["calibration"]
    assert calibration["uncertainty_us"] < 5.0 and "bracketed by VizTracer clock reads" in calibration["method"]
    steps = [e for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    python = [e for e in trace["traceEvents"] if e.get("cat") == PYTHON_CATEGORY and e.get("ph") == "X"]
    # (a call cut at the edge of a range it opened keeps its recorded duration in args)
    assert python and all(e.get("args", {}).get("vt_lightning.dur", e["dur"]) >= 100 for e in python)
    # Long Python calls still sit on the steps' time range, not seconds away.
    lo = min(e["ts"] for e in steps) - 1e5
    hi = max(e["ts"] + e["dur"] for e in steps) + 1e5
    assert all(lo <= e["ts"] <= hi for e in python)


@pytest.mark.parametrize(
    "tracer_setting",
    [
        dict(include_files=[__file__]),
        dict(exclude_files=[torch.__path__[0]]),
        dict(max_stack_depth=3),
        dict(ignore_c_function=True),
    ],
)
def test_calibration_under_every_tracer_filter(tmp_path, tracer_setting):
    cb = VizTraceCallback(wait=0, warmup=0, active=1, repeat=1, **tracer_setting)
    make_trainer(tmp_path, [cb], max_steps=2).fit(ManySmallCallers(), loader())
    (path,) = trace_files(tmp_path)
    calibration = load_trace(path)["vt_lightning"]["calibration"]
    assert calibration["uncertainty_us"] < 5.0


class _WallClockStep(Callback):
    """From batch ``at`` on, the wall clock reads ``delta_ns`` later, for us and for torch alike."""

    def __init__(self, at: int, delta_ns: int, monkeypatch) -> None:
        self.at, self.delta_ns, self.mp = at, delta_ns, monkeypatch
        self.stepped = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.fit_loop.total_batch_idx == self.at and not self.stepped:
            self.stepped = True
            self.mp.setattr(clock_probes, "wall_clock_ns", lambda: time.time_ns() + self.delta_ns)


def test_a_wall_clock_step_between_windows_is_absorbed_per_window(tmp_path, monkeypatch):
    delta_ns = 3_000_000_000  # NTP steps the clock 3 s forward between the windows
    start, save = TorchTracer.start, TorchTracer.save

    def start_with_clock(self):
        self._wall_shift = clock_probes.wall_clock_ns() - time.time_ns()
        start(self)

    def save_with_clock(self, path):  # torch's own timestamps follow the stepped clock too
        save(self, path)
        with open(path, "rb") as f:
            raw = orjson.loads(f.read())
        raw["baseTimeNanoseconds"] += round(self._wall_shift / 1e9) * 1_000_000_000
        with open(path, "wb") as f:
            f.write(orjson.dumps(raw))

    monkeypatch.setattr(TorchTracer, "start", start_with_clock)
    monkeypatch.setattr(TorchTracer, "save", save_with_clock)
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2)
    make_trainer(tmp_path, [cb, _WallClockStep(4, delta_ns, monkeypatch)], max_steps=8).fit(
        ManySmallCallers(), loader()
    )
    first, second = (load_trace(p) for p in trace_files(tmp_path))
    assert _violations(first) == [] and _violations(second) == []
    # Each window moves its events to an origin of its own (``time_origin_us``) and its base with it.
    torch_base = [t["baseTimeNanoseconds"] - t["vt_lightning"]["time_origin_us"] * 1000 for t in (first, second)]
    assert torch_base[1] - torch_base[0] == delta_ns
    # A one-time offset from the first window would misplace the second by the whole step; the
    # import-time anchor VizTracer uses by itself is off by the same amount.
    assert abs(second["vt_lightning"]["calibration"]["import_anchor_error_us"]) == pytest.approx(
        delta_ns / 1000, rel=1e-3
    )
    assert abs(first["vt_lightning"]["calibration"]["import_anchor_error_us"]) < 1000


def test_overflow_keeps_the_tail_and_says_how_large_to_set_tracer_entries(tmp_path):
    cb = VizTraceCallback(wait=0, warmup=0, active=3, repeat=1, tracer_entries=500)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=3).fit(ManySmallCallers(), loader())
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    meta = trace["vt_lightning"]
    assert meta["overflow"] is True
    assert meta["python_events"] <= 500
    assert marker_steps(trace) <= {2}  # only the tail of the window survived
    overflow_warnings = [w for w in caught if "tracer_entries" in str(w.message)]
    assert len(overflow_warnings) == 1
    suggested = meta["overflow_suggested_tracer_entries"]
    assert suggested > 500 and f"about {suggested}" in str(overflow_warnings[0].message)


def _records_all_threads() -> bool:
    """torch >= 2.7 records ops of threads the profiler was not started on (``profile_all_threads``)."""
    from torch._C._profiler import _ExperimentalConfig

    try:
        _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return False
    return True


@pytest.mark.skipif(not _records_all_threads(), reason="this torch records only the profiling thread's ops (< 2.7)")
def test_python_threads_share_a_track_with_their_torch_ops(tmp_path):
    class Threaded(MarkerModel):
        def training_step(self, batch, batch_idx):
            def side_work():
                torch.relu(torch.ones(4))

            worker = threading.Thread(target=side_work, name="side-worker")
            worker.start()
            worker.join()
            return super().training_step(batch, batch_idx)

    # torch records other threads' ops only without profile_memory (see torchtracer.py).
    cb = VizTraceCallback(wait=0, warmup=1, active=1, repeat=1, profile_memory=False)
    make_trainer(tmp_path, [cb], max_steps=2).fit(Threaded(), loader())
    trace = load_trace(trace_files(tmp_path)[0])
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    side = [tid for tid, name in names.items() if name == "side-worker"]
    assert len(side) == 1
    pid, tid = side[0]
    python_calls = [e for e in trace["traceEvents"] if e.get("tid") == tid and e.get("cat") == PYTHON_CATEGORY]
    ops = [e for e in trace["traceEvents"] if e.get("tid") == tid and e.get("name") == "aten::relu"]
    assert python_calls and ops and all(e["pid"] == pid for e in python_calls + ops)
    caller = next(e for e in python_calls if e["name"].split(" (")[0].rsplit(".", 1)[-1] == "side_work")
    assert caller["ts"] <= ops[0]["ts"] <= ops[0]["ts"] + ops[0]["dur"] <= caller["ts"] + caller["dur"]


# ---------------------------------------------------------------- pure calibration maths


@pytest.mark.unit
def test_sample_pair_keeps_the_tightest_round_trip():
    readings = iter([0.0, 10.0, 100.0, 100.5, 200.0, 230.0])
    walls = iter([5_000, 100_250, 215_000])
    pair = sample_pair(lambda: next(readings), lambda: next(walls), rounds=3)
    assert pair == ClockPair(python_us=100.25, wall_ns=100_250, round_trip_us=0.5)
    assert pair.uncertainty_us == 0.25


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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
