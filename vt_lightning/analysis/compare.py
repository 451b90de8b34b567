"""What got slower or faster between two windows (or two runs): pure functions on summary dicts.

A run is several windows: each side is first reduced to one summary-like profile (the mean over its
windows), then compared part by part, function by function and op by op. Only what a summary keeps
(its top lists) can be compared; an entry missing on one side counts as 0 there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from vt_lightning.analysis.schema import Summary


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def profile(summaries: Sequence[Summary]) -> dict[str, Any]:
    """The mean over windows of step time, breakdown parts, Python self time and op self CPU time."""
    means = [(s.get("step_ms") or {}).get("mean") for s in summaries]
    steps = [mean for mean in means if mean is not None]
    parts: dict[str, list[float]] = defaultdict(list)
    functions: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    for summary in summaries:
        for part, ms in (summary.get("breakdown_ms") or {}).items():
            parts[part].append(ms or 0.0)
        seen: set[str] = set()
        top = summary.get("top_python") or {}
        for ranking in (top.get("by_self") or [], top.get("by_inclusive") or []):
            for entry in ranking:
                key = _function_key(entry)
                if key not in seen:
                    seen.add(key)
                    functions[key] += entry.get("self_ms") or 0.0
        for op in (summary.get("top_ops") or {}).get("by_cpu") or []:
            ops[op["name"]] += op.get("self_cpu_ms") or 0.0
    n = max(len(summaries), 1)
    return {
        "windows": len(summaries),
        "step_ms": _mean(steps),
        "breakdown_ms": {part: _mean(v) for part, v in parts.items()},
        "python_self_ms": {k: v / n for k, v in functions.items()},
        "op_self_cpu_ms": {k: v / n for k, v in ops.items()},
    }


def _function_key(entry: Mapping[str, Any]) -> str:
    if entry.get("file"):
        return f"{entry['function']} ({entry['file']}:{entry.get('line')})"
    return str(entry.get("function"))


def _change(name: str, a: float, b: float) -> dict[str, Any]:
    delta = b - a
    return {
        "name": name,
        "a_ms": round(a, 3),
        "b_ms": round(b, 3),
        "delta_ms": round(delta, 3),
        "delta_percent": round(100.0 * delta / a, 1) if a else None,
    }


def _changes(a: Mapping[str, float], b: Mapping[str, float], limit: int | None) -> list[dict[str, Any]]:
    rows = [_change(k, a.get(k, 0.0), b.get(k, 0.0)) for k in sorted(set(a) | set(b))]
    rows = [r for r in rows if r["delta_ms"] != 0.0]
    rows.sort(key=lambda r: abs(r["delta_ms"]), reverse=True)
    return rows[:limit] if limit else rows


def diff(a: Sequence[Summary], b: Sequence[Summary], limit: int = 10) -> dict[str, Any]:
    """Changes from A to B (positive: B is slower), largest first."""
    pa, pb = profile(a), profile(b)
    parts = list(dict.fromkeys([*pa["breakdown_ms"], *pb["breakdown_ms"]]))
    return {
        "a_windows": pa["windows"],
        "b_windows": pb["windows"],
        "step": _change("step", pa["step_ms"], pb["step_ms"]),
        "breakdown": [_change(p, pa["breakdown_ms"].get(p, 0.0), pb["breakdown_ms"].get(p, 0.0)) for p in parts],
        "python": _changes(pa["python_self_ms"], pb["python_self_ms"], limit),
        "ops": _changes(pa["op_self_cpu_ms"], pb["op_self_cpu_ms"], limit),
    }
