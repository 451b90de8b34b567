"""Strict nesting on every thread of a merged window, in place. Pure.

Perfetto drops an X event that overlaps another on its thread without nesting (maybe the step's
own span). ``repair_boundaries`` moves a call's edge within the calibration's tolerance,
``untangle_annotations`` cuts calls at the annotation ranges they cross, ``separate_crossing_ranges``
moves a range still crossing to a track of its own; ``count_crossings`` counts what is left."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any

import numpy as np

from vt_lightning.analysis.nest import (
    ARRAY_NEST_MIN,
    DROP_PARENT,
    SKIP,
    covering,
    lanes,
    nests,
    outer_first,
    outer_first_order,
    walk,
)
from vt_lightning.analysis.trace import Thread, ThreadSpans
from vt_lightning.constants import PYTHON_CATEGORY

# A range's track: base + lane * LANE_STRIDE + tid (a Linux tid is below 2**22; flight's is 1e9 + tid).
RANGE_TRACK_TID_BASE = 2_000_000_000
RANGE_TRACK_LANE_STRIDE = 1 << 22
_TS, _DUR, _NAME = itemgetter("ts"), itemgetter("dur"), itemgetter("name")
_START, _END = itemgetter(0), itemgetter(1)
NsSpan = tuple[int, int, dict[str, Any]]  # an event's start and end in integer ns, and the event


def _crossing_fix(ps: float, pe: float, es: float, ee: float) -> tuple[float, float, float] | None:
    """The cheapest (cost, new_ps, new_pe) moving the Python span to nest or part; None: no crossing."""
    if ps < es < pe < ee:  # the torch event sticks out of the Python span's end
        options = [(ee - pe, ps, ee), (pe - es, ps, es), (es - ps, es, pe)]
    elif es < ps < ee < pe:  # ... or out of its start
        options = [(ps - es, es, pe), (ee - ps, ee, pe), (pe - ee, ps, ee)]
    else:
        return None
    return min(options)


def repair_boundaries(
    events: list[dict[str, Any]], tolerance_us: float, threads: ThreadSpans | None = None
) -> tuple[int, int]:
    """Move each call crossing a torch op of its thread by at most ``tolerance_us`` (torch's times
    kept). Returns (repaired, crossings past the tolerance, left as they are)."""
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
            # most calls have no torch boundary near either of their own: two searches settle them
            near_start = bisect_left(edges, ps - tolerance_us)
            near_end = bisect_left(edges, pe - tolerance_us)
            if (near_start == last or edges[near_start] > ps + tolerance_us) and (
                near_end == last or edges[near_end] > pe + tolerance_us
            ):
                continue
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
    """Python calls and torch ops of one thread that overlap without nesting, by any amount."""
    threads = threads if threads is not None else ThreadSpans(events)
    crossings = 0
    for key in threads.python.keys() & threads.ops.keys():
        spans = outer_first(
            [
                (start, start + float(event["dur"]), is_python)
                for kind, is_python in ((threads.python, True), (threads.ops, False))
                for event in kind[key]
                for start in (float(event["ts"]),)
            ],
            _START,
            _END,
        )

        def cross(i: int, top: int, _: float, spans: list[tuple[float, float, bool]] = spans) -> float:
            nonlocal crossings
            if spans[top][2] != spans[i][2]:
                crossings += 1
            return spans[i][1]

        walk(map(_START, spans), map(_END, spans), crossing=cross)
    return crossings


def untangle_annotations(
    events: list[dict[str, Any]], threads: ThreadSpans | None = None, *, snap: bool = False
) -> int:
    """Make calls nest with the annotation ranges they open or close; returns the calls cut. A call open at
    a range's start that ends inside it is cut there, one open at its end that began inside it starts
    there, then a call outlasting its parent is cut (original bounds in ``args``). ``snap``: on the grid."""
    threads = threads if threads is not None else ThreadSpans(events)
    python, ranges = threads.python, threads.annotations
    cuts: dict[int, tuple[dict[str, Any], float, float]] = {}
    walked: dict[Thread, list[dict[str, Any]]] = {}  # each thread's calls outer first, sorted once
    for key, thread_ranges in ranges.items():
        calls = python.get(key)
        if not calls:
            continue
        walked[key] = calls = outer_first(calls)  # the thread's own list keeps the file's order
        # (time, is_end, range start, range end): the Python calls open at every range edge
        points = sorted(
            (t, is_end, a["ts"], a["ts"] + a["dur"])
            for a in thread_ranges
            for t, is_end in ((a["ts"], False), (a["ts"] + a["dur"], True))
        )
        spans = [(call["ts"], call["ts"] + call["dur"], call) for call in calls]
        for (t, is_end, start, end), found in zip(points, covering(spans, [point[0] for point in points], False)):
            for c_start, c_end, call in found:
                new_start, new_end = cuts.get(id(call), (call, c_start, c_end))[1:]
                if not is_end and c_end < end:  # opened the range, returned inside it
                    cuts[id(call)] = (call, new_start, min(new_end, t))
                elif is_end and c_start > start:  # began inside the range, closed it
                    cuts[id(call)] = (call, max(new_start, t), new_end)
    for call, new_start, new_end in cuts.values():
        _set_bounds(call, new_start, new_end)
    threads.cut.update(call_key(call) for call, _, _ in cuts.values())
    for key, thread_calls in python.items():
        if key in threads.settled:  # on the grid already (a worker's, as placed)
            continue
        calls = walked.get(key)
        if calls is None and snap and len(thread_calls) >= ARRAY_NEST_MIN and key not in threads.ops:
            settled = settle_as_arrays(thread_calls)
            if settled is not None:
                threads.settled[key] = settled
                continue
        calls = calls or outer_first(thread_calls)

        def cut(i: int, _: int, parent_end: float, calls: list[dict[str, Any]] = calls, key: Thread = key) -> float:
            call = calls[i]  # a call outliving the call it starts in: cut at that call's end
            _set_bounds(call, call["ts"], parent_end)
            cuts[id(call)] = (call, 0.0, 0.0)
            threads.cut.add(key)
            return call["ts"] + call["dur"]

        walk([call["ts"] for call in calls], [call["ts"] + call["dur"] for call in calls], crossing=cut)
        if snap:
            snap_spans(calls)
    return len(cuts)


def snap_spans(spans: Iterable[dict[str, Any]]) -> None:
    """Complete events on the nanosecond grid, ``dur`` the difference: monotonic, so nesting is kept."""
    for event in spans:
        ts = float(event["ts"])
        start = round(ts * 1000)
        end = round((ts + float(event["dur"])) * 1000)
        event["dur"] = (end - start if end > start else 0) / 1000
        event["ts"] = start / 1000


def write_times(calls: list[dict[str, Any]], starts: list[float], lengths: list[float], category: str | None) -> None:
    """Each call's ``ts`` and ``dur`` (and ``cat``), in the order read (as the events lie in memory)."""
    if category is None:
        for event, start, length in zip(calls, starts, lengths):
            event["dur"] = length
            event["ts"] = start
        return
    for event, start, length in zip(calls, starts, lengths):
        event["dur"] = length
        event["ts"] = start
        event["cat"] = category


