"""The input family: ``input_bound``, the step waits for its batch. Pure.

``where`` names the user's dataset or collate code and, under each, its heaviest user callee.
Tracing slows the fetch, so the steps no tracer recorded must wait too (``UNTRACED_WAIT_KEY``): in
process, no window decides without them."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from vt_lightning.analysis.schema import VerdictWhere
from vt_lightning.analysis.verdicts.base import TOP_WHERE, Finding, Rule, where_of
from vt_lightning.analysis.verdicts.window import WindowView
from vt_lightning.constants import UNTRACED_WAIT_KEY

INPUT_BOUND_SHARE = 0.25  # fetching the next batch (breakdown ``data_wait``), of the step
INPUT_BOUND_MIN_MS = 1.0  # per step
CALLEE_MIN_SHARE = 0.10  # a callee is named when it took at least this share of its entry's time

Time = dict[str, float]
_EVERYTHING = [(-math.inf, math.inf)]  # workers fetch ahead: a window's batches were fetched before its steps


def _entries_and_callees(w: WindowView, thread: Any, spans: list[tuple[float, float]]) -> tuple[Time, dict[str, Time]]:
    """µs per entry call inside ``spans``, and per entry, µs per innermost user callee under it."""
    if spans is _EVERYTHING:  # the whole thread (a worker's): the timeline's sums, without its segments
        return w.data.walk(thread)
    entries: Time = defaultdict(float)
    callees: dict[str, Time] = defaultdict(lambda: defaultdict(float))
    for (lo, hi), (_, _, _, user, entry, _) in w.timeline(thread).within(spans):
        if entry:
            entries[entry] += hi - lo
            if user and user != entry:
                callees[entry][user] += hi - lo
    return entries, callees


def _places(entries: Time, callees: dict[str, Time], steps: int) -> list[VerdictWhere]:
    """The top entries, each followed by its heaviest user callee (with its share of the entry)."""
    out: list[VerdictWhere] = []
    for name, us in sorted(entries.items(), key=lambda kv: kv[1], reverse=True)[:TOP_WHERE]:
        if us <= 0:
            continue
        out.append(where_of(name, us, steps))
        under = callees.get(name) or {}
        if under:
            callee, callee_us = max(under.items(), key=lambda kv: kv[1])
            if callee_us / us >= CALLEE_MIN_SHARE:  # ``us`` holds the callees' time too
                place = where_of(callee, callee_us, steps)
                place["share"] = round(callee_us / us, 3)
                out.append(place)
    return out


def untraced_reading(waits_s: Sequence[float], busy_s: Sequence[float]) -> dict[str, Any] | None:
    """The untraced steps' wait and step time (fetch + own time) in the median step (ms, share): one
    slow fetch makes no slow loader."""
    steps = len(waits_s)
    if not steps:
        return None
    shares = [wait / (wait + busy) if wait + busy > 0 else 0.0 for wait, busy in zip(waits_s, busy_s)]
    return {
        "steps": steps,
        "data_wait_ms": round(statistics.median(waits_s) * 1e3, 3),
        "share": round(statistics.median(shares), 3),
        "step_ms": round(statistics.median(w + b for w, b in zip(waits_s, busy_s)) * 1e3, 3),
    }


def untraced_clears(reading: Mapping[str, Any] | None) -> bool:
    """Whether the untraced steps' reading says the loader does not hold the step up (True without one)."""
    if not isinstance(reading, Mapping):
        return True
    try:
        steps, wait_ms, share = int(reading["steps"]), float(reading["data_wait_ms"]), float(reading["share"])
    except (KeyError, TypeError, ValueError):
        return True
    return steps < 1 or wait_ms < INPUT_BOUND_MIN_MS or share < INPUT_BOUND_SHARE


def input_bound(w: WindowView) -> Iterator[Finding]:
    """Fetching the next batch is a large share of most steps; where: the user code fetching it."""
    wait_ms = float((w.summary.get("breakdown_ms") or {}).get("data_wait") or 0.0)
    step_ms = w.step_ms
    if not step_ms or wait_ms < INPUT_BOUND_MIN_MS or wait_ms / step_ms < INPUT_BOUND_SHARE:
        return
    # One descheduled fetch lifts the mean, never most steps; W workers' batches arrive W at a time.
    workers = {thread[0] for thread in w.data.python_calls if thread[0] != w.pid}
    per_step = w.per_step_us(w.data_waits)
    if not w.most_steps(per_step, INPUT_BOUND_SHARE, INPUT_BOUND_MIN_MS, group=len(workers)):
        return
    untraced = w.data.meta.get(UNTRACED_WAIT_KEY)
    # In process, untraced steps that did not wait (or none at all) mean the tracing made this wait.
    # Not with workers: their prefetch hides an epoch's first waits, and their tracing costs little.
    if not workers and untraced_clears(untraced):
        return
    entries, callees = _entries_and_callees(w, w.thread, w.data_waits)
    source = "main process"
    if not entries:
        for thread in w.data.python_calls:
            if thread[0] == w.pid:
                continue
            more, more_callees = _entries_and_callees(w, thread, _EVERYTHING)
            for name, us in more.items():
                entries[name] = entries.get(name, 0.0) + us
            for name, under in more_callees.items():
                for callee, us in under.items():
                    callees[name][callee] += us
        source = "worker processes" if entries else "no user code recorded"
    evidence = {
        "data_wait_ms": round(wait_ms, 3),
        "median_step_data_wait_ms": round(statistics.median(per_step) / 1000.0, 3),
        "per_step_ms": [round(us / 1000.0, 3) for us in per_step],
        "step_ms": round(step_ms, 3),
        "source": source,
        UNTRACED_WAIT_KEY: dict(untraced) if isinstance(untraced, Mapping) else None,  # as the metadata has it
    }
    yield Finding(round(wait_ms / step_ms, 3), _places(entries, callees, w.steps), evidence)


RULES = (
    Rule(
        "input_bound",
        input_bound,
        {"INPUT_BOUND_SHARE": INPUT_BOUND_SHARE, "INPUT_BOUND_MIN_MS": INPUT_BOUND_MIN_MS},
        "Fetch batches in parallel: raise DataLoader num_workers (with persistent_workers=True, "
        "pin_memory=True), or make the dataset code named here cheaper (precompute, cache).",
    ),
)
