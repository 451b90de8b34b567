"""Time spans of trace events, in µs: the small arithmetic every summary part shares. Pure."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

Span = tuple[float, float]
Number = TypeVar("Number", int, float)  # µs, or a memory address


def ms(us: float) -> float:
    """µs -> ms, rounded to the µs the summary keeps."""
    return round(us / 1000.0, 3)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def union(spans: Iterable[tuple[Number, Number]]) -> list[tuple[Number, Number]]:
    """Overlapping (or touching) spans merged, sorted; empty ones dropped."""
    merged: list[list[Number]] = []
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


def span_of(event: Mapping[str, Any]) -> Span:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0.0) or 0.0)


def covered(span: Span, sorted_spans: Sequence[Span], starts: Sequence[float]) -> float:
    """µs of ``span`` covered by the sorted, disjoint ``sorted_spans`` (``starts``: their starts)."""
    lo, hi = span
    total = 0.0
    i = max(bisect_right(starts, lo) - 1, 0)
    while i < len(sorted_spans) and sorted_spans[i][0] < hi:
        s, e = sorted_spans[i]
        total += max(0.0, min(e, hi) - max(s, lo))
        i += 1
    return total


def difference(spans: Sequence[Span], minus: Sequence[Span]) -> list[Span]:
    """The parts of the sorted, disjoint ``spans`` outside the sorted, disjoint ``minus``."""
    out: list[Span] = []
    for lo, hi in spans:
        cursor = lo
        for s, e in minus:
            if e <= cursor or s >= hi:
                continue
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < hi:
            out.append((cursor, hi))
    return out


def overlap_of_unions(spans: Iterable[Span], regions: Iterable[Span]) -> float:
    """µs of the union of ``spans`` that lies inside the union of ``regions``."""
    a, b = union(spans), union(regions)
    starts = [s for s, _ in b]
    return sum(covered(span, b, starts) for span in a)


def launches_by_correlation(events: Iterable[Mapping[str, Any]], categories: Iterable[str]) -> dict[Any, Any]:
    """``{correlation: runtime event}``: which CUDA runtime call launched each kernel."""
    wanted = frozenset(categories)
    out = {}
    for e in events:
        if e.get("cat") in wanted:
            correlation = (e.get("args") or {}).get("correlation")
            if correlation is not None:
                out[correlation] = e
    return out
