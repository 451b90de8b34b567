"""The two clocks read at a window's edges (the calibration's maths: ``analysis/clock.py``), from the
clocks themselves, never from traced events, so that no tracer filter can break it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vt_lightning.analysis.clock import DEFAULT_ROUNDS, MARKER_ROUNDS, ClockPair
from vt_lightning.constants import CLOCK_MARKER_PREFIX

# The wall clock torch.profiler's timestamps follow. A module attribute so tests can inject a step.
wall_clock_ns: Callable[[], int] = time.time_ns


def sample_pair(
    python_clock_us: Callable[[], float],
    wall_ns: Callable[[], int] | None = None,
    rounds: int = DEFAULT_ROUNDS,
) -> ClockPair:
    """Read (python, wall, python) ``rounds`` times and keep the tightest round trip."""
    read_wall = wall_ns if wall_ns is not None else wall_clock_ns
    best: ClockPair | None = None
    for _ in range(rounds):
        before = python_clock_us()
        wall = read_wall()
        after = python_clock_us()
        trip = after - before
        if best is None or trip < best.round_trip_us:
            best = ClockPair((before + after) / 2.0, wall, trip)
    assert best is not None
    return best


def emit_markers(
    python_clock_us: Callable[[], float], make_range: Callable[[str], Any], edge: str, rounds: int = MARKER_ROUNDS
) -> list[tuple[str, float, float]]:
    """Record ``rounds`` empty torch ranges, each bracketed by two Python-clock reads (built before them)."""
    samples = []
    for i in range(rounds):
        name = f"{CLOCK_MARKER_PREFIX}/{edge}#{i}"
        marker = make_range(name)
        enter, leave = marker.__enter__, marker.__exit__
        before = python_clock_us()
        enter()
        leave(None, None, None)
        after = python_clock_us()
        samples.append((name, before, after))
    return samples
