"""A window's trace as the analysis reads it: per-thread tables of its events. Pure.

``Calls``: one thread's Python calls as columns (start, end, name), with their ``nest.Nest`` made
once, on first use, for every table and rule that reads the thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from vt_lightning.analysis.nest import Nest

Thread = tuple[Any, Any]  # (pid, tid) as the trace has them
Call = tuple[float, float, str]  # a Python call: start µs, end µs, VizTracer's function name


@dataclass(frozen=True, eq=False)
class Calls:
    """One thread's Python calls, in the trace's order: ``starts`` and ``ends`` (µs), ``names``."""

    starts: np.ndarray
    ends: np.ndarray
    names: list[str]

    @classmethod
    def of(cls, calls: Sequence[Call]) -> Calls:
        """From ``(start, end, name)`` tuples."""
        count = len(calls)
        return cls(
            np.fromiter(map(itemgetter(0), calls), dtype=float, count=count),
            np.fromiter(map(itemgetter(1), calls), dtype=float, count=count),
            [str(name) for name in map(itemgetter(2), calls)],
        )

    @classmethod
    def from_events(cls, events: Iterable[Mapping[str, Any]]) -> Calls:
        """From complete events: ``ts``, ``ts + dur`` and ``name``."""
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
        """``names`` in ``nest``'s order."""
        names = self.names
        return [names[i] for i in self.nest.order.tolist()]

    def within(self, lo: float, hi: float) -> tuple[Calls, np.ndarray]:
        """The calls that overlap ``[lo, hi]``, each cut to it, and where each began."""
        kept = (self.ends > lo) & (self.starts < hi)
        began = self.starts[kept]
        names = [name for name, keep in zip(self.names, kept.tolist()) if keep]
        return Calls(np.maximum(began, lo), np.minimum(self.ends[kept], hi), names), began
