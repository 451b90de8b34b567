"""The flight recorder's parts without a Trainer: stack samples become nested spans, stacks are
filtered to the user's frames, the ring stays bounded, and a slow step's samples reach only the
window they were assigned to (issue 25)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from vt_lightning.analysis.clock import Calibration, ClockPair
from vt_lightning.analysis.flight import (
    SAMPLED_CATEGORY,
    add_flight_track,
    flight_track,
    reduce_stack,
    sample_spans,
)
from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.recording import flight
from vt_lightning.recording.flight import FlightRecorder

MS = 1_000_000
USER, LIB = "/home/me/train.py", "/venv/lib/python3.11/site-packages/lightning/trainer.py"


def _identity() -> Calibration:
    """Python-tracer µs == trace µs (torch's base time 0)."""
    return Calibration(start=ClockPair(0.0, 0, 0.0), end=ClockPair(1e9, 10**12, 0.0), base_ns=0)


def _nests(spans: list[tuple[int, int, int, int]]) -> bool:
    ordered = sorted(spans, key=lambda s: (s[2], s[2] - s[3], s[1]))
    stack: list[tuple[int, int, int, int]] = []
    for span in ordered:
        while stack and stack[-1][3] <= span[2]:
            stack.pop()
        if stack and span[3] > stack[-1][3]:
            return False
        stack.append(span)
    return True


def test_consecutive_samples_of_one_frame_are_one_span_and_a_change_splits_it() -> None:
    # main (0) -> fit (1) -> step (2) -> a (3) for three samples, then b (4) for two.
    samples = [(t * 10 * MS, (0, 1, 2, 3)) for t in range(3)] + [(t * 10 * MS, (0, 1, 2, 4)) for t in (3, 4)]
    spans = sample_spans(samples, 10 * MS, 0, 1000 * MS)
    by_frame = {(i, d): (s, e) for i, d, s, e in spans}
    assert by_frame[(2, 2)] == (0, 50 * MS)  # the parent spans every sample, plus the last interval
    assert by_frame[(3, 3)] == (0, 30 * MS)  # until the first sample that did not see it
    assert by_frame[(4, 3)] == (30 * MS, 50 * MS)
    assert len(spans) == 5 and _nests(spans)


def test_spans_stay_inside_the_step() -> None:
    samples = [(t * MS, (0, 1)) for t in range(0, 100, 10)]
    spans = sample_spans(samples, 10 * MS, 15 * MS, 55 * MS)
    # Samples before the step or after it are not counted; the last one ends at the step's end.
    assert {(s, e) for _, _, s, e in spans} == {(20 * MS, 55 * MS)}


def test_a_frame_that_returns_and_is_called_again_is_two_spans() -> None:
    samples = [(0, (0, 1)), (10 * MS, (0,)), (20 * MS, (0, 1))]
    spans = sample_spans(samples, 10 * MS, 0, 100 * MS)
    assert sorted((s, e) for i, _, s, e in spans if i == 1) == [(0, 10 * MS), (20 * MS, 30 * MS)]


def test_reduce_stack_keeps_the_users_frames_and_a_few_library_frames() -> None:
    frames: list[Any] = [
        ("<module>", USER, 1),
        ("Trainer.fit", LIB, 10),
        ("Loop.run", LIB, 20),
        ("Strategy.training_step", LIB, 30),
        ("Model.training_step", USER, 40),
        ("Module._call_impl", LIB, 50),
        ("Conv.forward", LIB, 60),
        ("conv2d", LIB, 70),
        ("inner", LIB, 80),
    ]

    def is_user(path: str) -> bool:
        return path == USER

    kept = reduce_stack(tuple(range(len(frames))), frames, is_user, inner=2)
    # The user's frames, the library frame each calls, and the innermost 2 frames.
    assert [frames[i][0] for i in kept] == [
        "<module>",
        "Trainer.fit",
        "Model.training_step",
        "Module._call_impl",
        "conv2d",
        "inner",
    ]
    # No user frame at all: where the library was.
    assert reduce_stack((1, 2, 3), frames, is_user, inner=2) == (2, 3)


def test_the_track_is_labelled_sampled_and_on_the_traces_clock() -> None:
    data = {
        "batch": 7,
        "start_ns": 1_000 * MS,
        "end_ns": 1_100 * MS,
        "interval_ns": 10 * MS,
        "pid": 42,
        "tid": 4242,
        "frames": [["main", USER, 1], ["slow_function", USER, 9]],
        "samples": [[1_000 * MS + t * 10 * MS + 3 * MS, [0, 1]] for t in range(10)],
        "clock": [0, 0.0],  # perf_counter 0 ns is Python µs 0
        "truncated": False,
        "detail": {},
    }
    events = flight_track(data, _identity(), origin_us=0.0)
    meta = [e for e in events if e["ph"] == "M"]
    assert {"name": "thread_name", "ph": "M", "pid": 42, "tid": 1_000_004_242} | {
        "args": {"name": "sampled: training thread (100 Hz)"}
    } in meta
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["cat"] == SAMPLED_CATEGORY and e["args"]["sampled"] for e in spans)
    step = spans[0]
    assert step["name"] == "slow step: batch 7 (sampled)"
    assert (step["ts"], step["dur"]) == (1_000_000.0, 100_000.0)  # µs, exactly the step's bounds
    assert step["args"]["samples"] == 10
    slow = next(e for e in spans if e["name"].startswith("slow_function ("))
    assert slow["name"] == f"slow_function ({USER}:9)"
    assert slow["ts"] == 1_003_000.0 and slow["ts"] + slow["dur"] == 1_100_000.0  # clipped at the step's end


