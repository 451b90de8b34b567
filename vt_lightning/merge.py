"""Merge one window's torch trace and VizTracer events into one trace the TensorBoard plugin loads.

Pure functions: dicts in, dict or bytes out. The contract (torch-tb-profiler 0.4.3, frozen upstream):
``traceEvents`` is the last top-level key, every ``X`` event has a string ``cat``, torch's metadata
(``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``...) is kept,
and ``distributedInfo`` is written with a space after each colon so HTA's ``"rank":\\s+(\\d+)`` finds
the rank.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .clock import Calibration

PYTHON_CATEGORY = "FEE"  # VizTracer's own; the plugin does not analyse it, so Python calls show in the Trace view only
FALLBACK_CATEGORY = "unknown"
_SPACED_KEYS = ("distributedInfo",)


def shift_python_events(
    events: Iterable[dict[str, Any]], calibration: Calibration
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Place VizTracer events on torch's timeline. Returns (timed events, metadata events)."""
    timed: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    to_torch = calibration.python_to_torch_us
    for event in events:
        ph = event.get("ph")
        if ph == "M":
            meta.append(event)
            continue
        if "ts" in event:
            event["ts"] = round(to_torch(float(event["ts"])), 3)
        if ph == "X":
            event["cat"] = PYTHON_CATEGORY
            event["dur"] = round(float(event.get("dur", 0.0)), 3)
        elif not isinstance(event.get("cat"), str):
            event["cat"] = PYTHON_CATEGORY
        timed.append(event)
    return timed, meta


def merge_metadata_events(
    torch_events: list[dict[str, Any]], python_meta: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Torch's metadata plus VizTracer's real thread names, one ``thread_name`` per (pid, tid)."""
    python_threads = {
        (e.get("pid"), e.get("tid")): e for e in python_meta if e.get("name") == "thread_name"
    }
    out = [
        e
        for e in torch_events
        if not (
            e.get("ph") == "M"
            and e.get("name") == "thread_name"
            and (e.get("pid"), e.get("tid")) in python_threads
        )
    ]
    out.extend(python_threads.values())
    torch_processes = {e.get("pid") for e in torch_events if e.get("name") == "process_name"}
    out.extend(
        e for e in python_meta if e.get("name") == "process_name" and e.get("pid") not in torch_processes
    )
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


def merge_trace(
    torch_trace: Mapping[str, Any],
    python_events: Iterable[dict[str, Any]],
    calibration: Calibration,
    vt_metadata: Mapping[str, Any],
    extra_top_level: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One trace dict: torch's keys, ``vt_lightning`` metadata, then ``traceEvents`` last."""
    torch_events = list(torch_trace.get("traceEvents", []))
    timed, python_meta = shift_python_events(python_events, calibration)
    events = merge_metadata_events(torch_events, python_meta)
    events.extend(timed)
    fixed = ensure_contract(events)

    merged: dict[str, Any] = {k: v for k, v in torch_trace.items() if k != "traceEvents"}
    if extra_top_level:
        merged.update(extra_top_level)
    meta = dict(vt_metadata)
    meta["calibration"] = calibration.metadata()
    meta["python_events"] = len(timed)
    meta["torch_events"] = len(torch_events)
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
