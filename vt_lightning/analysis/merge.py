"""Merge one window's torch trace and VizTracer events into one trace the TensorBoard plugin loads.

Pure functions: dicts in, dict or bytes out. The contract (torch-tb-profiler 0.4.3, frozen upstream):
``traceEvents`` is the last top-level key, every ``X`` event has a string ``cat``, torch's metadata
(``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``...) is kept,
and ``distributedInfo`` is written with a space after each colon so HTA's ``"rank":\\s+(\\d+)`` finds
the rank.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from vt_lightning.analysis.clock import Calibration
from vt_lightning.constants import (
    ANNOTATION_PREFIXES,
    CPU_OP_CATEGORY,
    PYTHON_CATEGORY,
    STEP_PREFIX,
    USER_ANNOTATION_CATEGORY,
)

FALLBACK_CATEGORY = "unknown"
_SPACED_KEYS = ("distributedInfo",)
# Ops nest inside the Python call that issued them. Annotations (ProfilerStep#, record_function)
# may open in one Python call and close in another, so they are not held to nesting.
NESTED_TORCH_CATEGORIES = (CPU_OP_CATEGORY,)
# torch.compile's ranges, written as cpu_op: the compiled frame and AOT's runtime wrappers open them
# in one Python call (``RecordFunctionFast.__enter__``, a ``record_function`` helper) and close them
# in another, and dynamo's compile phases (``dynamo_timed``) span calls of their own. Measured on a
# Trainer window (examples/vision.py, aot_eager): 7-8 crossings per window when held to nesting as ops.
COMPILE_RANGE_PREFIXES = (
    "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper",
    "## Call CompiledFxGraph",
    "## ",
    "Torch-Compiled Region",
    "CompiledFunction",
    "TorchDynamo Cache Lookup",
    "entire_frame_compile",
    "dynamo",
)
COMPILE_RANGE_SUFFIX = "(dynamo_timed)"
# A torch range still crossing another event once all repairs are done moves to a track of its own
# beside its thread: base + lane * LANE_STRIDE + tid (a Linux tid is below 2**22; flight.py's
# sampled track uses 1e9 + tid).
RANGE_TRACK_TID_BASE = 2_000_000_000
RANGE_TRACK_LANE_STRIDE = 1 << 22


# Beyond the calibration's uncertainty, each tracer stamps an event a little after or before the
# instant it describes (VizTracer in its profile hook, torch in its op callbacks). With wall-clock
# calibration, residual crossings of up to ~0.1 µs were measured between a Python call and the op
# it issued; twice that is allowed. (Marker calibration has shown none in 60 runs.)
STAMP_JITTER_US = 0.2


# Where torch's timestamps live (µs on its steady clock, e.g. 4.5e12 after 52 days of uptime) a
# double resolves only ~0.001 µs, so ``ts + dur`` is off by up to a nanosecond and a child can end
# "after" its parent once parsed. The merged trace is therefore moved to an origin of whole
# seconds (``baseTimeNanoseconds`` moves with it, so absolute time is unchanged), all arithmetic
# happens there, and every boundary is finally snapped to whole nanoseconds: exactly the integers
# Perfetto reads (``llround(ts * 1000)``), so what nests here nests there.
ORIGIN_GRANULARITY_US = 1_000_000


def time_origin_us(events: Iterable[dict[str, Any]]) -> int:
    """Whole seconds (in µs) at or below the earliest timestamp: the merged trace's new zero."""
    first = min((float(e["ts"]) for e in events if "ts" in e), default=0.0)
    return int(first // ORIGIN_GRANULARITY_US) * ORIGIN_GRANULARITY_US


def rebase_events(events: Iterable[dict[str, Any]], origin_us: int) -> None:
    """Subtract ``origin_us`` from every ``ts`` without losing the digits a double still holds.

    The integer part is subtracted exactly and the fractional part (the nanoseconds torch wrote)
    is added back, so a value written as ``4544795024354.149`` becomes exactly ``354.149`` later
    than its origin as long as the parsed double still told the nanoseconds apart (< ~100 days).
    """
    if not origin_us:
        return
    for event in events:
        if "ts" in event:
            ts = float(event["ts"])
            whole = math.floor(ts)
            event["ts"] = (whole - origin_us) + (ts - whole)


def snap_to_nanoseconds(events: Iterable[dict[str, Any]]) -> None:
    """Put every start and end on the nanosecond grid, ``dur`` as the difference of the two.

    Rounding is monotonic, so spans that nest (or touch) keep nesting (or touching); rounding
    ``ts`` and ``dur`` separately, as before, could push a child's end 1 ns past its parent's.
    """
    for event in events:
        if "ts" not in event:
            continue
        ts = float(event["ts"])
        start = round(ts * 1000)
        if event.get("ph") == "X":
            end = round((ts + float(event.get("dur", 0.0))) * 1000)
            event["dur"] = (end - start if end > start else 0) / 1000
        event["ts"] = start / 1000


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


def merge_metadata_events(
    torch_events: list[dict[str, Any]],
    python_meta: list[dict[str, Any]],
    thread_names: Mapping[int, str] | None = None,
) -> list[dict[str, Any]]:
    """Torch's metadata plus the real thread names, one ``thread_name`` per (pid, tid).

    ``thread_names`` (native thread id -> ``threading`` name, read at window end) corrects
    VizTracer's names where it read them too early (``Dummy-N`` on Python 3.12+).
    """
    python_threads = {(e.get("pid"), e.get("tid")): e for e in python_meta if e.get("name") == "thread_name"}
    for (_, tid), event in python_threads.items():
        if thread_names and isinstance(tid, int) and tid in thread_names:
            event["args"] = {**event.get("args", {}), "name": thread_names[tid]}
    out = [
        e
        for e in torch_events
        if not (
            e.get("ph") == "M" and e.get("name") == "thread_name" and (e.get("pid"), e.get("tid")) in python_threads
        )
    ]
    out.extend(python_threads.values())
    torch_processes = {e.get("pid") for e in torch_events if e.get("name") == "process_name"}
    out.extend(e for e in python_meta if e.get("name") == "process_name" and e.get("pid") not in torch_processes)
    return out


def ensure_contract(events: list[dict[str, Any]]) -> int:
    """Give every event a name and every X event a string cat/ts/dur; returns how many were fixed."""
    fixed = 0
    for event in events:
        if not isinstance(event.get("name"), str):
            event["name"] = str(event.get("name", ""))
            fixed += 1
        if event.get("ph") == "X":
            if not isinstance(event.get("cat"), str):
                event["cat"] = FALLBACK_CATEGORY
                fixed += 1
            if "ts" not in event:
                event["ts"] = 0.0
                fixed += 1
            if "dur" not in event:
                event["dur"] = 0.0
                fixed += 1
    return fixed


def is_range_name(name: str) -> bool:
    """A torch event written as ``cpu_op`` that is a range opened and closed by Python calls
    (Lightning's, the profiler's steps, torch.compile's), not an op nested in its caller."""
    return (
        name.startswith(ANNOTATION_PREFIXES)
        or name.startswith(COMPILE_RANGE_PREFIXES)
        or name.endswith(COMPILE_RANGE_SUFFIX)
    )


def _crossing_fix(ps: float, pe: float, es: float, ee: float) -> tuple[float, float, float] | None:
    """If [ps, pe] and [es, ee] cross (neither contains the other, yet they overlap), return the
    cheapest (cost, new_ps, new_pe) that moves only the Python span into nesting or apart."""
    if ps < es < pe < ee:  # the torch event sticks out of the Python span's end
        options = [(ee - pe, ps, ee), (pe - es, ps, es), (es - ps, es, pe)]
    elif es < ps < ee < pe:  # ... or out of its start
        options = [(ps - es, es, pe), (ee - ps, ee, pe), (pe - ee, ps, ee)]
    else:
        return None
    return min(options)


Thread = tuple[Any, Any]


class ThreadSpans:
    """One window's X events per (pid, tid), in the kinds the nesting passes read: Python calls,
    torch ops (which nest in the call that issued them), annotation ranges (which need not) and
    the rest (which the last pass holds to nesting too). Grouped once for all passes: each
    grouping is a pass over every event of the window."""

    __slots__ = ("annotations", "ops", "other", "python")

    def __init__(self, events: Iterable[dict[str, Any]]) -> None:
        self.python: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.ops: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.annotations: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.other: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        for event in events:
            if event.get("ph") != "X":
                continue
            cat = event.get("cat")
            key = (event.get("pid"), event.get("tid"))
            if cat == PYTHON_CATEGORY:
                self.python[key].append(event)
            elif cat == USER_ANNOTATION_CATEGORY or is_range_name(str(event.get("name", ""))):
                self.annotations[key].append(event)  # opened and closed by Python calls, not nested
            elif cat in NESTED_TORCH_CATEGORIES:
                self.ops[key].append(event)
            else:
                self.other[key].append(event)

    def all_events(self) -> dict[Thread, list[dict[str, Any]]]:
        """Every X event per thread, whatever its kind."""
        out: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        for kind in (self.python, self.ops, self.annotations, self.other):
            for key, thread_events in kind.items():
                out[key].extend(thread_events)
        return out


def repair_boundaries(
    events: list[dict[str, Any]], tolerance_us: float, threads: ThreadSpans | None = None
) -> tuple[int, int]:
    """Resolve Python/torch spans of one thread that cross by at most ``tolerance_us``.

    Torch's timestamps are authoritative; a Python span (placed with the calibration's uncertainty)
    that crosses a torch span is moved by the smallest amount that makes them nest or not overlap.
    Returns (repaired, crossings larger than the tolerance, left as they are). Nothing is dropped.
    ``threads``: ``events`` already grouped (``merge_trace`` groups once for every pass).
    """
    threads = threads if threads is not None else ThreadSpans(events)
    repaired = unrepaired = 0
    for key, py_events in threads.python.items():
        thread_ops = threads.ops.get(key)
        if not thread_ops:
            continue
        spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in thread_ops]
        by_start = sorted(spans)
        starts = [s for s, _ in by_start]
        by_end = sorted(spans, key=lambda span: span[1])
        ends = [e for _, e in by_end]
        edges = sorted(starts + ends)
        last = len(edges)
        for event in py_events:
            ps = float(event["ts"])
            pe = ps + float(event["dur"])
            # Most calls have no torch boundary within the tolerance of either of their own: the
            # candidates below would be empty, so two searches settle them.
            near_start = bisect_left(edges, ps - tolerance_us)
            near_end = bisect_left(edges, pe - tolerance_us)
            if (near_start == last or edges[near_start] > ps + tolerance_us) and (
                near_end == last or edges[near_end] > pe + tolerance_us
            ):
                continue
            # A crossing that tolerance can fix puts some torch boundary near a Python boundary;
            # larger crossings are counted from spans starting inside the Python span.
            candidates = set()
            for edge in (ps, pe):
                lo, hi = bisect_left(starts, edge - tolerance_us), bisect_right(starts, edge + tolerance_us)
                candidates.update(by_start[lo:hi])
                lo, hi = bisect_left(ends, edge - tolerance_us), bisect_right(ends, edge + tolerance_us)
                candidates.update(by_end[lo:hi])
            best = None
            for es, ee in candidates:
                fix = _crossing_fix(ps, pe, es, ee)
                if fix is not None and (best is None or fix < best):
                    best = fix
            if best is None:
                continue
            cost, new_ps, new_pe = best
            if cost <= tolerance_us:
                event["ts"] = round(new_ps, 3)
                event["dur"] = round(new_pe - new_ps, 3)
                repaired += 1
            else:
                unrepaired += 1
    return repaired, unrepaired


