"""The flight recorder's samples of a slow step as a track of the trace (docs/triggers.md): category
``sampled`` on a thread named ``sampled: …``, one span per frame kept over consecutive samples. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vt_lightning.analysis.clock import Calibration
from vt_lightning.analysis.merge import ORIGIN_GRANULARITY_US, snap_to_nanoseconds
from vt_lightning.analysis.trace import WindowTrace
from vt_lightning.analysis.usercode import is_user_file
from vt_lightning.analysis.workers import lower_origin

SAMPLED_CATEGORY = "sampled"  # not a category the TensorBoard plugin analyses: Trace view only
TRACK_TID_BASE = 1_000_000_000  # a Linux tid is below 2**22: base + the training thread's tid never collides
INNER_LIBRARY_FRAMES = 3

Frame = tuple[str, str, int]  # (qualified name, file, first line), as VizTracer names a call


@dataclass(frozen=True)
class FlightCapture:
    """The samples of one slow step: ``(perf_counter_ns, frame indices, outermost first)``."""

    batch: int
    start_ns: int
    end_ns: int
    interval_ns: int
    pid: int
    tid: int
    frames: list[Frame]
    samples: list[tuple[int, tuple[int, ...]]]
    clock: tuple[int, float] | None = None  # (perf_counter ns, python µs)
    truncated: bool = False  # the ring had already dropped the step's first samples
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def frame_name(frame: Sequence[Any]) -> str:
    """``"Model.slow (/src/model.py:12)"``: VizTracer's spelling, so ``usercode`` reads it too."""
    name, file, line = frame[0], frame[1], frame[2]
    return f"{name} ({file}:{line})"


def reduce_stack(
    stack: Sequence[int],
    frames: Sequence[Sequence[Any]],
    is_user: Callable[[str], bool],
    inner: int = INNER_LIBRARY_FRAMES,
) -> tuple[int, ...]:
    """The user's frames, the first library frame each calls, and the innermost ``inner`` frames."""
    user = [is_user(str(frames[i][1])) for i in stack]
    keep = [False] * len(stack)
    for depth, mine in enumerate(user):
        if mine:
            keep[depth] = True
            if depth + 1 < len(stack) and not user[depth + 1]:
                keep[depth + 1] = True
    last_user = max((d for d, mine in enumerate(user) if mine), default=-1)
    for depth in range(max(last_user + 1, len(stack) - inner), len(stack)):
        keep[depth] = True
    return tuple(i for i, k in zip(stack, keep) if k)


def sample_spans(
    samples: Sequence[tuple[int, Sequence[int]]], interval_ns: int, start_ns: int, end_ns: int
) -> list[tuple[int, int, int, int]]:
    """``(frame index, depth, start ns, end ns)`` from ordered samples, clipped to the step: a frame
    kept under the same parents is one span, each sample lasting to the next, so spans nest exactly."""
    inside = [(t, tuple(stack)) for t, stack in samples if start_ns <= t < end_ns]
    spans: list[tuple[int, int, int, int]] = []
    open_: list[tuple[int, int]] = []  # (frame index, start ns) by depth
    for n, (t, stack) in enumerate(inside):
        common = 0
        while common < len(open_) and common < len(stack) and open_[common][0] == stack[common]:
            common += 1
        for depth in range(len(open_) - 1, common - 1, -1):
            spans.append((open_[depth][0], depth, open_[depth][1], t))
        del open_[common:]
        open_.extend((index, t) for index in stack[common:])
        if n == len(inside) - 1:
            last_end = min(t + interval_ns, end_ns)
            for depth in range(len(open_) - 1, -1, -1):
                spans.append((open_[depth][0], depth, open_[depth][1], last_end))
    return spans


def flight_track(data: dict[str, Any], calibration: Calibration, origin_us: float) -> list[dict[str, Any]]:
    """The sampled track's events on the trace's timeline (µs after ``origin_us``, whole ns)."""
    clock = data.get("clock")
    if not clock:
        return []
    perf_ns, python_us = int(clock[0]), float(clock[1])

    def to_trace_ns(t_ns: int) -> int:
        us = calibration.python_to_torch_us(python_us + (t_ns - perf_ns) / 1000.0) - origin_us
        return round(us * 1000)

    frames = [tuple(f) for f in data.get("frames", [])]
    pid, tid = data.get("pid"), TRACK_TID_BASE + int(data.get("tid") or 0)
    start_ns, end_ns, interval = int(data["start_ns"]), int(data["end_ns"]), int(data["interval_ns"])
    rate = round(1e9 / interval) if interval > 0 else 0
    samples = [(int(t), reduce_stack(stack, frames, is_user_file)) for t, stack in data.get("samples", [])]
    detail = data.get("detail") or {}

    def span(name: str, t0: int, t1: int, args: dict[str, Any]) -> dict[str, Any]:
        a, b = to_trace_ns(t0), to_trace_ns(t1)  # monotonic: spans that nest in ns nest here
        return {
            "ph": "X",
            "cat": SAMPLED_CATEGORY,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": a / 1000,
            "dur": max(b - a, 0) / 1000,
            "args": args,
        }

    counted = sum(1 for t, _ in samples if start_ns <= t < end_ns)
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": tid,
            "args": {"name": f"sampled: training thread ({rate} Hz)"},
        },
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": -1}},
        span(
            f"slow step: batch {data['batch']} (sampled)",
            start_ns,
            end_ns,
            {"sampled": True, "samples": counted, "rate_hz": rate, "truncated": bool(data.get("truncated")), **detail},
        ),
    ]
    # Parents before children where bounds tie: viewers nest equal spans in file order.
    spans = sorted(sample_spans(samples, interval, start_ns, end_ns), key=lambda s: (s[2], s[2] - s[3], s[1]))
    for index, depth, t0, t1 in spans:
        samples_in = max(1, round((t1 - t0) / interval)) if interval > 0 else 1
        events.append(span(frame_name(frames[index]), t0, t1, {"sampled": True, "depth": depth, "samples": samples_in}))
    return events


def add_flight_track(trace: WindowTrace, data: dict[str, Any] | None, calibration: Calibration) -> None:
    """Add the sampled track of ``data`` to the trace and name its step in the metadata."""
    if not data:
        return
    meta = trace.meta
    events = flight_track(data, calibration, float(meta.get("time_origin_us", 0)))
    if not events:
        return
    trace.add(events)
    earliest_us = min(float(e["ts"]) for e in events if "ts" in e)
    if earliest_us < 0:  # the slow step precedes the time origin: lower it by whole seconds
        lower_origin(trace, math.ceil(-earliest_us / ORIGIN_GRANULARITY_US))
        snap_to_nanoseconds(trace.events)
    meta["flight"] = {
        "batch": data.get("batch"),
        "samples": events[2]["args"]["samples"],
        "rate_hz": events[2]["args"]["rate_hz"],
        "truncated": bool(data.get("truncated")),
    }
