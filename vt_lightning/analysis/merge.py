"""Merge one window's torch trace and VizTracer events into one trace the TensorBoard plugin loads.

Pure. The contract (torch-tb-profiler 0.4.3): ``traceEvents`` last, a string ``cat`` on every
``X`` event, torch's metadata kept, ``distributedInfo`` spaced for HTA's ``"rank":\\s+(\\d+)``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from vt_lightning.analysis.clock import Calibration
from vt_lightning.analysis.nesting import (
    repair_boundaries,
    separate_crossing_ranges,
    snap_spans,
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
_TS, _NAME, _PH = itemgetter("ts"), itemgetter("name"), itemgetter("ph")
# Beyond the calibration's uncertainty, each tracer stamps an event a little off the instant it
# describes: Python calls crossed the ops they issued by up to ~0.1 µs; twice that is allowed.
STAMP_JITTER_US = 0.2


# At torch's timestamps (~4.5e12 µs) a double resolves only ~0.001 µs: the trace moves to an origin
# of whole seconds and every boundary snaps to whole nanoseconds, as Perfetto reads them.
ORIGIN_GRANULARITY_US = 1_000_000


def time_origin_us(events: Iterable[dict[str, Any]]) -> int:
    """Whole seconds (in µs) at or below the earliest timestamp: the merged trace's new zero."""
    first = min((float(e["ts"]) for e in events if "ts" in e), default=0.0)
    return int(first // ORIGIN_GRANULARITY_US) * ORIGIN_GRANULARITY_US


def rebase_events(events: Iterable[dict[str, Any]], origin_us: int) -> None:
    """``ts`` less ``origin_us``: the integer part exactly, then the fraction, so no digit is lost."""
    if not origin_us:
        return
    for event in events:
        if "ts" in event:
            ts = float(event["ts"])
            whole = math.floor(ts)
            event["ts"] = (whole - origin_us) + (ts - whole)


def snap_to_nanoseconds(events: Iterable[dict[str, Any]]) -> None:
    """Every event on the nanosecond grid (``nesting.snap_spans``; any other timed event's start)."""
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
    """Torch's metadata plus one ``thread_name`` per thread (``thread_names``: the names at window end)."""
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


@dataclass(frozen=True)
class TorchPlacement:
    """The calibration's map of VizTracer's µs onto torch's, less the origin: offset plus drift."""

    t0: float
    span: float
    offset: float
    slope: float

    def at(self, us: float) -> float:
        since = us - self.t0
        drifted = (
            self.slope * (0.0 if since < 0.0 else self.span if since > self.span else since) if self.slope else 0.0
        )
        return us + self.offset + drifted

    def calls(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Calls' starts and lengths, each end mapped too (nesting kept), as ``at`` does it."""
        placed = starts + self.offset + self._drift(starts)
        ends = starts + lengths
        ends = ends + self.offset + self._drift(ends)
        return placed, np.where(ends > placed, ends - placed, 0.0)

    def _drift(self, at: np.ndarray) -> Any:
        if not self.slope:
            return 0.0
        since = at - self.t0
        return self.slope * np.where(since < 0.0, 0.0, np.where(since > self.span, self.span, since))


def torch_placement(calibration: Calibration, origin_us: int) -> TorchPlacement:
    t0, t1 = calibration.start.python_us, calibration.end.python_us
    offset, drift = calibration.offset_us - origin_us, calibration.drift_us
    slope = drift / (t1 - t0) if t1 > t0 else 0.0
    return TorchPlacement(t0=t0, span=t1 - t0, offset=offset, slope=slope)


def place_python_events(events: list[dict[str, Any]], placement: TorchPlacement) -> None:
    """VizTracer's events onto torch's timeline, in place (calls as arrays, the rest on the grid)."""
    calls = [e for e in events if e.get("ph") == "X" and "ts" in e]
    if calls:
        count = len(calls)
        try:  # VizTracer's: numbers, read at C speed
            starts = np.fromiter(map(_TS, calls), dtype=float, count=count)
            lengths = np.fromiter((e.get("dur", 0.0) for e in calls), dtype=float, count=count)
        except (TypeError, ValueError):  # what float() reads, or its error
            starts = np.array([float(e["ts"]) for e in calls], dtype=float)
            lengths = np.array([float(e.get("dur", 0.0)) for e in calls], dtype=float)
        placed, length = placement.calls(starts, lengths)
        for event, start, dur in zip(calls, placed.tolist(), length.tolist()):
            event["ts"] = start
            event["dur"] = dur
            event["cat"] = PYTHON_CATEGORY
    for event in events:
        ph = event.get("ph")
        if ph == "X":
            if "ts" not in event:
                event["cat"] = PYTHON_CATEGORY
                event.setdefault("dur", 0.0)
        elif ph != "M":
            if "ts" in event:
                event["ts"] = placement.at(float(event["ts"]))
            if not isinstance(event.get("cat"), str):
                event["cat"] = PYTHON_CATEGORY
            if "ts" in event:
                event["ts"] = round(event["ts"] * 1000) / 1000


def _settle(
    events: list[dict[str, Any]],
    ran: set[str] | None,
    threads: ThreadSpans,
    memory: list[dict[str, Any]],
    metadata: list[dict[str, Any]],
    loose: list[dict[str, Any]] | None = None,
) -> tuple[int, bool]:
    """One pass: the trace contract (a name; for X a string cat, ts and dur), the ranges of steps
    that never ran marked, the rest filed. Returns (events fixed, whether one was marked)."""
    add = threads.add
    dropped = False
    fixed = 0
    for event in events:
        name = event.get("name")
        if not isinstance(name, str):
            name = event["name"] = str(event.get("name", ""))
            fixed += 1
        unrun = _unrun(name, ran)
        if unrun:
            event["name"] = _UNRUN  # marked: the list is rebuilt without them by the caller
            dropped = True
        ph = event.get("ph")
        if ph != "X":
            if "ts" in event:
                if loose is None:
                    event["ts"] = round(float(event["ts"]) * 1000) / 1000
                else:
                    loose.append(event)
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
    return fixed, dropped


def _unrun(name: str, ran: set[str] | None) -> bool:
    """Whether ``name`` is the range of a step opened for a batch that never ran."""
    return ran is not None and name.startswith(STEP_PREFIX) and name not in ran


def _settle_calls(
    python: PythonParts, ran: set[str] | None, threads: ThreadSpans, loose: list[dict[str, Any]]
) -> tuple[int, bool]:
    """``_settle`` for each thread's grouped calls, read by their distinct names."""
    fixed = 0
    dropped = False
    for key, group in python.calls.items():
        known_names = python.names.get(key)
        try:
            names = set(map(_NAME, group)) if known_names is None else known_names
            kinds = set(map(_PH, group)) if known_names is None else {"X"}
        except (KeyError, TypeError):  # a call without a name, or one that cannot be hashed
            names, kinds = {None}, {None}
        marked = False
        if any(name.__class__ is not str or _unrun(name, ran) for name in names):
            for event in group:
                name = event.get("name")
                if not isinstance(name, str):
                    name = event["name"] = str(event.get("name", ""))
                    fixed += 1
                if _unrun(name, ran):
                    event["name"] = _UNRUN
                    marked = dropped = True
        if kinds != {"X"}:  # a "B" among the calls: no span of the nesting passes, on the grid
            for event in group:
                if event.get("ph") != "X":
                    event["ts"] = round(float(event["ts"]) * 1000) / 1000
                    loose.append(event)
        if kinds != {"X"} or marked:
            group = [event for event in group if event.get("ph") == "X" and event["name"] is not _UNRUN]
        if group:
            threads.python[key].extend(group)
    return fixed, dropped


@dataclass
class PythonParts:
    """A window's Python events on torch's timeline: ``before`` (one by one), ``calls`` (grouped by the
    filter), ``after`` (gc pauses, compile spans); ``settled`` threads are on the grid already."""

    before: list[dict[str, Any]]
    calls: dict[Thread, list[dict[str, Any]]] = field(default_factory=dict)
    after: list[dict[str, Any]] = field(default_factory=list)
    settled: dict[Thread, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    names: dict[Thread, set[Any]] = field(default_factory=dict)


def merge_trace(
    torch_trace: Mapping[str, Any],
    python_events: Iterable[dict[str, Any]],
    calibration: Calibration,
    vt_metadata: Mapping[str, Any],
    thread_names: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """One trace dict of torch's trace and the Python events (placed here)."""
    origin_us = time_origin_us(torch_trace.get("traceEvents", []))
    events = list(python_events)
    place_python_events(events, torch_placement(calibration, origin_us))
    return merge_window(torch_trace, PythonParts(events), calibration, vt_metadata, thread_names, origin_us).as_dict()


def merge_window(
    torch_trace: Mapping[str, Any],
    python: PythonParts,
    calibration: Calibration,
    vt_metadata: Mapping[str, Any],
    thread_names: Mapping[int, str] | None = None,
    origin_us: int | None = None,
) -> WindowTrace:
    """Torch's trace and the placed Python events as one typed trace, every thread nesting strictly."""
    torch_events = list(torch_trace.get("traceEvents", []))
    if origin_us is None:
        origin_us = time_origin_us(torch_events)
    rebase_events(torch_events, origin_us)
    steps = vt_metadata.get("steps")  # the steps that ran (None: not known)
    ran = {f"{STEP_PREFIX}{step}" for step in steps} if steps is not None else None
    before, after = ([e for e in part if e.get("ph") != "M"] for part in (python.before, python.after))
    python_meta = [e for part in (python.before, python.after) for e in part if e.get("ph") == "M"]
    events = merge_metadata_events(torch_events, python_meta, thread_names)
    threads = ThreadSpans()
    memory: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    loose: list[dict[str, Any]] = []  # the Python part's events with a time that are no complete call
    fixed, dropped = 0, False
    for part_fixed, part_dropped in (
        _settle(events, ran, threads, memory, metadata),
        _settle(before, ran, threads, memory, metadata, loose),
        _settle_calls(python, ran, threads, loose),
        _settle(after, ran, threads, memory, metadata, loose),
    ):
        fixed += part_fixed
        dropped = dropped or part_dropped
    threads.settled.update(
        (key, found) for key, found in python.settled.items() if len(threads.python.get(key) or ()) == len(found[0])
    )
    timed = [*before, *(event for group in python.calls.values() for event in group), *after]
    if dropped:
        events[:] = [e for e in events if e["name"] is not _UNRUN]
        timed = [e for e in timed if e["name"] is not _UNRUN]
        loose = [e for e in loose if e["name"] is not _UNRUN]
    head = len(events)
    events.extend(timed)
    span = range(head, len(events))
    tolerance = calibration.uncertainty_us + STAMP_JITTER_US
    repaired, _ = repair_boundaries(events, tolerance, threads)
    untangled = untangle_annotations(events, threads, snap=True)
    for kind in (threads.ops, threads.annotations, threads.other):
        for thread_events in kind.values():
            snap_spans(thread_events)
    moved, clamped = separate_crossing_ranges(events, threads, calls_nest=True)
    metadata += events[span.stop :]  # the range tracks' names
    header: dict[str, Any] = {k: v for k, v in torch_trace.items() if k != "traceEvents"}
    if origin_us:
        header["baseTimeNanoseconds"] = int(header.get("baseTimeNanoseconds", 0)) + origin_us * 1000
    if "distributedInfo" not in header and isinstance(vt_metadata.get("global_rank"), int):
        # torch writes it only under torch.distributed; without it HTA guesses rank 0
        header["distributedInfo"] = {
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
    header[TRACE_METADATA_KEY] = meta
    columns = {
        key: Calls(starts, starts + lengths, [call["name"] for call in threads.python[key]])
        for key, (starts, lengths) in threads.settled.items()
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