def count_crossings(events: list[dict[str, Any]], threads: ThreadSpans | None = None) -> int:
    """Python calls and torch ops of one thread that overlap without nesting (any amount)."""
    threads = threads if threads is not None else ThreadSpans(events)
    by_thread: dict[Thread, list[tuple[float, float, bool]]] = defaultdict(list)
    # A thread with no op (a DataLoader worker's, a helper thread) or no Python call has no crossing
    # to count: its spans are not even sorted.
    both = threads.python.keys() & threads.ops.keys()
    for kind, is_python in ((threads.python, True), (threads.ops, False)):
        for key, thread_events in kind.items():
            if key not in both:
                continue
            spans = by_thread[key]
            for event in thread_events:
                start = float(event["ts"])
                spans.append((start, start + float(event["dur"]), is_python))
    crossings = 0
    for spans in by_thread.values():
        spans.sort(key=lambda span: (span[0], -span[1]))
        stack: list[tuple[float, float, bool]] = []
        for start, end, is_python in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            # Open spans form a nested chain, so crossing any of them means crossing the innermost.
            if stack and stack[-1][2] != is_python and stack[-1][1] < end:
                crossings += 1
            stack.append((start, end, is_python))
    return crossings


def untangle_annotations(events: list[dict[str, Any]], threads: ThreadSpans | None = None) -> int:
    """Make Python calls nest with the annotation ranges they open or close.

    A range (``ProfilerStep#N``, ``[pl][...]``, a ``record_function``) starts inside the Python call
    that opens it and outlives that call, so the two overlap without nesting. TensorBoard's viewer
    tolerates that; Perfetto (ui.perfetto.dev, vizviewer) drops the range. Each Python call open at a
    range's start that ends inside the range is cut at the range's start; each one open at its end
    that began inside the range starts at the range's end. The cut keeps its original bounds in
    ``args`` (``vt_lightning.ts`` / ``vt_lightning.dur``). Returns how many calls were cut.
    """
    threads = threads if threads is not None else ThreadSpans(events)
    python, ranges = threads.python, threads.annotations
    cuts: dict[int, tuple[dict[str, Any], float, float]] = {}
    for key, thread_ranges in ranges.items():
        calls = python.get(key)
        if not calls:
            continue
        calls.sort(key=lambda e: (e["ts"], -e["dur"]))
        # (time, is_end, range start, range end): sweep the Python calls open at every range edge.
        points = sorted(
            (t, is_end, a["ts"], a["ts"] + a["dur"])
            for a in thread_ranges
            for t, is_end in ((a["ts"], False), (a["ts"] + a["dur"], True))
        )
        stack: list[dict[str, Any]] = []
        i = 0
        for t, is_end, start, end in points:
            while i < len(calls) and calls[i]["ts"] < t:
                call = calls[i]
                while stack and stack[-1]["ts"] + stack[-1]["dur"] <= call["ts"]:
                    stack.pop()
                stack.append(call)
                i += 1
            for call in stack:
                c_start, c_end = call["ts"], call["ts"] + call["dur"]
                if not c_start < t < c_end:
                    continue
                new_start, new_end = cuts.get(id(call), (call, c_start, c_end))[1:]
                if not is_end and c_end < end:  # opened the range, returned inside it
                    cuts[id(call)] = (call, new_start, min(new_end, t))
                elif is_end and c_start > start:  # began inside the range, closed it
                    cuts[id(call)] = (call, max(new_start, t), new_end)
    for call, new_start, new_end in cuts.values():
        _set_bounds(call, new_start, new_end)
    # A cut parent can leave a child (placed within the calibration's uncertainty) sticking out.
    for calls in python.values():
        stack = []
        for call in sorted(calls, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= call["ts"]:
                stack.pop()
            if stack and call["ts"] + call["dur"] > stack[-1]["ts"] + stack[-1]["dur"]:
                _set_bounds(call, call["ts"], stack[-1]["ts"] + stack[-1]["dur"])
                cuts[id(call)] = (call, 0.0, 0.0)
            stack.append(call)
    return len(cuts)


def _set_bounds(call: dict[str, Any], start: float, end: float) -> None:
    args = call.setdefault("args", {})
    args.setdefault("vt_lightning.ts", call["ts"])
    args.setdefault("vt_lightning.dur", call["dur"])
    call["ts"] = math.ceil(start * 1000) / 1000  # rounded inwards, never across the cut
    call["dur"] = max(math.floor((end - call["ts"]) * 1000) / 1000, 0.0)


def separate_crossing_ranges(events: list[dict[str, Any]], threads: ThreadSpans | None = None) -> tuple[int, int]:
    """The last nesting pass, on the nanosecond grid: nothing on a thread may overlap without nesting.

    What the earlier passes leave (a torch.compile range closed in a call that began inside it, a
    range crossing an op or another range) is settled here: a torch event that crosses moves, at
    the same times, to a track of its own beside its thread (``<thread> · torch ranges``, one lane
    per level of overlap), so the compile time still shows where it happened and Perfetto drops
    nothing; a Python call that outlives its parent is cut at the parent's end (original bounds in
    ``args``). Returns (moved, cut). Run after ``snap_to_nanoseconds``; ``threads``: ``events``
    already grouped.
    """
    grouped = (threads if threads is not None else ThreadSpans(events)).all_events()
    by_thread: dict[Thread, list[tuple[int, int, dict[str, Any]]]] = {}
    floor = math.floor
    for key, thread_events in grouped.items():  # integer ns, as Perfetto reads them (llround of ts, dur)
        spans = by_thread[key] = []
        for event in thread_events:
            start = floor(float(event["ts"]) * 1000 + 0.5)
            spans.append((start, start + floor(float(event["dur"]) * 1000 + 0.5), event))
    moved: dict[Thread, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    cut = 0
    for key, spans in by_thread.items():
        spans.sort(key=lambda span: (span[0], -span[1]))
        stack: list[tuple[int, int, dict[str, Any]]] = []
        for span in spans:
            start, end, event = span
            while True:
                while stack and stack[-1][1] <= start:
                    stack.pop()
                if not stack or stack[-1][1] >= end:
                    stack.append(span)
                    break
                top = stack[-1]
                if event.get("cat") != PYTHON_CATEGORY:
                    moved[key].append(span)
                    break
                if top[2].get("cat") != PYTHON_CATEGORY:
                    moved[key].append(stack.pop())  # the range moves; the call may nest in the next one
                    continue
                _set_bounds(event, event["ts"], top[1] / 1000)  # a call outliving its parent call
                span = (start, top[1], event)
                end = top[1]
                cut += 1
    if moved:
        events.extend(_range_tracks(events, moved))
    return sum(len(spans) for spans in moved.values()), cut


def _range_tracks(
    events: list[dict[str, Any]], moved: Mapping[Thread, list[tuple[int, int, dict[str, Any]]]]
) -> list[dict[str, Any]]:
    """Put each thread's moved ranges on lanes where they nest; returns the lanes' metadata events."""
    names = {
        (e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", e.get("tid")))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    meta: list[dict[str, Any]] = []
    for (pid, tid), spans in moved.items():
        lanes: list[list[tuple[int, int, dict[str, Any]]]] = []  # each lane: the stack of open spans
        for start, end, event in sorted(spans, key=lambda span: (span[0], -span[1])):
            for lane in lanes:
                while lane and lane[-1][1] <= start:
                    lane.pop()
                if not lane or lane[-1][1] >= end:
                    break
            else:
                lane = []
                lanes.append(lane)
            lane.append((start, end, event))
            number = lanes.index(lane)
            event["tid"] = _lane_tid(tid, number)
            event.setdefault("args", {})["vt_lightning.thread"] = tid
        for number in range(len(lanes)):
            lane_tid = _lane_tid(tid, number)
            label = f"{names.get((pid, tid), tid)} · torch ranges" + (f" {number + 1}" if number else "")
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane_tid, "args": {"name": label}})
    return meta


def _lane_tid(tid: Any, number: int) -> Any:
    if isinstance(tid, int) and 0 <= tid < RANGE_TRACK_LANE_STRIDE:
        return RANGE_TRACK_TID_BASE + number * RANGE_TRACK_LANE_STRIDE + tid
    return f"{tid} torch ranges {number + 1}"


def drop_unrun_steps(events: list[dict[str, Any]], steps: Iterable[int]) -> int:
    """Remove ``ProfilerStep#N`` ranges opened for a batch that never ran (training ended first)."""
    ran = {f"{STEP_PREFIX}{step}" for step in steps}
    unrun = [i for i, e in enumerate(events) if e.get("name", "").startswith(STEP_PREFIX) and e["name"] not in ran]
    if unrun:  # usually none: the list is rebuilt only when a range goes
        gone = set(unrun)
        events[:] = [e for i, e in enumerate(events) if i not in gone]
    return len(unrun)


def merge_trace(
    torch_trace: Mapping[str, Any],
    python_events: Iterable[dict[str, Any]],
    calibration: Calibration,
    vt_metadata: Mapping[str, Any],
    thread_names: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """One trace dict: torch's keys, ``vt_lightning`` metadata, then ``traceEvents`` last."""
    torch_events = list(torch_trace.get("traceEvents", []))
    origin_us = time_origin_us(torch_events)
    rebase_events(torch_events, origin_us)
    timed, python_meta = shift_python_events(python_events, calibration, origin_us)
    events = merge_metadata_events(torch_events, python_meta, thread_names)
    events.extend(timed)
    fixed = ensure_contract(events)
    if "steps" in vt_metadata:
        drop_unrun_steps(events, vt_metadata["steps"])
    tolerance = calibration.uncertainty_us + STAMP_JITTER_US
    threads = ThreadSpans(events)
    repaired, _ = repair_boundaries(events, tolerance, threads)
    untangled = untangle_annotations(events, threads)
    snap_to_nanoseconds(events)
    moved, clamped = separate_crossing_ranges(events, threads)

    merged: dict[str, Any] = {k: v for k, v in torch_trace.items() if k != "traceEvents"}
    if origin_us:
        merged["baseTimeNanoseconds"] = int(merged.get("baseTimeNanoseconds", 0)) + origin_us * 1000
    if "distributedInfo" not in merged and isinstance(vt_metadata.get("global_rank"), int):
        # torch writes it only under torch.distributed; HTA reads the rank from it and otherwise
        # warns and guesses rank 0 (wrong for every rank but one when ranks trace without DDP).
        merged["distributedInfo"] = {
            "backend": None,
            "rank": vt_metadata["global_rank"],
            "world_size": vt_metadata.get("world_size", 1),
        }
    meta = dict(vt_metadata)
    meta["time_origin_us"] = origin_us
    meta["calibration"] = calibration.metadata()
    meta["python_events"] = len(timed)
    meta["torch_events"] = len(torch_events)
    meta["nesting"] = {
        "repaired": repaired,
        "crossings": moved + clamped,  # found by the last pass and settled there: none is left
        "tolerance_us": round(tolerance, 3),
        "cut_at_annotations": untangled,
        "moved_to_range_tracks": moved,
        "clamped_to_parent": clamped,
    }
    if fixed:
        meta["contract_fixes"] = fixed
    merged["vt_lightning"] = meta
    merged["traceEvents"] = events
    return merged


def encode_trace(trace: Mapping[str, Any]) -> bytes:
    """JSON bytes with ``traceEvents`` last and HTA-readable ``distributedInfo``."""
    parts = [b"{"]
    for key, value in trace.items():
        if key == "traceEvents":
            continue
        if key in _SPACED_KEYS:
            encoded = json.dumps(value, separators=(", ", ": ")).encode()
        else:
            encoded = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
        parts += [orjson.dumps(key), b":", encoded, b","]
    parts += [b'"traceEvents":', orjson.dumps(trace.get("traceEvents", [])), b"}"]
    return b"".join(parts)
