"""What got slower or faster between two windows (or runs): pure functions on summary dicts, one answer
for ``vt-lightning diff`` and the TensorBoard tab. Each side is its mean over windows; how missing
names, the threshold and the steps' spread are read: docs/summary.md, "diff"."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vt_lightning.analysis.schema import Summary
from vt_lightning.analysis.summary import function_key, name_hash
from vt_lightning.analysis.verdict_report import verdict_changes


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


@dataclass
class _Window:
    """One summary's table: what it measured, and what a missing name means there."""

    values: dict[str, float]
    threshold_ms: float
    below: frozenset[str] | None  # hashes under the threshold; None: unknown, a missing name counts as under
    ran: Mapping[str, float] | None = None  # user_python: each function's self ms (a lower bound if unlisted)

    def state(self, name: str) -> str:
        if name in self.values:
            return "measured"
        under = self.below is None or name_hash(name) in self.below
        if self.ran is not None and (name in self.ran or under):
            return "not listed"  # it ran: its inclusive time is at least its self time
        if under:
            return "under"
        return "absent"


def _totals_window(totals: Any, listed: Mapping[str, float]) -> _Window:
    """A ``totals`` block; without one (an older summary) the top list, whose last value bounds the rest."""
    if isinstance(totals, Mapping) and isinstance(totals.get("ms"), Mapping):
        below = totals.get("below")
        hashes = frozenset(str(h) for h in below) if isinstance(below, list) else None
        if _number(totals.get("other_count")) == 0:
            hashes = frozenset()
        values = {str(k): _number(v) for k, v in totals["ms"].items()}
        return _Window(values, _number(totals.get("threshold_ms")), hashes)
    return _Window(dict(listed), min(listed.values(), default=0.0), None)


def _python_window(summary: Summary) -> _Window:
    top = summary.get("top_python") or {}
    listed = {function_key(e): _number(e.get("self_ms")) for e in top.get("by_self") or []}
    return _totals_window(top.get("totals"), listed)


def _user_window(summary: Summary) -> _Window:
    """The user's own functions by inclusive time (the caller of ``time.sleep``, not it)."""
    user = [e for e in (summary.get("top_python") or {}).get("by_inclusive") or [] if e.get("origin") == "user"]
    python = _python_window(summary)
    values = {function_key(e): _number(e.get("inclusive_ms")) for e in user}
    return _Window(values, python.threshold_ms, python.below, ran=python.values)


def _op_window(summary: Summary) -> _Window:
    ops = summary.get("top_ops") or {}
    listed = {str(op.get("name")): _number(op.get("self_cpu_ms")) for op in ops.get("by_cpu") or []}
    return _totals_window(ops.get("totals"), listed)


def step_spread(summaries: Sequence[Summary]) -> dict[str, Any]:
    """The counted steps' times pooled over windows: how much the steps themselves varied."""
    values = []
    for summary in summaries:
        steps = summary.get("steps") or {}
        ms = steps.get("ms") or {}
        values += [_number(ms[str(n)]) for n in steps.get("counted") or [] if str(n) in ms]
    if not values:
        return {"steps": 0, "min_ms": None, "max_ms": None, "median_ms": None}
    return {
        "steps": len(values),
        "min_ms": round(min(values), 3),
        "max_ms": round(max(values), 3),
        "median_ms": round(statistics.median(values), 3),
    }


def _percent(a: float, b: float) -> float | None:
    """The change in %, to 0.1 %; None when A is 0 (nothing to compare with)."""
    return round(100.0 * (b - a) / a, 1) if a else None


def _row(
    name: str, a: float | None, b: float | None, states: tuple[str, str], noise: float, d: float
) -> dict[str, Any]:
    delta = (b or 0.0) - (a or 0.0)

    def text(value: float | None, state: str) -> str:
        if state == "absent":
            return "–"
        if state == "under":
            return f"< {d:g}"
        if state == "not listed":
            return f"≥ {value:.3f}" if value else "ran, not listed"
        return f"{value:.3f}"

    state = {
        ("absent", "measured"): "only in B",
        ("measured", "absent"): "only in A",
        ("under", "measured"): "under threshold in A",
        ("measured", "under"): "under threshold in B",
        ("not listed", "measured"): "lower bound in A",
        ("measured", "not listed"): "lower bound in B",
    }.get(states, "both")
    return {
        "name": name,
        "a_ms": None if a is None else round(a, 3),
        "b_ms": None if b is None else round(b, 3),
        "state": state,
        "a_text": text(a, states[0]),
        "b_text": text(b, states[1]),
        "delta_ms": round(delta, 3),
        "delta_percent": _percent(a, b or 0.0) if a is not None and state == "both" else None,
        "within_noise": abs(delta) <= noise,
    }


