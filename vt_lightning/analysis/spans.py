"""Time spans of trace events, in µs: the small arithmetic every summary part shares. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Span = tuple[float, float]


def ms(us: float) -> float:
    """µs -> ms, rounded to the µs the summary keeps."""
    return round(us / 1000.0, 3)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), no numpy needed."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def union(spans: Iterable[Span]) -> list[Span]:
    """Overlapping spans merged, sorted."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def clip(spans: Iterable[Span], lo: float, hi: float) -> list[Span]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]


def x_events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The complete (``ph == "X"``) events of a trace."""
    return [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X" and "ts" in e]


def span_of(event: Mapping[str, Any]) -> Span:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0.0) or 0.0)
