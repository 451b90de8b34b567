"""Clock offsets between ranks, NTP style (the tightest ping-pong sample), and their check against the
window's collectives. On one host the offset is 0, never a per-file minimum (a late rank would look
early)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Sample = tuple[int, int, int, int]  # (t0, t1, t2, t3) ns: rank 0 sends, peer receives, peer replies, rank 0 receives


def round_trip_ns(sample: Sample) -> int:
    """Time on the wire and in the stacks, the peer's own turnaround excluded."""
    t0, t1, t2, t3 = sample
    return (t3 - t0) - (t2 - t1)


def sample_offset_ns(sample: Sample) -> float:
    """How far the peer's clock is ahead of rank 0's, from one sample."""
    t0, t1, t2, t3 = sample
    return ((t1 - t0) + (t2 - t3)) / 2.0


@dataclass(frozen=True)
class Offset:
    """One rank's clock relative to rank 0's: subtract ``offset_us`` from its timestamps."""

    rank: int
    offset_us: float  # this rank's clock minus rank 0's
    uncertainty_us: float  # half the best round trip: the true offset is within ±this
    samples: int
    same_host: bool
    measured_us: float | None = None  # what the ping-pong said (on one host: only a check of 0)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "rank": self.rank,
            "offset_us": round(self.offset_us, 3),
            "uncertainty_us": round(self.uncertainty_us, 3),
            "samples": self.samples,
            "same_host": self.same_host,
        }
        if self.measured_us is not None:
            out["measured_us"] = round(self.measured_us, 3)
        return out


def estimate_offset(rank: int, samples: Sequence[Sample], same_host: bool) -> Offset | None:
    """The estimate from the tightest sample (0 on one host, only bounded); None without one."""
    best = min((s for s in samples if round_trip_ns(s) >= 0), key=round_trip_ns, default=None)
    if best is None:
        return None
    measured = sample_offset_ns(best) / 1000.0
    bound = round_trip_ns(best) / 2000.0
    if same_host:
        return Offset(rank, 0.0, bound, len(samples), True, measured)
    return Offset(rank, measured, bound, len(samples), False, measured)


def rank_offsets(
    samples: Mapping[int, Sequence[Sample]], same_host: Mapping[int, bool], world_size: int
) -> tuple[dict[int, Offset], list[int]]:
    """Every rank's offset (rank 0: 0; a rank on its host without an estimate: 0) and the unknown ones."""
    offsets: dict[int, Offset] = {0: Offset(0, 0.0, 0.0, 0, True)}
    unknown: list[int] = []
    for rank in range(1, world_size):
        local = bool(same_host.get(rank, False))
        estimate = estimate_offset(rank, samples.get(rank, ()), local)
        if estimate is None:
            if local:
                estimate = Offset(rank, 0.0, 0.0, 0, True)
            else:
                unknown.append(rank)
                continue
        offsets[rank] = estimate
    return offsets, unknown


@dataclass(frozen=True)
class CollectiveCheck:
    """How far apart the ranks still leave the same collective after alignment."""

    collectives: int  # collectives found on every rank
    max_residual_us: float | None
    median_residual_us: float | None
    worst: str | None = None  # "<name> #<k>" of the worst one

    def as_dict(self) -> dict[str, object]:
        return {
            "collectives": self.collectives,
            "max_residual_us": None if self.max_residual_us is None else round(self.max_residual_us, 3),
            "median_residual_us": None if self.median_residual_us is None else round(self.median_residual_us, 3),
            "worst": self.worst,
        }


def collective_residuals(
    exits: Mapping[int, Sequence[tuple[str, float]]], offsets_us: Mapping[int, float]
) -> CollectiveCheck:
    """How far apart the ranks still leave each collective (the k-th of a name, matched across ranks)
    once aligned: they leave together, so the spread is the offsets' error plus the exit skew."""
    keyed: dict[int, dict[tuple[str, int], float]] = {}
    for rank, events in exits.items():
        seen: dict[str, int] = {}
        mine: dict[tuple[str, int], float] = {}
        for name, end in sorted(events, key=lambda e: e[1]):
            k = seen.get(name, 0)
            seen[name] = k + 1
            mine[(name, k)] = end - offsets_us.get(rank, 0.0)
        keyed[rank] = mine
    if len(keyed) < 2:
        return CollectiveCheck(0, None, None)
    common = set.intersection(*(set(m) for m in keyed.values()))
    residuals = {key: max(m[key] for m in keyed.values()) - min(m[key] for m in keyed.values()) for key in common}
    if not residuals:
        return CollectiveCheck(0, None, None)
    worst = max(residuals, key=lambda k: residuals[k])
    return CollectiveCheck(
        len(residuals),
        residuals[worst],
        statistics.median(residuals.values()),
        f"{worst[0]} #{worst[1]}",
    )
