"""One window's trace, read once: its events, its steps, the training thread and the stage ranges.

The summary builds a ``WindowData`` once (``read_window``) and hands the same object to every part
that reads the window (the tables, the breakdown, the verdicts), so no part re-reads the events or
finds the steps again. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

from vt_lightning.analysis.breakdown import Range, stage_ranges_of
from vt_lightning.analysis.compile import COMPILE_SPAN_PREFIX, RESUME_MARK
from vt_lightning.analysis.python_tables import EntryTimes, PythonStats
from vt_lightning.analysis.spans import Span, launches_by_correlation, x_events
from vt_lightning.analysis.spans import span_of as _span
from vt_lightning.analysis.summary_devices import RUNTIME_CATEGORIES
from vt_lightning.analysis.trace import Call, Calls, Thread
from vt_lightning.constants import (
    CPU_OP_CATEGORY,
    GC_SPAN_PREFIX,
    PL_PROFILE_PREFIX,
    PYTHON_CATEGORY,
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
    """What every part of the summary reads of one merged trace, computed once.

    ``read_window`` files the events in one pass by what the tables read: each thread's Python
    calls (``python_calls``, most of a window's events: the DataLoader workers' above all), every
    other complete event (``rest``: torch's ops and annotations, CUDA runtime calls, kernels, the
    workers' fetch spans, and the Python-category spans that are read by name: gc pauses, compile
    spans, Lightning's stage ranges, dynamo's resume calls) and torch's ``[memory]`` instants. Each
    table reads its bucket, in the trace's order, never the whole list."""

    trace: Mapping[str, Any]
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
    def events(self) -> list[dict[str, Any]]:
        """The complete (X) events, all of them (for readers off the summary's path)."""
        return x_events(self.trace)

    @cached_property
    def launches(self) -> dict[Any, Any]:
        """``{correlation: CUDA runtime call}``: which call launched each kernel (the one map the
        op table and the verdicts read; empty on the CPU)."""
        return launches_by_correlation(self.rest, RUNTIME_CATEGORIES)

    @cached_property
    def whole_threads(self) -> PythonStats:
        """The Python tables of the threads ``walk`` went through, each thread whole (unclipped,
        without phases): the DataLoader workers' tables read them."""
        return PythonStats()

    @cached_property
    def _walks(self) -> dict[Thread, EntryTimes]:
        return {}

    def walk(self, thread: Thread) -> EntryTimes:
        """``thread``'s whole calls, once per thread: its tables into ``whole_threads`` and its
        entry times (``PythonStats.entry_times``), returned; the workers' tables and
        ``input_bound`` read a worker thread through it."""
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


# Python calls whose names a table reads (gc pauses, compile spans, Lightning's ranges) go to
# ``WindowData.rest`` as well; so do dynamo's resume calls (``RESUME_MARK`` in the name).
_NAMED_PREFIXES = (GC_SPAN_PREFIX, COMPILE_SPAN_PREFIX, PL_PROFILE_PREFIX)
_NAME = itemgetter(2)  # a Call's name