def _side(windows: Sequence[_Window], name: str) -> tuple[float | None, str]:
    """The mean over windows (a window without the name counts 0) and the side's state."""
    states = [w.state(name) for w in windows]
    if "measured" in states:
        n = max(len(windows), 1)
        return sum(w.values.get(name, 0.0) for w in windows) / n, "measured"
    if "not listed" in states:
        return max(_number((w.ran or {}).get(name)) for w in windows), "not listed"
    return None, "under" if "under" in states else "absent"


def _changes(a: Sequence[_Window], b: Sequence[_Window], d: float, noise: float, limit: int | None) -> list[Any]:
    rows = []
    for name in sorted({name for window in (*a, *b) for name in window.values}):
        (va, sa), (vb, sb) = _side(a, name), _side(b, name)
        if (va or 0.0) < d and (vb or 0.0) < d:
            continue  # under the one threshold on both sides: not compared
        row = _row(name, va, vb, (sa, sb), noise, d)
        if row["delta_ms"] != 0.0 or row["state"] != "both":
            rows.append(row)
    rows.sort(key=lambda r: abs(r["delta_ms"]), reverse=True)
    return rows[:limit] if limit else rows


def _mean_step(summaries: Sequence[Summary]) -> float:
    means = [_number((s.get("step_ms") or {}).get("mean")) for s in summaries]
    return sum(means) / len(means) if means else 0.0


def _part_means(summaries: Sequence[Summary]) -> dict[str, float]:
    """Each breakdown part's mean over windows: a part a window does not have took 0 ms there."""
    by_part: dict[str, float] = defaultdict(float)
    for summary in summaries:
        for part, ms in (summary.get("breakdown_ms") or {}).items():
            by_part[part] += _number(ms) / len(summaries)
    return by_part


def diff(a: Sequence[Summary], b: Sequence[Summary], limit: int = 10) -> dict[str, Any]:
    """Changes from A to B (positive: B is slower), largest first, with the rule and the noise."""
    tables = {
        "user_python": ([_user_window(s) for s in a], [_user_window(s) for s in b]),
        "python": ([_python_window(s) for s in a], [_python_window(s) for s in b]),
        "ops": ([_op_window(s) for s in a], [_op_window(s) for s in b]),
    }
    d = max((w.threshold_ms for sides in tables.values() for side in sides for w in side), default=0.0)
    spread_a, spread_b = step_spread(a), step_spread(b)
    noise = max((_number(s["max_ms"]) - _number(s["min_ms"]) for s in (spread_a, spread_b)), default=0.0)
    means = [_part_means(a), _part_means(b)]
    both = ("measured", "measured")
    return {
        "a_windows": len(a),
        "b_windows": len(b),
        "threshold_ms": d,
        "rule": f"functions and ops under {d:g} ms/step on both sides are not compared",
        "noise": {
            "a": spread_a,
            "b": spread_b,
            "ms": round(noise, 3),
            "text": f"the steps themselves vary by up to {noise:.1f} ms; a change no larger is within noise",
        },
        "step": _row("step", _mean_step(a), _mean_step(b), both, noise, d),
        "breakdown": [
            _row(p, means[0].get(p, 0.0), means[1].get(p, 0.0), both, noise, d)
            for p in dict.fromkeys([*means[0], *means[1]])
        ],
        **{key: _changes(*sides, d, noise, limit) for key, sides in tables.items()},
        "verdicts": verdict_changes(a, b),  # kinds that appeared or went away (analysis/verdicts/)
    }


DIFF_COLUMNS = [("name", False), ("A", True), ("B", True), ("change", True), ("%", True), ("", False)]


def diff_table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[list[str]], dict[tuple[int, int], str]]:
    """Cells and styles of one diff table (columns ``DIFF_COLUMNS``), for ``print_table``."""
    cells = []
    for r in rows:
        percent = r.get("delta_percent")
        note = "within noise" if r["within_noise"] else ""
        if r["state"] != "both":
            note = f"{r['state']}; {note}" if note else r["state"]
        cells.append(
            [
                str(r["name"]),
                r["a_text"],
                r["b_text"],
                f"{r['delta_ms']:+.3f}",
                "–" if percent is None else f"{percent:+.1f}%",
                note,
            ]
        )
    styles = {
        (i, 3): "red" if r["delta_ms"] > 0 else "green"
        for i, r in enumerate(rows)
        if r["delta_ms"] and not r["within_noise"]
    }
    return cells, styles
