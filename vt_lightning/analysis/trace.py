"""A window's merged trace as every later stage reads it: typed, its events filed once. Pure.

Events added after the merge go through ``WindowTrace.add`` and times through ``shift``, so the
tables stay true; a trace read back becomes one with ``WindowTrace.of``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from vt_lightning.analysis.nest import Nest
from vt_lightning.constants import (
    ANNOTATION_PREFIXES,
    CPU_OP_CATEGORY,
    PYTHON_CATEGORY,
    TRACE_METADATA_KEY,
    USER_ANNOTATION_CATEGORY,
)

Thread = tuple[Any, Any]  # (pid, tid) as the trace has them
Call = tuple[float, float, str]  # a Python call: start µs, end µs, VizTracer's function name
MEMORY_EVENT = "[memory]"  # torch's allocation instants (``profile_memory=True``)

NESTED_TORCH_CATEGORIES = (CPU_OP_CATEGORY,)  # ops nest inside the Python call that issued them
# torch.compile's ranges, written as cpu_op but opened in one Python call and closed in another
# (the compiled frame, AOT's runtime wrappers, dynamo's compile phases): ranges, not ops.
COMPILE_RANGE_PREFIXES = (
    "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper",
    "## Call CompiledFxGraph",
    "## ",
    "Torch-Compiled Region",
    "CompiledFunction",
    "TorchDynamo Cache Lookup",
    "entire_frame_compile",
    "dynamo",
)
COMPILE_RANGE_SUFFIX = "(dynamo_timed)"
_TS, _DUR, _NAME = itemgetter("ts"), itemgetter("dur"), itemgetter("name")


def is_range_name(name: str) -> bool:
    """A ``cpu_op`` that Python calls open and close (steps, Lightning's, torch.compile's): not nested."""
    return (
        name.startswith(ANNOTATION_PREFIXES)
        or name.startswith(COMPILE_RANGE_PREFIXES)
        or name.endswith(COMPILE_RANGE_SUFFIX)
    )


class ThreadSpans:
    """One window's X events per thread: calls, ops (nested in their call), annotation ranges, the rest."""

    __slots__ = ("annotations", "cut", "ops", "other", "python", "settled")

    def __init__(self, events: Iterable[dict[str, Any]] = ()) -> None:
        self.python: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.ops: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.annotations: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.other: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        self.cut: set[Thread] = set()  # threads where untangle_annotations moved a call's bounds
        # threads whose calls went on the nanosecond grid as arrays: their ts and dur, in file order
        self.settled: dict[Thread, tuple[np.ndarray, np.ndarray]] = {}
        for event in events:
            if event.get("ph") == "X":
                self.add(event, event.get("cat"), str(event.get("name", "")))

    def add(self, event: dict[str, Any], cat: Any, name: str) -> None:
        """File one X event (its ``cat`` and ``name`` as read) under its thread and kind."""
        key = (event.get("pid"), event.get("tid"))
        if cat == PYTHON_CATEGORY:
            self.python[key].append(event)
        elif cat == USER_ANNOTATION_CATEGORY or is_range_name(name):
            self.annotations[key].append(event)  # opened and closed by Python calls, not nested
        elif cat in NESTED_TORCH_CATEGORIES:
            self.ops[key].append(event)
        else:
            self.other[key].append(event)

    def all_events(self) -> dict[Thread, list[dict[str, Any]]]:
        out: dict[Thread, list[dict[str, Any]]] = defaultdict(list)
        for kind in (self.python, self.ops, self.annotations, self.other):
            for key, thread_events in kind.items():
                out[key].extend(thread_events)
        return out


@dataclass(frozen=True, eq=False)
class Calls:
    """One thread's Python calls, in the file's order: ``starts`` and ``ends`` (µs), ``names``."""

    starts: np.ndarray
    ends: np.ndarray
    names: list[str]

    @classmethod
    def of(cls, calls: Sequence[Call]) -> Calls:
        count = len(calls)
        return cls(
            np.fromiter(map(itemgetter(0), calls), dtype=float, count=count),
            np.fromiter(map(itemgetter(1), calls), dtype=float, count=count),
            [str(name) for name in map(itemgetter(2), calls)],
        )

    @classmethod
    def from_events(cls, events: Sequence[Mapping[str, Any]]) -> Calls:
        count = len(events)
        try:  # a merged trace's: floats and strings, read at C speed
            starts = np.fromiter(map(_TS, events), dtype=float, count=count)
            ends = starts + np.fromiter(map(_DUR, events), dtype=float, count=count)
            names = list(map(_NAME, events))
            if all(name.__class__ is str for name in names):
                return cls(starts, ends, names)
        except (KeyError, TypeError, ValueError):  # a file's, read back: whatever it holds
            pass
        calls = []
        for event in events:
            start = float(event["ts"])
            calls.append((start, start + float(event.get("dur", 0.0) or 0.0), str(event.get("name", ""))))
        return cls.of(calls)

    def __len__(self) -> int:
        return len(self.names)

    @cached_property
    def nest(self) -> Nest:
        """The calls nested, each cut to the call it starts in (made once, read by every table)."""
        return Nest(self.starts, self.ends)

    @cached_property
    def ordered_names(self) -> list[str]:
        names = self.names
        return [names[i] for i in self.nest.order.tolist()]

    def within(self, lo: float, hi: float) -> tuple[Calls, np.ndarray]:
        """The calls that overlap ``[lo, hi]``, each cut to it, and where each began."""
        kept = (self.ends > lo) & (self.starts < hi)
        began = self.starts[kept]
        names = [name for name, keep in zip(self.names, kept.tolist()) if keep]
        return Calls(np.maximum(began, lo), np.minimum(self.ends[kept], hi), names), began


