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
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from vt_lightning.analysis.clock import Calibration
from vt_lightning.analysis.nesting import (
    SnappedCalls,
    repair_boundaries,
    separate_crossing_ranges,
    untangle_annotations,
)
from vt_lightning.analysis.trace import MEMORY_EVENT, Calls, Thread, ThreadSpans, WindowTrace
from vt_lightning.constants import (
    PYTHON_CATEGORY,
    STEP_PREFIX,
    TRACE_METADATA_KEY,
)

FALLBACK_CATEGORY = "unknown"
_SPACED_KEYS = ("distributedInfo",)
_UNRUN = "\0unrun step"  # the name _settle marks an unrun step's range with, compared by identity
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


def ran_steps(steps: Iterable[int] | None) -> set[str] | None:
    """The names of the ``ProfilerStep#N`` ranges of the steps that ran (None: not known)."""
    return {f"{STEP_PREFIX}{step}" for step in steps} if steps is not None else None


@dataclass
class TorchPlacement:
    """``place_python_events``' map onto torch's timeline (less ``origin_us``) as coefficients, for
    a loop that already walks events to place them itself (``workers.place_events``, the
    DataLoader workers' calls, most of a window's) with the same operations in the same order, so
    the doubles are the same and ``merge_window`` need not walk them again. That loop also does
    the contract part (a name that is no string aside: the filter may drop the call, and the fix
    is counted) and notes here what the merge must still do."""

    t0: float
    span: float
    offset: float
    slope: float
    ran: set[str] | None
    mark: str = _UNRUN  # what an unrun step's range is renamed to (compared by identity)
    dropped: bool = False  # a call was marked as an unrun step's
    not_x: bool = False  # a placed call is not X (a "B"): the merge's groups hold X calls only
    unnamed: bool = False  # a call's name is no string: the merge fixes the calls the filter kept
    # threads placed outer-first whose calls untangle_annotations would not cut, as it leaves them
    settled: dict[Thread, SnappedCalls] = field(default_factory=dict)


def torch_placement(calibration: Calibration, origin_us: int, ran: set[str] | None) -> TorchPlacement:
    """The coefficients ``place_python_events`` computes from ``calibration``."""
    t0, t1 = calibration.start.python_us, calibration.end.python_us
    offset, drift = calibration.offset_us - origin_us, calibration.drift_us
    slope = drift / (t1 - t0) if t1 > t0 else 0.0
    return TorchPlacement(t0=t0, span=t1 - t0, offset=offset, slope=slope, ran=ran)


def _settle(
    events: list[dict[str, Any]], ran: set[str] | None, snap: bool
) -> tuple[int, ThreadSpans, bool, list[dict[str, Any]], list[dict[str, Any]]]:
    """In one pass over the window's events: give every event a name and every X event a string
    cat/ts/dur (the trace contract), mark the ``ProfilerStep#N`` ranges opened for a batch that
    never ran (training ended first; only when ``ran`` is given) for the caller to remove, and
    file the rest: the X events into ``ThreadSpans``, the ``[memory]`` instants and the metadata
    events in lists. Returns (events fixed, the groups, whether one was marked, the instants, the
    metadata). ``snap``: put every event that is not X on the nanosecond grid as
    ``snap_to_nanoseconds`` would (no nesting pass reads them)."""
    threads = ThreadSpans()
    add = threads.add
    memory: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    dropped = False
    fixed = 0
    for event in events:
        name = event.get("name")
        if not isinstance(name, str):
            name = event["name"] = str(event.get("name", ""))
            fixed += 1
        unrun = ran is not None and name.startswith(STEP_PREFIX) and name not in ran
        if unrun:
            event["name"] = _UNRUN  # marked: the list is rebuilt without them by the caller
            dropped = True
        ph = event.get("ph")
        if ph != "X":
            if snap and "ts" in event:
                event["ts"] = round(float(event["ts"]) * 1000) / 1000
            if ph == "M":
                metadata.append(event)
            elif ph == "i" and name == MEMORY_EVENT:
                memory.append(event)
            continue
        cat = event.get("cat")
        if not isinstance(cat, str):
            cat = event["cat"] = FALLBACK_CATEGORY
            fixed += 1
        if "ts" not in event:
            event["ts"] = 0.0
            fixed += 1
        if "dur" not in event:
            event["dur"] = 0.0
            fixed += 1
        if not unrun:
            add(event, cat, name)
    return fixed, threads, dropped, memory, metadata