def classify(
    trace_events: Sequence[dict[str, Any]],
    run: range = range(0),
    run_calls: Mapping[Thread, list[Call]] | None = None,
) -> tuple[dict[Thread, list[Call]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(python_calls, rest, memory)`` of ``WindowData``, in one pass over a trace's events; runs
    once per event of the window, so it is written for speed.

    ``run`` and ``run_calls``: a run of ``trace_events`` that holds nothing but Python calls
    (a DataLoader worker's, most of a window's events), each thread's calls in one stretch, and
    those calls as read here (``merge.merge_window``'s ``bounds``): taken as given instead of read
    from the events, once each stretch's first and last call match them and none of their names is
    one ``rest`` keeps. Otherwise the run is read like every other event."""
    calls: dict[Thread, list[Call]] = {}
    rest: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    named: dict[str, bool] = {}
    if run_calls is not None and _describes(trace_events, run, run_calls, named):
        _file(trace_events[: run.start], calls, rest, memory, named)
        for thread, found in run_calls.items():
            known = calls.get(thread)
            if known is None:
                calls[thread] = found
            else:
                known.extend(found)
        _file(trace_events[run.stop :], calls, rest, memory, named)
    else:
        _file(trace_events, calls, rest, memory, named)
    return calls, rest, memory


def _is_named(name: str, named: dict[str, bool]) -> bool:
    """Whether ``rest`` keeps a Python call of this name as well; names repeat (a worker's 163k
    calls have a few thousand), so each is tested once."""
    found = named.get(name)
    if found is None:
        found = named[name] = name.startswith(_NAMED_PREFIXES) or RESUME_MARK in name
    return found


def _describes(
    events: Sequence[dict[str, Any]], run: range, run_calls: Mapping[Thread, list[Call]], named: dict[str, bool]
) -> bool:
    """Whether ``run_calls`` are ``events[run]``'s calls as ``_file`` would read them: as many,
    each thread's stretch starting and ending where its calls do, and no name ``rest`` keeps."""
    if not len(run) or run.stop > len(events) or sum(map(len, run_calls.values())) != len(run):
        return False
    at = run.start
    for (pid, tid), found in run_calls.items():
        if not found:
            return False
        first, last = events[at], events[at + len(found) - 1]
        for event, call in ((first, found[0]), (last, found[-1])):
            if event.get("pid") != pid or event.get("tid") != tid or event.get("ph") != "X":
                return False
            if event.get("cat") != PYTHON_CATEGORY or event.get("ts") != call[0] or event.get("name") != call[2]:
                return False
        at += len(found)
        if any(_is_named(name, named) for name in set(map(_NAME, found))):
            return False
    return True


def _file(
    trace_events: Iterable[dict[str, Any]],
    calls: dict[Thread, list[Call]],
    rest: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    named: dict[str, bool],
) -> None:
    """``classify``'s loop: file each event into ``calls``, ``rest`` or ``memory``."""
    keep, keep_memory = rest.append, memory.append
    last_pid: Any = None
    last_tid: Any = None
    add_call = None
    for event in trace_events:
        if event.get("ph") != "X" or "ts" not in event:
            if event.get("name") == "[memory]" and event.get("ph") == "i":
                keep_memory(event)
            continue
        if event.get("cat") != PYTHON_CATEGORY:
            keep(event)
            continue
        pid, tid = event.get("pid"), event.get("tid")
        # A thread's calls come in long runs: its (pid, tid) key is built only when the run changes.
        if tid != last_tid or pid != last_pid or add_call is None:
            thread = (pid, tid)
            found = calls.get(thread)
            if found is None:
                found = calls[thread] = []
            add_call, last_pid, last_tid = found.append, pid, tid
        start = float(event["ts"])
        name = str(event.get("name", ""))
        add_call((start, start + float(event.get("dur", 0.0) or 0.0), name))
        is_named = named.get(name)  # the cache read inline: this loop runs once per event
        if is_named is None:
            is_named = _is_named(name, named)
        if is_named:
            keep(event)


def read_window(
    trace: Mapping[str, Any], run: range = range(0), run_calls: Mapping[Thread, list[Call]] | None = None
) -> WindowData:
    """The one read of a merged window trace (``run``, ``run_calls``: see ``classify``)."""
    meta = trace.get(TRACE_METADATA_KEY) or {}
    calls, rest, memory = classify(trace.get("traceEvents", []), run, run_calls)
    steps, thread = find_steps(rest)
    hooks = meta.get("user_hooks")
    on_thread = [e for e in rest if (e.get("pid"), e.get("tid")) == thread]
    ranges, source, found_hooks = stage_ranges_of(
        on_thread, calls.get(thread, []) if thread is not None else [], hooks if isinstance(hooks, dict) else None
    )
    tables = {key: Calls.of(found) for key, found in calls.items()}
    return WindowData(trace, meta, tables, rest, memory, steps, thread, ranges, source, found_hooks)