class WindowTrace:
    """One window's merged trace: ``header``, ``events`` (file order), their tables; ``python``: where
    the Python part lies in ``events`` (all of a trace read back), ``loose``: its timed non-calls."""

    def __init__(
        self,
        header: dict[str, Any],
        events: list[dict[str, Any]],
        threads: ThreadSpans,
        memory: list[dict[str, Any]],
        metadata: list[dict[str, Any]],
        python: range | None = None,
        loose: list[dict[str, Any]] | None = None,
        calls: dict[Thread, Calls] | None = None,
    ) -> None:
        self.header = header
        self.events = events
        self.threads = threads
        self.memory = memory
        self.metadata = metadata
        self.python = python if python is not None else range(len(events))
        self.loose = loose  # the Python part's events with a time that are no complete call
        self._calls: dict[Thread, Calls] = dict(calls or {})

    @classmethod
    def of(cls, trace: Mapping[str, Any]) -> WindowTrace:
        """A trace read back (a file, a dict built by hand), filed in one pass."""
        events = list(trace.get("traceEvents") or [])
        threads = ThreadSpans(events)
        memory = [e for e in events if e.get("name") == MEMORY_EVENT and e.get("ph") == "i"]
        metadata = [e for e in events if e.get("ph") == "M"]
        header = {key: value for key, value in trace.items() if key != "traceEvents"}
        return cls(header, events, threads, memory, metadata)

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.header.get(TRACE_METADATA_KEY)
        if not isinstance(meta, dict):
            meta = self.header[TRACE_METADATA_KEY] = {}
        return meta

    def as_dict(self) -> dict[str, Any]:
        """The trace as its file holds it: the header's keys, then ``traceEvents`` last."""
        return {**self.header, "traceEvents": self.events}

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        """Append ``events`` (after the Python part) and file them."""
        for event in events:
            self.events.append(event)
            ph = event.get("ph")
            if ph == "X":
                self.threads.add(event, event.get("cat"), str(event.get("name", "")))
            elif ph == "M":
                self.metadata.append(event)
            elif ph == "i" and event.get("name") == MEMORY_EVENT:
                self.memory.append(event)

    def shift(self, us: float) -> None:
        """Move every ``ts`` by ``us``: the tables read anew."""
        for event in self.events:
            if "ts" in event:
                event["ts"] = float(event["ts"]) + us
        self._calls.clear()

    def other_events(self) -> list[dict[str, Any]]:
        """Every event but the Python part's (all of a trace read back), in order."""
        span = self.python
        if span.start == 0 and span.stop == len(self.events):
            return self.events
        return self.events[: span.start] + self.events[span.stop :]

    def calls(self, thread: Thread) -> Calls:
        """``thread``'s Python calls as columns, read once."""
        found = self._calls.get(thread)
        if found is None:
            found = self._calls[thread] = Calls.from_events(self.threads.python.get(thread) or [])
        return found

    def python_threads(self) -> list[Thread]:
        """The threads with Python calls, in the order their first call comes in the file."""
        return [thread for thread, found in self.threads.python.items() if found]

    def rest(self, keep: Callable[[str], bool]) -> list[dict[str, Any]]:
        """The complete events but the Python calls, with those ``keep`` reads by name."""
        kept = {name for thread in self.python_threads() for name in set(self.calls(thread).names) if keep(name)}
        span = self.python
        out = [e for e in self.events[: span.start] if e.get("ph") == "X" and "ts" in e]
        if (span.start == 0 and span.stop == len(self.events)) or kept:  # read back, or calls to keep
            out += [
                e
                for e in self.events[span.start : span.stop]
                if e.get("ph") == "X" and "ts" in e and (e.get("cat") != PYTHON_CATEGORY or e.get("name") in kept)
            ]
        out += [e for e in self.events[span.stop :] if e.get("ph") == "X" and "ts" in e]
        return out

    def earliest(self) -> float | None:
        """The earliest ``ts`` of the trace (None: no event has one)."""
        span = self.python
        if self.loose is None:  # read back: every event is read
            found = [e["ts"] for e in self.events if "ts" in e]
        else:
            outside = self.events[: span.start] + self.events[span.stop :]
            found = [e["ts"] for e in outside if "ts" in e] + [e["ts"] for e in self.loose]
            found += [calls.starts.min() for calls in map(self.calls, self.python_threads()) if len(calls)]
        try:
            return float(min(found)) if found else None
        except TypeError:  # one written as a string
            return min(map(float, found))