def place_python_events(
    events: Iterable[dict[str, Any]], calibration: Calibration, origin_us: int, ran: set[str] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[Thread, list[dict[str, Any]]], int, bool, list[Any]]:
    """Place VizTracer events on torch's timeline (less ``origin_us``) and, in the same loop, do
    what ``_settle`` does to them (the contract, the unrun steps' marks, the calls grouped per
    thread) and snap those that are not X. Returns (timed, metadata, calls per thread, fixed,
    marked, the timed events that are no complete call). One loop over the Python events, most of
    a window's.

    Start and end of each call go through the same monotonic map (offset plus interpolated drift),
    so calls that nest on VizTracer's clock nest on torch's; shifting ``ts`` alone and keeping
    ``dur`` would let a child outlast its parent by the drift accumulated between their starts.
    ``tests/test_merge_passes.py`` holds the passes apart as the reference: the same doubles.
    """
    timed: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    loose: list[dict[str, Any]] = []
    calls: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
    fixed = 0
    dropped = False
    placement = torch_placement(calibration, origin_us, ran)
    t0, span, offset, slope = placement.t0, placement.span, placement.offset, placement.slope
    append = timed.append
    last_pid: Any = _UNRUN  # no event's: the first call looks its thread up
    last_tid: Any = _UNRUN
    thread_calls: list[dict[str, Any]] = []
    for event in events:
        get = event.get
        ph = get("ph")
        if ph == "M":
            meta.append(event)
            continue
        is_x = ph == "X"
        has_ts = "ts" in event
        if has_ts:
            ts = float(event["ts"])
            since = ts - t0
            drifted = slope * (0.0 if since < 0.0 else span if since > span else since) if slope else 0.0
            start = ts + offset + drifted
            event["ts"] = start
            if is_x:
                end_py = ts + float(get("dur", 0.0))
                since = end_py - t0
                drifted = slope * (0.0 if since < 0.0 else span if since > span else since) if slope else 0.0
                end = end_py + offset + drifted
                event["dur"] = end - start if end > start else 0.0
        if is_x:
            event["cat"] = PYTHON_CATEGORY
            if "dur" not in event:
                event["dur"] = 0.0
        elif not isinstance(get("cat"), str):
            event["cat"] = PYTHON_CATEGORY
        append(event)
        # _settle's part
        name = get("name")
        if not isinstance(name, str):
            name = event["name"] = str(get("name", ""))
            fixed += 1
        unrun = ran is not None and name.startswith(STEP_PREFIX) and name not in ran
        if unrun:
            event["name"] = _UNRUN
            dropped = True
        if not is_x:
            if has_ts:  # snap_to_nanoseconds' part: no nesting pass reads an event that is not X
                event["ts"] = round(start * 1000) / 1000
                loose.append(event)
            continue
        if not has_ts:
            event["ts"] = 0.0
            fixed += 1
        if not unrun:
            pid, tid = get("pid"), get("tid")
            if tid != last_tid or pid != last_pid:  # a thread's calls come in runs: one lookup per run
                last_pid, last_tid = pid, tid
                thread_calls = calls[(pid, tid)]
            thread_calls.append(event)
    return timed, meta, calls, fixed, dropped, loose


