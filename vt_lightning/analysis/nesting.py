"""Strict nesting on every thread of a merged window: the passes ``merge.merge_trace`` runs once
the Python calls and torch's events share one timeline. Pure: they edit the events in place.

Perfetto drops an X event that overlaps another on its thread without nesting in it, and the one
it drops may be the span around the whole step. In order: ``repair_boundaries`` moves a Python
call's edge by at most the calibration's tolerance so that the op it issued nests in it;
``untangle_annotations`` cuts Python calls at the annotation ranges they cross;
``separate_crossing_ranges`` moves any torch range still crossing another event to a track of its
own beside its thread (``RANGE_TRACK_TID_BASE``). ``count_crossings`` counts what is left (tests,
benchmarks). ``ThreadSpans`` groups one window's events per thread once for all passes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any

import numpy as np

from vt_lightning.analysis.nest import DROP_PARENT, SKIP, covering, lanes, nests, outer_first, walk
from vt_lightning.constants import (
    ANNOTATION_PREFIXES,
    CPU_OP_CATEGORY,
    PYTHON_CATEGORY,
    USER_ANNOTATION_CATEGORY,
)

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
_TS, _DUR, _NAME = itemgetter("ts"), itemgetter("dur"), itemgetter("name")
_START, _END = itemgetter(0), itemgetter(1)
NsSpan = tuple[int, int, dict[str, Any]]  # an event's start and end in integer ns, and the event


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

    __slots__ = ("annotations", "cut", "ops", "ordered", "other", "python")

    def __init__(self, events: Iterable[dict[str, Any]] = ()) -> None:
        self.python: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.ops: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.annotations: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.other: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.cut: set[Thread] = set()  # threads where untangle_annotations moved a call's bounds
        # threads whose calls were filed outer first (``outer_first``'s order: the filter's, on the
        # same bounds), so that a pass that reads them in that order need not check it
        self.ordered: set[Thread] = set()
        for event in events:
            if event.get("ph") == "X":
                self.add(event, event.get("cat"), str(event.get("name", "")))

    def add(self, event: dict[str, Any], cat: Any, name: str) -> None:
        """File one X event (its ``cat`` and ``name`` as read) under its thread and kind: callers
        that already walk the events (the merge's contract loops) group them in the same pass."""
        key = (event.get("pid"), event.get("tid"))
        if cat == PYTHON_CATEGORY:
            self.python[key].append(event)
        elif cat == USER_ANNOTATION_CATEGORY or is_range_name(name):
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
    """Python calls and torch ops of one thread that overlap without nesting (any amount): each one
    that ends after the innermost open span of the other kind it starts in (``nest.walk``, every
    span keeping its own end: open spans form a nested chain, so crossing any of them means
    crossing the innermost)."""
    threads = threads if threads is not None else ThreadSpans(events)
    crossings = 0
    # A thread with no op (a DataLoader worker's, a helper thread) or no Python call has no crossing
    # to count: its spans are not even sorted.
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
    events: list[dict[str, Any]],
    threads: ThreadSpans | None = None,
    *,
    snap: bool = False,
    bounds: dict[Thread, list[tuple[float, float, str]]] | None = None,
    settled: Mapping[Thread, SnappedCalls] | None = None,
) -> int:
    """Make Python calls nest with the annotation ranges they open or close.

    A range (``ProfilerStep#N``, ``[pl][...]``, a ``record_function``) starts inside the Python call
    that opens it and outlives that call, so the two overlap without nesting. TensorBoard's viewer
    tolerates that; Perfetto (ui.perfetto.dev, vizviewer) drops the range. Each Python call open at a
    range's start that ends inside the range is cut at the range's start; each one open at its end
    that began inside the range starts at the range's end. The cut keeps its original bounds in
    ``args`` (``vt_lightning.ts`` / ``vt_lightning.dur``). Returns how many calls were cut.
    ``snap``: its last loop, which visits every call once, also puts each on the nanosecond grid as
    ``merge.snap_to_nanoseconds`` would once it is settled (later calls read only the ends kept on
    the loop's stack, from before the snap), saving ``merge_trace`` a pass over the calls.
    ``bounds`` (with ``snap``): filled, for each thread whose calls came in order
    (``ThreadSpans.ordered``, a DataLoader worker's) and that no cut touched, with its calls'
    ``(start, end, name)`` as snapped, in their order: what a reader of the written trace computes
    from each call (``ts``, ``ts + dur``), made here where the loop holds them, so the summary
    need not walk those calls again (``steps.classify``).
    ``settled`` (with ``snap``): in-order threads whose calls this loop would not cut, as it would
    leave them (``nest_uncut``, ``snap_arrays``: made where the times were arrays), taken without
    the loop.
    """
    threads = threads if threads is not None else ThreadSpans(events)
    python, ranges = threads.python, threads.annotations
    cuts: dict[int, tuple[dict[str, Any], float, float]] = {}
    for key, thread_ranges in ranges.items():
        calls = python.get(key)
        if not calls:
            continue
        calls[:] = outer_first(calls)
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
    # A cut parent can leave a child (placed within the calibration's uncertainty) sticking out.
    threads.cut.update(call_key(call) for call, _, _ in cuts.values())
    ordered = threads.ordered - ranges.keys() - threads.ops.keys()  # neither sorted nor moved above
    ready = settled if snap and settled is not None else {}
    for key, calls in python.items():
        known = ready.get(key) if key in ordered else None
        if known is not None and len(known[0]) == len(calls):
            grid_ts, grid_dur, grid_end, written = known
            if not written:
                for call, start, length in zip(calls, grid_ts, grid_dur):
                    call["dur"] = length
                    call["ts"] = start
            if bounds is not None:
                bounds[key] = list(zip(grid_ts, grid_end, map(_NAME, calls)))
            continue
        in_order = key in ordered
        walked = calls if in_order else outer_first(calls)

        def cut(i: int, _: int, parent_end: float, walked: list[dict[str, Any]] = walked, key: Thread = key) -> float:
            call = walked[i]  # a call outliving the call it starts in: cut at that call's end
            _set_bounds(call, call["ts"], parent_end)
            cuts[id(call)] = (call, 0.0, 0.0)
            threads.cut.add(key)
            return call["ts"] + call["dur"]

        walk([call["ts"] for call in walked], [call["ts"] + call["dur"] for call in walked], crossing=cut)
        if snap:
            bound = bounds.setdefault(key, []).append if in_order and bounds is not None else None
            for call in walked:  # as merge.snap_to_nanoseconds would, each call once settled
                ts = float(call["ts"])
                end = ts + float(call["dur"])
                start_ns = round(ts * 1000)
                end_ns = round(end * 1000)
                snapped_dur = (end_ns - start_ns if end_ns > start_ns else 0) / 1000
                snapped_ts = start_ns / 1000
                call["dur"] = snapped_dur
                call["ts"] = snapped_ts
                if bound is not None:
                    bound((snapped_ts, snapped_ts + snapped_dur, call["name"]))
    if bounds is not None:
        for key in threads.cut.intersection(bounds):  # a later pass may move a cut thread's calls
            del bounds[key]
    return len(cuts)


