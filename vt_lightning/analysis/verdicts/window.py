"""The window as the rules read it: one ``WindowView``, with a ``Timeline`` per thread. Pure."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Container, Iterator, Mapping, Sequence
from functools import cached_property
from itertools import pairwise
from typing import Any

import numpy as np

from vt_lightning.analysis.compile import COMPILE_SPAN_PREFIX
from vt_lightning.analysis.python_tables import name_codes
from vt_lightning.analysis.schema import Summary
from vt_lightning.analysis.spans import Span, clip, covered, span_of, union
from vt_lightning.analysis.steps import WindowData
from vt_lightning.analysis.summary_devices import KERNEL_CATEGORIES, RUNTIME_CATEGORIES
from vt_lightning.analysis.trace import Calls, Thread
from vt_lightning.analysis.usercode import function_origin
from vt_lightning.constants import ANNOTATION_PREFIXES, CPU_OP_CATEGORY, GC_SPAN_PREFIX, PYTHON_CATEGORY

# Builtins that wait rather than compute: time in them is not "Python-bound".
BLOCKING_SUFFIXES = ("sleep", "acquire", "wait", "select", "poll", "recv", "recv_into", "join")


# ``start, end, call, user, entry, owner``: a stretch owned by one innermost call (a plain tuple:
# one per call boundary); user: the innermost user call around it; entry: the user call entered
# from library code; owner: who owns it as pure Python (a user call, or a builtin / stdlib call
# made from one).
Segment = tuple[float, float, str, str | None, str | None, str | None]


def _kind(name: str, command: Container[str]) -> str:
    """What a call is to the timeline: its code's origin, or ``"gc"`` for a gc pause."""
    return "gc" if name.startswith(GC_SPAN_PREFIX) else function_origin(name, command)[0]


class Timeline:
    """One thread's calls cut into ``Segment``s: its ``Nest``'s stretches and what each inherits."""

    def __init__(self, calls: Calls, command: Container[str] = ()) -> None:
        nest = calls.nest
        distinct, codes = name_codes(calls.ordered_names)
        kinds = [_kind(name, command) for name in distinct]
        user_names = np.array([kind == "user" for kind in kinds], dtype=bool)
        pure_names = np.array(
            [
                kind in ("builtin", "stdlib") and not name.endswith(BLOCKING_SUFFIXES)
                for kind, name in zip(kinds, distinct)
            ],
            dtype=bool,
        )
        is_user = user_names[codes]
        parents = nest.parents
        parent_is_user = np.where(parents >= 0, is_user[np.maximum(parents, 0)], False) if len(codes) else is_user
        users = nest.inherited(codes, is_user)
        entries = nest.inherited(codes, is_user & ~parent_is_user)
        owners = nest.inherited(np.where(is_user, codes, -1), is_user | ~pure_names[codes])
        lo, hi, owner = nest.segments()
        lookup: list[str | None] = [*distinct, None]  # [-1]: none
        self.starts: list[float] = lo.tolist()
        self.segments: list[Segment] = list(
            zip(
                self.starts,
                hi.tolist(),
                map(lookup.__getitem__, codes[owner].tolist()),
                map(lookup.__getitem__, users[owner].tolist()),
                map(lookup.__getitem__, entries[owner].tolist()),
                map(lookup.__getitem__, owners[owner].tolist()),
            )
        )

    def at(self, t: float) -> Segment | None:
        i = bisect_right(self.starts, t) - 1
        if i >= 0:
            segment = self.segments[i]
            if segment[0] <= t < segment[1]:
                return segment
        return None

    def within(self, spans: Sequence[Span]) -> Iterator[tuple[Span, Segment]]:
        """(the part inside ``spans``, segment) for every segment overlapping the sorted, disjoint spans."""
        segments = self.segments
        for lo, hi in spans:
            i = max(bisect_right(self.starts, lo) - 1, 0)
            while i < len(segments) and segments[i][0] < hi:
                seg = segments[i]
                part = (max(seg[0], lo), min(seg[1], hi))
                if part[1] > part[0]:
                    yield part, seg
                i += 1


