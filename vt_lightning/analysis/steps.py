"""A window's trace read once for the summary: every part reading the window shares one
``WindowData``, so none re-reads the events or finds the steps again. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vt_lightning.analysis.breakdown import Range, stage_ranges
from vt_lightning.analysis.compile import COMPILE_SPAN_PREFIX, RESUME_MARK
from vt_lightning.analysis.python_tables import EntryTimes, PythonStats
from vt_lightning.analysis.schema import Observer
from vt_lightning.analysis.spans import Span, launches_by_correlation
from vt_lightning.analysis.spans import span_of as _span
from vt_lightning.analysis.summary_devices import RUNTIME_CATEGORIES
from vt_lightning.analysis.trace import Calls, Thread, WindowTrace
from vt_lightning.constants import (
    COMMAND_FUNCTIONS_KEY,
    CPU_OP_CATEGORY,
    GC_SPAN_PREFIX,
    PL_PROFILE_PREFIX,
    STEP_PREFIX,
    TRACE_METADATA_KEY,
    USER_ANNOTATION_CATEGORY,
)


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
    """What every part of the summary reads of one window: calls per thread, other events, steps, stages."""

    trace: WindowTrace
    meta: Mapping[str, Any]  # the trace's vt_lightning metadata block
    python_calls: dict[Thread, Calls]  # each thread's Python calls, in the trace's order
    rest: list[dict[str, Any]]  # the complete events but the ordinary Python calls, in the trace's order
    memory: list[dict[str, Any]]  # torch's ``[memory]`` instants, in the trace's order
    steps: dict[int, Span]  # every recorded step
    thread: Thread | None  # the training thread (the steps' thread)
    ranges: list[Range]  # breakdown.stage_ranges: (start, end, part) on the training thread
    breakdown_source: str
    user_hooks: dict[str, str]  # the user's hook overrides found, hook -> part

    @cached_property
    def launches(self) -> dict[Any, Any]:
        """``{correlation: CUDA runtime call}``: which call launched each kernel (empty on the CPU)."""
        return launches_by_correlation(self.rest, RUNTIME_CATEGORIES)

    @cached_property
    def command(self) -> frozenset[str]:
        """The ``python -c`` command's own functions, the user's (``usercode.function_origin``)."""
        found = self.meta.get(COMMAND_FUNCTIONS_KEY)
        return frozenset(n for n in found if isinstance(n, str)) if isinstance(found, list) else frozenset()

    @cached_property
    def whole_threads(self) -> PythonStats:
        """The Python tables of the threads ``walk`` went through, each whole (unclipped, no phases)."""
        return PythonStats(self.command)

    @cached_property
    def _walks(self) -> dict[Thread, EntryTimes]:
        return {}

    def walk(self, thread: Thread) -> EntryTimes:
        """``thread``'s whole calls read once: tables into ``whole_threads``, its entry times returned."""
        found = self._walks.get(thread)
        if found is None:
            calls = self.python_calls.get(thread) or Calls.of([])
            distinct, codes = self.whole_threads.add(thread, calls.nest, calls.ordered_names)
            found = self._walks[thread] = self.whole_threads.entry_times(calls.nest, distinct, codes)
        return found

    @property
    def counted(self) -> list[int]:
        """The steps every per-step number covers: all but the first, which misses its fetch."""
        recorded = list(self.steps)
        return recorded[1:] if len(recorded) > 1 else recorded


def observer(untraced: Any, traced_step_ms: float | None) -> Observer:
    """The cost of observing: the window's median step beside the run's untraced one."""
    reading = untraced if isinstance(untraced, Mapping) else {}
    untraced_ms = reading.get("step_ms")
    untraced_ms = float(untraced_ms) if isinstance(untraced_ms, (int, float)) and untraced_ms > 0 else None
    return {
        "traced_step_ms": traced_step_ms,
        "untraced_step_ms": untraced_ms,
        "untraced_steps": int(reading.get("steps") or 0) if untraced_ms is not None else 0,
        "ratio": round(traced_step_ms / untraced_ms, 2) if traced_step_ms and untraced_ms else None,
    }


# Python calls a table reads by name go to ``WindowData.rest`` too, and dynamo's resume calls.
_NAMED_PREFIXES = (GC_SPAN_PREFIX, COMPILE_SPAN_PREFIX, PL_PROFILE_PREFIX)


def read_by_name(name: str) -> bool:
    """Whether ``rest`` keeps a Python call of this name as well."""
    return name.startswith(_NAMED_PREFIXES) or RESUME_MARK in name


def read_window(trace: WindowTrace | Mapping[str, Any]) -> WindowData:
    """The one read of a window's trace (a ``WindowTrace``, or a dict read back)."""
    if not isinstance(trace, WindowTrace):
        trace = WindowTrace.of(trace)
    meta = trace.header.get(TRACE_METADATA_KEY) or {}
    calls = {thread: trace.calls(thread) for thread in trace.python_threads()}
    rest = trace.rest(read_by_name)
    steps, thread = find_steps(rest)
    hooks = meta.get("user_hooks")
    on_thread = [e for e in rest if (e.get("pid"), e.get("tid")) == thread]
    ranges, source, found_hooks = stage_ranges(
        on_thread,
        calls.get(thread) or Calls.of([]) if thread is not None else Calls.of([]),
        hooks if isinstance(hooks, dict) else None,
    )
    return WindowData(trace, meta, calls, rest, trace.memory, steps, thread, ranges, source, found_hooks)