def settle_as_arrays(
    calls: list[dict[str, Any]],
    starts: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    order: np.ndarray | None = None,
    category: str | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """A nesting thread's calls on the grid as ``untangle_annotations`` would leave them (the same
    doubles), their ts and dur returned; None, untouched, where one outlasts its parent."""
    if starts is None or lengths is None:
        count = len(calls)
        try:
            starts = np.fromiter(map(_TS, calls), dtype=float, count=count)
            lengths = np.fromiter(map(_DUR, calls), dtype=float, count=count)
        except (TypeError, ValueError):
            return None
    order = outer_first_order(starts, lengths) if order is None else order
    if not nests(starts[order], (starts + lengths)[order]):
        return None
    start_ns = np.rint(starts * 1000) + 0.0  # + 0.0: a rounded -0.0 is the 0 that round() gives
    end_ns = np.rint((starts + lengths) * 1000) + 0.0
    ts, dur = start_ns / 1000, np.where(end_ns > start_ns, end_ns - start_ns, 0.0) / 1000
    write_times(calls, ts.tolist(), dur.tolist(), category)
    return ts, dur


def call_key(event: Mapping[str, Any]) -> Thread:
    return (event.get("pid"), event.get("tid"))


def _set_bounds(call: dict[str, Any], start: float, end: float) -> None:
    args = call.setdefault("args", {})
    args.setdefault("vt_lightning.ts", call["ts"])
    args.setdefault("vt_lightning.dur", call["dur"])
    call["ts"] = math.ceil(start * 1000) / 1000  # rounded inwards, never across the cut
    call["dur"] = max(math.floor((end - call["ts"]) * 1000) / 1000, 0.0)


def separate_crossing_ranges(
    events: list[dict[str, Any]], threads: ThreadSpans | None = None, *, calls_nest: bool = False
) -> tuple[int, int]:
    """The last pass: a torch event still crossing another moves to a lane beside its thread, a call
    outliving its parent is cut; (moved, cut). ``calls_nest``: a calls-only thread that nests already."""
    threads = threads if threads is not None else ThreadSpans(events)
    grouped = threads.all_events()
    if calls_nest:
        calls_only = threads.python.keys() - threads.ops.keys() - threads.annotations.keys() - threads.other.keys()
        for key in calls_only - threads.cut:
            del grouped[key]
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
        spans[:] = outer_first(spans, _START, _END)  # by (start, -end)

        def settle(i: int, top: int, top_end: float, spans: list[NsSpan] = spans, key: Thread = key) -> Any:
            nonlocal cut
            event = spans[i][2]
            if event.get("cat") != PYTHON_CATEGORY:
                moved[key].append(spans[i])  # a range crossing: it moves
                return SKIP
            if spans[top][2].get("cat") != PYTHON_CATEGORY:
                moved[key].append(spans[top])  # the range moves; the call may nest in the next one
                return DROP_PARENT
            _set_bounds(event, event["ts"], top_end / 1000)  # a call outliving its parent call
            cut += 1
            return top_end

        walk(map(_START, spans), map(_END, spans), crossing=settle)
    if moved:
        events.extend(_range_tracks(events, moved))
        for key, spans in moved.items():  # filed anew under the tracks they moved to
            gone = {id(span[2]) for span in spans}
            for kind in (threads.ops, threads.annotations, threads.other):
                if key in kind:
                    kind[key] = [event for event in kind[key] if id(event) not in gone]
            for _, _, event in spans:
                threads.add(event, event.get("cat"), str(event.get("name", "")))
    return sum(len(spans) for spans in moved.values()), cut


def _range_tracks(
    events: list[dict[str, Any]], moved: Mapping[Thread, list[tuple[int, int, dict[str, Any]]]]
) -> list[dict[str, Any]]:
    """Each thread's moved ranges on lanes where they nest; returns the lanes' metadata events."""
    names = {
        (e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", e.get("tid")))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    meta: list[dict[str, Any]] = []
    for (pid, tid), spans in moved.items():
        ordered = outer_first(spans, _START, _END)
        numbers = lanes([span[0] for span in ordered], [span[1] for span in ordered])
        for (_, _, event), number in zip(ordered, numbers):
            event["tid"] = _lane_tid(tid, number)
            event.setdefault("args", {})["vt_lightning.thread"] = tid
        for number in range(max(numbers) + 1):
            lane_tid = _lane_tid(tid, number)
            label = f"{names.get((pid, tid), tid)} · torch ranges" + (f" {number + 1}" if number else "")
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane_tid, "args": {"name": label}})
    return meta


def _lane_tid(tid: Any, number: int) -> Any:
    if isinstance(tid, int) and 0 <= tid < RANGE_TRACK_LANE_STRIDE:
        return RANGE_TRACK_TID_BASE + number * RANGE_TRACK_LANE_STRIDE + tid
    return f"{tid} torch ranges {number + 1}"