# A thread's calls as ``untangle_annotations``' last loop leaves them when none is cut: each one's
# ``ts``, ``dur`` and ``ts + dur`` on the nanosecond grid, in the thread's (outer-first) order, and
# whether the calls hold those times already.
SnappedCalls = tuple[list[float], list[float], list[float], bool]


def nest_uncut(starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether ``untangle_annotations``' last loop cuts none of an in-order thread's calls
    (``starts``, ``lengths``: their ``ts`` and ``dur``, outer-first): the same test on the same
    ends (``start + length``), as ``nest.nests`` answers it."""
    return nests(starts, starts + lengths)


def snap_arrays(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls' ``ts`` and ``dur`` on the nanosecond grid as ``untangle_annotations``' snap puts them:
    each operation on the same doubles, element by element (``+ 0.0`` makes a rounded -0.0 the 0
    that ``round`` gives), for a caller that holds the times as arrays."""
    start_ns = np.rint(starts * 1000) + 0.0
    end_ns = np.rint((starts + lengths) * 1000) + 0.0
    return start_ns / 1000, np.where(end_ns > start_ns, end_ns - start_ns, 0.0) / 1000


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
    """The last nesting pass, on the nanosecond grid: nothing on a thread may overlap without nesting.

    What the earlier passes leave (a torch.compile range closed in a call that began inside it, a
    range crossing an op or another range) is settled here: a torch event that crosses moves, at
    the same times, to a track of its own beside its thread (``<thread> · torch ranges``, one lane
    per level of overlap), so the compile time still shows where it happened and Perfetto drops
    nothing; a Python call that outlives its parent is cut at the parent's end (original bounds in
    ``args``). Returns (moved, cut). Run after ``snap_to_nanoseconds``; ``threads``: ``events``
    already grouped. ``calls_nest``: ``untangle_annotations`` ran on ``threads``, so a thread with
    nothing but calls (a DataLoader worker's, most of a window's events) whose calls it left as they
    were nests (snapping keeps every start and end in order) and is skipped. One it cut is not: a cut
    call's start is rounded up, and a sibling that started with it may now start before it.
    """
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
