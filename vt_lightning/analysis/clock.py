"""Per-window calibration of VizTracer's clock against torch.profiler's: both clocks are read (by
``recording/clock_probes.py``, never through traced events) at each window's start and end, and the
offset interpolated across it, so a wall-clock step or a drift since import cannot misplace events."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ROUNDS = 64  # clock pairs read per window edge (the tightest round trip is kept)


@dataclass(frozen=True)
class ClockPair:
    """One reading of both clocks: Python-tracer µs at the midpoint of a round trip, wall ns."""

    python_us: float
    wall_ns: int
    round_trip_us: float

    def offset_us(self, base_ns: int) -> float:
        """Add to a Python-tracer ``ts`` to get torch's ``ts`` (µs after ``base_ns``)."""
        return (self.wall_ns - base_ns) / 1000.0 - self.python_us

    @property
    def uncertainty_us(self) -> float:
        return self.round_trip_us / 2.0


MARKER_ROUNDS = 16  # marker ranges recorded per window edge


@dataclass(frozen=True)
class MarkerPair:
    """A torch range recorded between two reads of the Python clock: the offset to torch's own trace
    timeline lies in ``[torch_end - after, torch_start - before]`` (the estimate its midpoint)."""

    before_us: float
    after_us: float
    torch_start_us: float  # the range in the trace (µs after baseTimeNanoseconds)
    torch_end_us: float

    @property
    def python_us(self) -> float:
        return (self.before_us + self.after_us) / 2.0

    @property
    def round_trip_us(self) -> float:
        return max((self.after_us - self.before_us) - (self.torch_end_us - self.torch_start_us), 0.0)

    def offset_us(self, base_ns: int) -> float:
        return ((self.torch_start_us - self.before_us) + (self.torch_end_us - self.after_us)) / 2.0

    @property
    def uncertainty_us(self) -> float:
        return self.round_trip_us / 2.0


def best_marker_pair(
    samples: list[tuple[str, float, float]], torch_spans: dict[str, tuple[float, float]]
) -> MarkerPair | None:
    """The tightest bracket among the markers torch recorded (None if it recorded none)."""
    best: MarkerPair | None = None
    for name, before, after in samples:
        if name in torch_spans:
            pair = MarkerPair(before, after, *torch_spans[name])
            if best is None or pair.round_trip_us < best.round_trip_us:
                best = pair
    return best


@dataclass(frozen=True)
class Calibration:
    """Offsets measured at a window's start and end, mapped onto one torch trace's base time."""

    start: ClockPair | MarkerPair
    end: ClockPair | MarkerPair
    base_ns: int
    method: str = "min-round-trip clock pairs at window start and end, linear interpolation"
    import_base_ns: int | None = None  # VizTracer's own wall anchor, kept as a cross-check
    wall: tuple[ClockPair, ClockPair] | None = None  # wall-clock pairs, kept as a cross-check

    @property
    def offset_us(self) -> float:
        return self.start.offset_us(self.base_ns)

    @property
    def drift_us(self) -> float:
        return self.end.offset_us(self.base_ns) - self.start.offset_us(self.base_ns)

    @property
    def uncertainty_us(self) -> float:
        return max(self.start.uncertainty_us, self.end.uncertainty_us)

    def python_to_torch_us(self, python_us: float) -> float:
        """A Python-tracer timestamp on torch's timeline, the drift interpolated."""
        span = self.end.python_us - self.start.python_us
        offset = self.offset_us
        if span > 0:
            fraction = min(max((python_us - self.start.python_us) / span, 0.0), 1.0)
            offset += self.drift_us * fraction
        return python_us + offset

    def metadata(self) -> dict[str, object]:
        out: dict[str, object] = {
            "offset_us": round(self.offset_us, 3),
            "uncertainty_us": round(self.uncertainty_us, 3),
            "drift_us": round(self.drift_us, 3),
            "method": self.method,
            "start_round_trip_us": round(self.start.round_trip_us, 3),
            "end_round_trip_us": round(self.end.round_trip_us, 3),
        }
        if self.wall is not None:  # a wall-clock calibration's error (torch's tick-to-wall conversion)
            out["wall_clock_error_us"] = round(self.wall[0].offset_us(self.base_ns) - self.offset_us, 3)
        if self.import_base_ns is not None:  # VizTracer's import-time anchor's error
            import_offset = (self.import_base_ns - self.base_ns) / 1000.0
            out["import_anchor_error_us"] = round(import_offset - self.offset_us, 3)
        return out
