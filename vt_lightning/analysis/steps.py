"""One window's trace, read once: its events, its steps, the training thread and the stage ranges.

The summary builds a ``WindowData`` once (``read_window``) and hands the same object to every part
that reads the window (the tables, the breakdown, the verdicts), so no part re-reads the events or
finds the steps again. Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vt_lightning.analysis.breakdown import Range, stage_ranges
from vt_lightning.analysis.spans import Span, launches_by_correlation, x_events
from vt_lightning.analysis.spans import span_of as _span
from vt_lightning.analysis.summary_devices import RUNTIME_CATEGORIES
from vt_lightning.analysis.sweep import Nested, nest
from vt_lightning.constants import (
    CPU_OP_CATEGORY,
    PYTHON_CATEGORY,
    STEP_PREFIX,
    TRACE_METADATA_KEY,
    USER_ANNOTATION_CATEGORY,
)

Thread = tuple[Any, Any]  # (pid, tid) as the trace has them
Call = tuple[float, float, str]  # a Python call: start µs, end µs, VizTracer's function name


def _step_number(name: str) -> int | None:
    if not name.startswith(STEP_PREFIX):
        return None
    try:
        return int(name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def find_steps(events: Iterable[Mapping[str, Any]]) -> tuple[dict[int, Span], Any]:
    """``{step: (start, end)}`` from ``ProfilerStep#N`` ranges, and the (pid, tid) they are on."""
    steps: dict[int, Span] = {}
    thread = None
    for event in events:
        if event.get("cat") not in (USER_ANNOTATION_CATEGORY, CPU_OP_CATEGORY):  # most events are Python calls
            continue
        number = _step_number(str(event.get("name", "")))
        if number is None:
            continue
        steps[number] = _span(event)
        thread = (event.get("pid"), event.get("tid"))
    return dict(sorted(steps.items())), thread


@dataclass(frozen=True)
class WindowData:
    """What every part of the summary reads of one merged trace, computed once."""

    trace: Mapping[str, Any]
    meta: Mapping[str, Any]  # the trace's vt_lightning metadata block
    events: list[dict[str, Any]]  # the complete (X) events
    steps: dict[int, Span]  # every recorded step
    thread: Thread | None  # the training thread (the steps' thread)
    ranges: list[Range]  # breakdown.stage_ranges: (start, end, part) on the training thread
    breakdown_source: str
    user_hooks: dict[str, str]  # the user's hook overrides found, hook -> part

    @cached_property
    def launches(self) -> dict[Any, Any]:
        """``{correlation: CUDA runtime call}``: which call launched each kernel (the one map the
        op table and the verdicts read; empty on the CPU)."""
        return launches_by_correlation(self.events, RUNTIME_CATEGORIES)

    @cached_property
    def python_calls(self) -> dict[Thread, list[Call]]:
        """Each thread's Python calls, in the trace's order, read from the events once: the
        summary's Python tables, the workers' tables and the verdicts' timelines all start here."""
        calls: dict[Thread, list[Call]] = defaultdict(list)
        for event in self.events:
            if event.get("cat") == PYTHON_CATEGORY:
                start = float(event["ts"])
                calls[(event.get("pid"), event.get("tid"))].append(
                    (start, start + float(event.get("dur", 0.0) or 0.0), str(event.get("name", "")))
                )
        return dict(calls)

    @cached_property
    def _nested(self) -> dict[Thread, Nested]:
        return {}

    def nested(self, thread: Thread) -> Nested:
        """``sweep.nest`` of ``thread``'s whole ``python_calls``, computed once per thread: the
        workers' tables and the verdicts' timelines of the same thread share one sort."""
        found = self._nested.get(thread)
        if found is None:
            found = self._nested[thread] = nest(self.python_calls.get(thread, ()))
        return found

    @property
    def counted(self) -> list[int]:
        """The steps every per-step number covers: all but the first, which misses its fetch."""
        recorded = list(self.steps)
        return recorded[1:] if len(recorded) > 1 else recorded


def read_window(trace: Mapping[str, Any]) -> WindowData:
    """The one read of a merged window trace."""
    meta = trace.get(TRACE_METADATA_KEY) or {}
    events = x_events(trace)
    steps, thread = find_steps(events)
    hooks = meta.get("user_hooks")
    ranges, source, found_hooks = stage_ranges(events, thread, hooks if isinstance(hooks, dict) else None)
    return WindowData(trace, meta, events, steps, thread, ranges, source, found_hooks)
