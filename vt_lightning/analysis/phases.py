"""Which breakdown part ran at an instant, as ``breakdown.attribute_step`` tiles the steps: the
phases the Python tables fold the frameworks' calls by. Pure."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from vt_lightning.analysis.breakdown import Range, attribute_step
from vt_lightning.analysis.spans import Span

OUTSIDE = "other"  # the phase of an instant outside the covered steps (the loop between them)


class PhaseSegments:
    """Segments ``[starts[i], starts[i + 1])`` of part ``parts[i]``; ``OUTSIDE`` around them."""

    __slots__ = ("parts", "starts")

    def __init__(self, starts: list[float], parts: list[str]) -> None:
        self.starts, self.parts = starts, parts

    def segments_at(self, times: np.ndarray) -> np.ndarray:
        """For each of ``times``, 1 + the index of the segment it falls in (0: before the first)."""
        return np.digitize(times, np.asarray(self.starts, dtype=float))


def phase_segments(steps: Sequence[Span], ranges: Sequence[Range]) -> PhaseSegments | None:
    """The phases over ``steps`` as the breakdown attributes them; None when no range overlaps them."""
    starts: list[float] = []
    parts: list[str] = []
    found = False

    def add(start: float, part: str) -> None:
        if parts and parts[-1] == part:
            return
        if starts and starts[-1] == start:  # an empty piece: the later one replaces it
            starts.pop()
            parts.pop()
            if parts and parts[-1] == part:
                return
        starts.append(start)
        parts.append(part)

    for lo, hi in sorted(steps):
        inside = [r for r in ranges if r[1] > lo and r[0] < hi]
        found = found or bool(inside)
        cuts = sorted({lo, hi, *(max(r[0], lo) for r in inside), *(min(r[1], hi) for r in inside)})
        for a, b in itertools.pairwise(cuts):
            us = attribute_step((a, b), inside)
            add(a, max(us, key=us.__getitem__))  # the one part the piece went to
        add(hi, OUTSIDE)
    return PhaseSegments(starts, parts) if found else None