def _name_calls(calls: list[dict[str, Any]], ran: set[str] | None) -> tuple[int, bool]:
    """``place_python_events``' name fix and unrun mark of the calls whose name is no string."""
    fixed, dropped = 0, False
    for event in calls:
        if not isinstance(event.get("name"), str):
            name = event["name"] = str(event.get("name", ""))
            fixed += 1
            if ran is not None and name.startswith(STEP_PREFIX) and name not in ran:
                event["name"] = _UNRUN
                dropped = True
    return fixed, dropped


def _snap_spans(groups: Iterable[Mapping[Thread, list[dict[str, Any]]]]) -> None:
    """``snap_to_nanoseconds`` of the X events in ``groups`` (``ThreadSpans``' kinds)."""
    for group in groups:
        for thread_events in group.values():
            for event in thread_events:
                ts = float(event["ts"])
                start = round(ts * 1000)
                end = round((ts + float(event["dur"])) * 1000)
                event["dur"] = (end - start if end > start else 0) / 1000
                event["ts"] = start / 1000


@dataclass
class PythonParts:
    """A window's Python events as the merge takes them, in the file's order: ``before`` (to place:
    the training process's events, and the DataLoader workers' when not placed as read),
    ``workers`` (the workers' calls per thread, on torch's timeline already: ``placement`` placed
    them as they were read, ``workers.place_events``), ``after`` (to place: the gc pauses and the
    compile spans)."""

    before: list[dict[str, Any]]
    workers: dict[Thread, list[dict[str, Any]]] = field(default_factory=dict)
    after: list[dict[str, Any]] = field(default_factory=list)
    placement: TorchPlacement | None = None


