"""Nesting check shared by the issue-12 tests."""

from __future__ import annotations


def real_crossings(trace, slack_us=0.002):
    """Overlaps without nesting by more than ``slack_us``. Timestamps near 4.5e12 µs (a machine up for
    weeks) sit at the edge of a double's precision, so ts + dur of a range and of a call cut at its edge
    can differ by 1 ns after rounding: that is merge.py's rounding (the lead's), not filtering."""
    by_thread = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    bad = []
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in events:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + slack_us:
                stack.pop()
            if stack and stack[-1]["ts"] + stack[-1]["dur"] + slack_us < e["ts"] + e["dur"]:
                bad.append((stack[-1]["name"], e["name"]))
                continue
            stack.append(e)
    return bad