def test_a_track_before_the_time_origin_moves_the_origin_back() -> None:
    data = {
        "batch": 1,
        "start_ns": 0,
        "end_ns": 20 * MS,
        "interval_ns": 10 * MS,
        "pid": 1,
        "tid": 1,
        "frames": [["main", USER, 1]],
        "samples": [[5 * MS, [0]]],
        "clock": [0, 0.0],
    }
    merged: dict[str, Any] = {
        "baseTimeNanoseconds": 5_000_000_000,
        "vt_lightning": {"time_origin_us": 3_000_000},
        "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 10.5, "dur": 1.0, "pid": 1, "tid": 1}],
    }
    trace = WindowTrace.of(merged)
    add_flight_track(trace, data, _identity())
    merged = trace.as_dict()
    assert min(e["ts"] for e in merged["traceEvents"] if "ts" in e) >= 0
    op = merged["traceEvents"][0]
    # Absolute times unchanged: the op's wall time is the same after the shift.
    assert merged["baseTimeNanoseconds"] + op["ts"] * 1000 == 5_000_000_000 + 10.5 * 1000
    assert merged["vt_lightning"]["flight"] == {"batch": 1, "samples": 1, "rate_hz": 100, "truncated": False}
    assert list(merged)[-1] == "traceEvents"


def test_no_capture_no_track() -> None:
    trace = WindowTrace.of({"traceEvents": []})
    add_flight_track(trace, None, _identity())
    assert trace.as_dict() == {"traceEvents": []}


def slow_function_for_the_sampler(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.001)


def test_the_ring_is_bounded_and_the_sampler_stops() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=slow_function_for_the_sampler, args=(stop,), name="fake-training")
    worker.start()
    recorder = FlightRecorder(lambda: True, rate_hz=1000, ring=5, thread=worker)
    try:
        recorder.start()
        deadline = time.monotonic() + 30
        while len(recorder.ring) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # many more ticks than the ring holds
        assert len(recorder.ring) == 5
        names = {code.co_name for _, codes in recorder.ring for code in codes}
        assert "slow_function_for_the_sampler" in names
        sampler = recorder.sampler
        assert sampler is not None and sampler.is_alive()
    finally:
        recorder.stop()
        stop.set()
        worker.join()
    assert not sampler.is_alive()
    assert len(recorder.ring) == 0
    recorder.resume()  # stopped for good: no new thread
    assert recorder.sampler is None


def test_the_sampler_ends_with_the_thread_it_samples() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=slow_function_for_the_sampler, args=(stop,))
    worker.start()
    recorder = FlightRecorder(lambda: True, rate_hz=1000, thread=worker)
    recorder.start()
    sampler = recorder.sampler
    assert sampler is not None
    stop.set()
    worker.join()
    sampler.join(timeout=30)
    assert not sampler.is_alive()
    recorder.stop()


def _code(name: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def {name}():\n    pass\n", namespace)
    return namespace[name].__code__


def test_a_slow_steps_samples_go_to_the_window_it_was_assigned_to_once() -> None:
    recorder = FlightRecorder(lambda: True, ring=100)
    outer, inner = _code("outer"), _code("inner")
    for t in range(10):
        recorder.ring.append((t * 10 * MS, (inner, outer)))  # innermost first, as sampled
    recorder.mark(batch=3, end_ns=60 * MS, duration_ns=30 * MS)
    assert recorder.take(4, None) is None  # marked, not assigned yet
    recorder.assign(4, batch=3)
    assert recorder.take(5, None) is None  # another window
    capture = recorder.take(4, lambda: 123.0)
    assert capture is not None
    assert (capture.batch, capture.start_ns, capture.end_ns) == (3, 30 * MS, 60 * MS)
    assert [t for t, _ in capture.samples] == [30 * MS, 40 * MS, 50 * MS]
    assert [capture.frames[i][0] for i in capture.samples[0][1]] == ["outer", "inner"]  # outermost first
    assert capture.clock is not None and capture.clock[1] == 123.0
    assert recorder.take(4, None) is None  # once


def test_a_window_for_another_step_gets_no_samples() -> None:
    recorder = FlightRecorder(lambda: True)
    recorder.ring.append((5 * MS, ()))
    recorder.mark(batch=3, end_ns=10 * MS, duration_ns=10 * MS)  # its window was refused (cooldown)
    recorder.assign(40, batch=38)  # another rank's slow step at batch 38, agreed later
    assert recorder.take(40, None) is None


def test_a_full_ring_that_lost_the_steps_start_says_so() -> None:
    recorder = FlightRecorder(lambda: True, ring=3)
    for t in range(10):
        recorder.ring.append((t * MS, ()))
    recorder.mark(batch=0, end_ns=10 * MS, duration_ns=10 * MS)
    recorder.assign(1, batch=0)
    capture = recorder.take(1, None)
    assert capture is not None and capture.truncated and len(capture.samples) == 3


def test_a_forked_child_forgets_every_recorder() -> None:
    recorder = FlightRecorder(lambda: False)
    flight._ARMED[-1] = recorder  # as start() registers it, without a thread
    flight._forget_in_forked_child()
    assert recorder.stopped and -1 not in flight._ARMED
    assert flight.flight_side(None, lambda: 0.0) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [50, 100])
def test_the_track_names_its_rate(rate: int) -> None:
    data = {
        "batch": 0,
        "start_ns": 0,
        "end_ns": MS,
        "interval_ns": int(1e9 / rate),
        "pid": 1,
        "tid": 1,
        "frames": [],
        "samples": [],
        "clock": [0, 0.0],
    }
    names = [e["args"]["name"] for e in flight_track(data, _identity(), 0.0) if e.get("name") == "thread_name"]
    assert names == [f"sampled: training thread ({rate} Hz)"]