class WindowView:
    """What every rule reads: the summary, the counted steps, the events by kind, the timelines."""

    def __init__(self, data: WindowData, summary: Summary, snapshot: Any = None) -> None:
        self.data = data
        self.trace = data.trace
        self.summary = summary
        self.snapshot = snapshot
        self.thread: Thread | None = data.thread
        steps = data.steps
        counted = [n for n in (summary.get("steps") or {}).get("counted") or [] if n in steps]
        self.steps = len(counted)
        self.step_starts = sorted(steps[n][0] for n in counted)
        self.step_spans = union(steps[n] for n in counted)
        self.total_us = sum(steps[n][1] - steps[n][0] for n in counted)
        self.region: Span = (self.step_spans[0][0], self.step_spans[-1][1]) if self.step_spans else (0.0, 0.0)
        self.pid = self.thread[0] if self.thread else None
        self.ops: list[Span] = []  # the training thread's torch ops and CUDA runtime calls
        self.runtime: list[dict[str, Any]] = []
        self.kernels: list[dict[str, Any]] = []
        self.gc: list[dict[str, Any]] = []
        self.compile_spans: list[dict[str, Any]] = []  # analysis/compile.py's ``torch.compile: …`` spans
        for e in data.rest:
            cat = e.get("cat")
            if cat == PYTHON_CATEGORY:
                name = str(e.get("name", ""))
                if name.startswith(GC_SPAN_PREFIX):
                    self.gc.append(e)
                elif name.startswith(COMPILE_SPAN_PREFIX):
                    self.compile_spans.append(e)
            elif cat in KERNEL_CATEGORIES:
                self.kernels.append(e)
            elif cat in RUNTIME_CATEGORIES or cat == CPU_OP_CATEGORY:
                if cat != CPU_OP_CATEGORY:
                    self.runtime.append(e)
                elif str(e.get("name", "")).startswith(ANNOTATION_PREFIXES):
                    continue
                if (e.get("pid"), e.get("tid")) == self.thread:
                    self.ops.append(span_of(e))
        self._timelines: dict[Any, Timeline] = {}

    @property
    def step_ms(self) -> float:
        return self.total_us / 1000.0 / max(self.steps, 1)

    @cached_property
    def data_waits(self) -> list[Span]:
        """The counted steps' ``data_wait`` ranges (fetching the batch), as the breakdown has them."""
        parts = [(s, e) for s, e, part in self.data.ranges if part == "data_wait"]
        return union(clip(parts, *self.region))

    @cached_property
    def slots(self) -> list[Span]:
        """Each counted step's slot, from its start to the next one's: a fetch counts for its step."""
        return list(pairwise([*self.step_starts, self.region[1]]))

    def per_step_us(self, spans: Sequence[Span]) -> list[float]:
        """µs of the sorted, disjoint ``spans`` in each counted step's slot."""
        starts = [s for s, _ in spans]
        return [covered(slot, spans, starts) for slot in self.slots]

    def most_steps(self, per_step_us: Sequence[float], share: float, min_ms: float, group: int = 1) -> bool:
        """Whether more than half the counted steps each show it (one preempted call carries a sum, never most
        steps); ``group`` consecutive steps count as one (workers deliver batches in bursts)."""
        group, slots = max(group, 1), self.slots
        shown = parts = 0
        for i in range(0, len(slots), group):
            cut = slots[i : i + group]
            us = sum(per_step_us[i : i + group])
            shown += us >= min_ms * 1000.0 * len(cut) and us >= share * sum(hi - lo for lo, hi in cut)
            parts += 1
        return shown * 2 > parts

    def timeline(self, thread: Any) -> Timeline:
        found = self._timelines.get(thread)
        if found is None:
            calls = self.data.python_calls.get(thread) or Calls.of([])
            found = self._timelines[thread] = Timeline(calls, self.data.command)
        return found

    def in_steps(self, span: Span) -> bool:
        lo, hi = span
        return any(s < hi and lo < e for s, e in self.step_spans)

    def per_step_ms(self, us: float) -> float:
        return round(us / 1000.0 / max(self.steps, 1), 3)

    def user_at(self, event: Mapping[str, Any], t: float | None = None) -> str | None:
        """The innermost user call on ``event``'s thread at ``t`` (its start by default)."""
        here = self.timeline((event.get("pid"), event.get("tid"))).at(float(event["ts"]) if t is None else t)
        if here is None:
            return None
        _, _, _, user, _, _ = here
        return user