def merge_trace(
    torch_trace: Mapping[str, Any],
    python_events: Iterable[dict[str, Any]],
    calibration: Calibration,
    vt_metadata: Mapping[str, Any],
    thread_names: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """One trace dict: torch's keys, ``vt_lightning`` metadata, then ``traceEvents`` last."""
    return merge_window(torch_trace, PythonParts(list(python_events)), calibration, vt_metadata, thread_names).as_dict()


def merge_window(
    torch_trace: Mapping[str, Any],
    python: PythonParts,
    calibration: Calibration,
    vt_metadata: Mapping[str, Any],
    thread_names: Mapping[int, str] | None = None,
    origin_us: int | None = None,
) -> WindowTrace:
    """Torch's trace and the window's Python events on one timeline, every thread nesting
    strictly: the typed trace every later stage reads. ``origin_us``: ``time_origin_us`` of
    torch's events, when the caller computed it already.

    One pass places, checks (the contract) and files each Python event, one each torch event;
    the workers' calls, placed as they were read, are taken as they are. Then the nesting passes
    (``nesting.py``): the boundaries repaired within the calibration's tolerance, the calls cut at
    the annotation ranges they cross and put on the nanosecond grid (a worker's thread that
    ``placement`` settled is taken as settled), the torch spans snapped, and what still crosses
    moved to a track of its own."""
    torch_events = list(torch_trace.get("traceEvents", []))
    if origin_us is None:
        origin_us = time_origin_us(torch_events)
    rebase_events(torch_events, origin_us)
    ran = ran_steps(vt_metadata.get("steps"))
    timed_parts: list[list[dict[str, Any]]] = []
    python_meta: list[dict[str, Any]] = []
    loose: list[dict[str, Any]] = []
    calls: dict[Thread, list[dict[str, Any]]] = {}
    python_fixed, python_dropped = 0, False
    elsewhere: set[Thread] = set()  # threads with calls the merge placed
    placement = python.placement
    for part in (python.before, None, python.after):
        if part is None:  # the workers' calls, placed and grouped as read
            part_timed = [event for thread_calls in python.workers.values() for event in thread_calls]
            part_calls = python.workers
            part_fixed, part_dropped = 0, placement is not None and placement.dropped
            if placement is not None and placement.unnamed:
                part_fixed, named_dropped = _name_calls(part_timed, ran)
                part_dropped = part_dropped or named_dropped
            if placement is not None and placement.not_x:  # snapped as place_python_events snaps what is not X
                snap_to_nanoseconds(event for event in part_timed if event.get("ph") != "X")
                loose += (event for event in part_timed if event.get("ph") != "X" and "ts" in event)
            if (placement is not None and placement.not_x) or part_dropped:  # the groups: X calls not marked
                part_calls = {
                    key: kept
                    for key, group in part_calls.items()
                    if (kept := [e for e in group if e.get("ph") == "X" and e["name"] is not _UNRUN])
                }
        else:
            part_timed, part_meta, part_calls, part_fixed, part_dropped, part_loose = place_python_events(
                part, calibration, origin_us, ran
            )
            python_meta += part_meta
            loose += part_loose
            elsewhere.update(part_calls)
        timed_parts.append(part_timed)
        for key, thread_calls in part_calls.items():
            known = calls.get(key)
            if known is None:  # taken, not copied: each copy of a worker's calls touches every one
                calls[key] = thread_calls
            else:
                known.extend(thread_calls)
        python_fixed += part_fixed
        python_dropped = python_dropped or part_dropped
    events = merge_metadata_events(torch_events, python_meta, thread_names)
    fixed, threads, dropped, memory, metadata = _settle(events, ran, snap=True)
    threads.ordered.update(python.workers.keys() - elsewhere - threads.python.keys())  # the filter's order
    for key, thread_calls in calls.items():
        if key in threads.python:
            threads.python[key].extend(thread_calls)
        else:
            threads.python[key] = thread_calls
    fixed += python_fixed
    if dropped or python_dropped:
        events[:] = [e for e in events if e["name"] is not _UNRUN]
        timed_parts = [[e for e in part if e["name"] is not _UNRUN] for part in timed_parts]
        loose = [e for e in loose if e["name"] is not _UNRUN]
    memory += (e for e in loose if e.get("ph") == "i" and e.get("name") == MEMORY_EVENT)  # the Python part's
    head = len(events)
    for part_timed in timed_parts:
        events.extend(part_timed)
    span = range(head, len(events))
    tolerance = calibration.uncertainty_us + STAMP_JITTER_US
    repaired, _ = repair_boundaries(events, tolerance, threads)
    settled = placement.settled if placement is not None else {}
    untangled = untangle_annotations(events, threads, snap=True, settled=settled)
    _snap_spans((threads.ops, threads.annotations, threads.other))
    moved, clamped = separate_crossing_ranges(events, threads, calls_nest=True)
    metadata += events[span.stop :]  # the range tracks' names
    header: dict[str, Any] = {k: v for k, v in torch_trace.items() if k != "traceEvents"}
    if origin_us:
        header["baseTimeNanoseconds"] = int(header.get("baseTimeNanoseconds", 0)) + origin_us * 1000
    if "distributedInfo" not in header and isinstance(vt_metadata.get("global_rank"), int):
        # torch writes it only under torch.distributed; HTA reads the rank from it and otherwise
        # warns and guesses rank 0 (wrong for every rank but one when ranks trace without DDP).
        header["distributedInfo"] = {
            "backend": None,
            "rank": vt_metadata["global_rank"],
            "world_size": vt_metadata.get("world_size", 1),
        }
    meta = dict(vt_metadata)
    meta["time_origin_us"] = origin_us
    meta["calibration"] = calibration.metadata()
    meta["python_events"] = sum(len(part) for part in timed_parts)
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
    header[TRACE_METADATA_KEY] = meta
    columns = {
        key: Calls(starts, starts + lengths, [call["name"] for call in threads.python[key]])
        for key, (starts, lengths, _) in settled.items()
        if key in threads.ordered and key not in threads.cut and len(threads.python.get(key) or ()) == len(starts)
    }
    return WindowTrace(header, events, threads, memory, metadata, span, loose, columns)


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
