"""What got slower or faster between two windows (or runs): pure functions on summary dicts.
Each side is its mean over windows; a name missing on one side is absent, below the threshold or
not in the top N (docs/summary.md, "The `vt-lightning` command"), and each row says which."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vt_lightning.analysis.schema import Summary
from vt_lightning.analysis.summary import function_key
from vt_lightning.analysis.verdict_report import verdict_changes


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass
class _Window:
    """One summary's view of a table: what it measured, and what a missing name means there."""

    values: dict[str, float]
    complete: bool  # a missing name is absent (0 ms)
    threshold_ms: float | None  # a missing name is below this (schema 2), else not in the top N
    top: int = 0


@dataclass
class Side:
    """One side of a diff, per table: per name, the mean over windows and why it may be unknown."""

    windows: int
    values: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _totals_window(totals: Any, top: int) -> _Window | None:
    if not isinstance(totals, Mapping) or not isinstance(totals.get("ms"), Mapping):
        return None
    values = {str(k): _number(v) for k, v in totals["ms"].items()}
    threshold = _number(totals.get("threshold_ms"))
    return _Window(values, complete=_number(totals.get("other_count")) == 0, threshold_ms=threshold, top=top)


def _python_window(summary: Summary) -> _Window:
    top = summary.get("top_python") or {}
    rankings = [top.get("by_self") or [], top.get("by_inclusive") or []]
    stored = _totals_window(top.get("totals"), max(len(r) for r in rankings))
    if stored is not None:
        return stored
    values: dict[str, float] = {}
    for ranking in rankings:
        for entry in ranking:
            values.setdefault(function_key(entry), _number(entry.get("self_ms")))
    return _Window(values, complete=False, threshold_ms=None, top=max(len(r) for r in rankings))


def _user_window(summary: Summary) -> _Window:
    """The user's own functions by inclusive time (the caller of ``time.sleep``, not it)."""
    user = [e for e in (summary.get("top_python") or {}).get("by_inclusive") or [] if e.get("origin") == "user"]
    values = {function_key(e): _number(e.get("inclusive_ms")) for e in user}
    return _Window(values, complete=False, threshold_ms=None, top=len(user))


def _op_window(summary: Summary) -> _Window:
    ops = summary.get("top_ops") or {}
    by_cpu = ops.get("by_cpu") or []
    stored = _totals_window(ops.get("totals"), len(by_cpu))
    if stored is not None:
        return stored
    values = {str(op.get("name")): _number(op.get("self_cpu_ms")) for op in by_cpu}
    return _Window(values, complete=False, threshold_ms=None, top=len(by_cpu))


def _side(windows: Sequence[_Window], names: Iterable[str]) -> Side:
    """The mean per name over ``windows``; a name some window cannot vouch for gets a note."""
    n = max(len(windows), 1)
    side = Side(windows=len(windows))
    for name in names:
        total = 0.0
        below: list[float] = []
        unlisted: list[int] = []
        for window in windows:
            if name in window.values:
                total += window.values[name]
            elif window.complete:
                continue
            elif window.threshold_ms is not None:
                below.append(window.threshold_ms)
            else:
                unlisted.append(window.top)
        side.values[name] = total / n
        share = "" if len(windows) == 1 else f" in {len(below) or len(unlisted)} of {len(windows)} windows"
        if unlisted:
            side.notes[name] = f"not in top {max(unlisted)}{share}"
        elif below:
            side.notes[name] = f"below {max(below):g} ms threshold{share}"
    return side


def profile(summaries: Sequence[Summary]) -> dict[str, Any]:
    """The mean over windows of step time and breakdown parts, and each window's tables."""
    means = [(s.get("step_ms") or {}).get("mean") for s in summaries]
    steps = [mean for mean in means if isinstance(mean, (int, float))]
    parts: dict[str, list[float]] = defaultdict(list)
    for summary in summaries:
        for part, ms in (summary.get("breakdown_ms") or {}).items():
            parts[part].append(_number(ms))
    n = max(len(summaries), 1)
    return {
        "windows": len(summaries),
        "step_ms": _mean(steps),
        # A part a window does not have (validation, in a window without it) took 0 ms there.
        "breakdown_ms": {part: sum(v) / n for part, v in parts.items()},
        "python": [_python_window(s) for s in summaries],
        "user_python": [_user_window(s) for s in summaries],
        "ops": [_op_window(s) for s in summaries],
    }


def _percent(a: float, b: float) -> float:
    """The change in %, to 0.1 %; -100 % only when B is truly 0 (a trace of it shows -99.9 %)."""
    percent = round(100.0 * (b - a) / a, 1)
    return max(percent, -99.9) if b > 0 else percent


def _change(name: str, a: float, b: float, a_note: str | None = None, b_note: str | None = None) -> dict[str, Any]:
    delta = b - a
    exact = a_note is None and b_note is None
    return {
        "name": name,
        "a_ms": round(a, 3),
        "b_ms": round(b, 3),
        "delta_ms": round(delta, 3),
        "delta_percent": _percent(a, b) if a and exact else None,
        "a_note": a_note,
        "b_note": b_note,
    }


def _changes(a: Sequence[_Window], b: Sequence[_Window], limit: int | None) -> list[dict[str, Any]]:
    names = sorted({name for window in (*a, *b) for name in window.values})
    side_a, side_b = _side(a, names), _side(b, names)
    rows = [_change(k, side_a.values[k], side_b.values[k], side_a.notes.get(k), side_b.notes.get(k)) for k in names]
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
        "user_python": _changes(pa["user_python"], pb["user_python"], limit),  # inclusive, user code only
        "python": _changes(pa["python"], pb["python"], limit),
        "ops": _changes(pa["ops"], pb["ops"], limit),
        "verdicts": verdict_changes(a, b),  # kinds that appeared or went away (analysis/verdicts/)
    }


DIFF_COLUMNS = [("name", False), ("A", True), ("B", True), ("change", True), ("%", True)]


def _side_cell(ms: float, note: str | None) -> str:
    if note is None:
        return f"{ms:.2f}"
    if note.startswith("below") and ms == 0.0:
        return "<" + note.split()[1]  # "below 0.001 ms threshold" -> "<0.001"
    return f"≥{ms:.2f}" if ms else "?"


def change_text(row: Mapping[str, Any]) -> str:
    """The "%" cell: the change in %, or why there is none ("new" and -100 % only when true)."""
    a_note, b_note = row.get("a_note"), row.get("b_note")
    if a_note or b_note:
        return "; ".join(f"{side}: {note}" for side, note in (("A", a_note), ("B", b_note)) if note)
    percent = row.get("delta_percent")
    if percent is None:
        return "new" if row.get("b_ms") else "–"
    return f"{percent:+.1f}%"


def diff_table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[list[str]], dict[tuple[int, int], str]]:
    """Cells and styles of one diff table (columns ``DIFF_COLUMNS``), for ``print_table``."""
    cells = [
        [
            str(r["name"]),
            _side_cell(r["a_ms"], r.get("a_note")),
            _side_cell(r["b_ms"], r.get("b_note")),
            f"{r['delta_ms']:+.2f}",
            change_text(r),
        ]
        for r in rows
    ]
    styles = {(i, 3): "red" if r["delta_ms"] > 0 else "green" for i, r in enumerate(rows) if r["delta_ms"]}
    return cells, styles
