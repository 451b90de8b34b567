"""The ranks' clock offsets (analysis/offsets.py): NTP-style estimate from ping-pong samples with
synthetic skew and jitter, no GPU and no second host; and the check against collective exits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning.analysis.offsets import (
    Sample,
    collective_residuals,
    estimate_offset,
    rank_offsets,
    round_trip_ns,
    sample_offset_ns,
)

MS = 1_000_000  # ns


def ping_pongs(
    skew_ns: int, rounds: int, rng: random.Random, base_delay_ns: int = 50_000, jitter_ns: int = 5 * MS
) -> list[Sample]:
    """Samples of a peer whose clock runs ``skew_ns`` ahead of rank 0's: each one-way delay is a
    base plus random queueing (independent each way, up to ``jitter_ns``), the peer's turnaround random too."""
    samples = []
    now = 1_795_000_000 * 1_000_000_000  # wall-clock ns, as time.time_ns() reads it
    for _ in range(rounds):
        now += rng.randrange(1, 10 * MS)
        t0 = now
        there = base_delay_ns + int(rng.expovariate(1.0) * jitter_ns / 4) % jitter_ns
        back = base_delay_ns + int(rng.expovariate(1.0) * jitter_ns / 4) % jitter_ns
        turnaround = rng.randrange(1_000, 200_000)
        t1 = t0 + there + skew_ns
        t2 = t1 + turnaround
        t3 = t0 + there + turnaround + back
        samples.append((t0, t1, t2, t3))
        now = t3
    return samples


def test_a_20_ms_skew_with_jitter_is_recovered_within_1_ms() -> None:
    rng = random.Random(7)
    samples = ping_pongs(20 * MS, rounds=8, rng=rng)
    estimate = estimate_offset(1, samples, same_host=False)
    assert estimate is not None
    assert estimate.offset_us == pytest.approx(20_000.0, abs=1_000.0)
    # The bound is honest: the true offset lies within it.
    assert abs(estimate.offset_us - 20_000.0) <= estimate.uncertainty_us + 1e-6
    # Taking any single sample (not the tightest) can be far off: that is why the minimum round trip is kept.
    worst = max(abs(sample_offset_ns(s) / 1000 - 20_000.0) for s in samples)
    assert worst > abs(estimate.offset_us - 20_000.0)


def test_negative_skew_and_several_ranks() -> None:
    rng = random.Random(3)
    skews = {1: 20 * MS, 2: -7 * MS, 3: 0}
    samples = {rank: ping_pongs(skew, 8, rng) for rank, skew in skews.items()}
    offsets, unknown = rank_offsets(samples, {1: False, 2: False, 3: False}, world_size=4)
    assert unknown == []
    assert offsets[0].offset_us == 0.0
    for rank, skew in skews.items():
        assert offsets[rank].offset_us == pytest.approx(skew / 1000, abs=1_000.0)


def test_on_one_host_the_offset_is_zero_with_the_measured_bound() -> None:
    """Same clock: report 0 (never a per-file minimum), with the half round trip as the bound."""
    samples = ping_pongs(0, 8, random.Random(1))
    estimate = estimate_offset(1, samples, same_host=True)
    assert estimate is not None and estimate.offset_us == 0.0 and estimate.same_host
    best = min(samples, key=round_trip_ns)
    assert estimate.uncertainty_us == pytest.approx(round_trip_ns(best) / 2000)
    assert estimate.measured_us == pytest.approx(sample_offset_ns(best) / 1000)


def test_ranks_without_samples() -> None:
    offsets, unknown = rank_offsets({}, {1: True, 2: False}, world_size=3)
    assert offsets[1].offset_us == 0.0 and offsets[1].samples == 0  # same host: the shared clock
    assert unknown == [2] and 2 not in offsets  # another host: nothing to go on
    # A sample whose reply came back before it was sent (a clock step mid-exchange) is unusable.
    assert estimate_offset(1, [(10, 5, 6, 9)], same_host=False) is None


@settings(max_examples=200, deadline=None)
@given(
    skew_ms=st.floats(min_value=-500, max_value=500, allow_nan=False),
    seed=st.integers(0, 10_000),
    rounds=st.integers(1, 16),
)
def test_the_true_offset_is_always_within_the_reported_bound(skew_ms: float, seed: int, rounds: int) -> None:
    skew_ns = int(skew_ms * MS)
    estimate = estimate_offset(1, ping_pongs(skew_ns, rounds, random.Random(seed)), same_host=False)
    assert estimate is not None
    assert abs(estimate.offset_us - skew_ns / 1000) <= estimate.uncertainty_us + 1e-3


def test_collective_exits_line_up_after_alignment() -> None:
    """Rank 1's clock is 20 ms ahead: its raw exits are 20 ms late, aligned they match within jitter."""
    rng = random.Random(5)
    true_exits = [1_000.0 * k for k in range(1, 11)]
    exits = {
        0: [("gloo:all_reduce", t + rng.uniform(0, 30)) for t in true_exits],
        1: [("gloo:all_reduce", t + 20_000 + rng.uniform(0, 30)) for t in true_exits],
    }
    raw = collective_residuals(exits, {})
    aligned = collective_residuals(exits, {0: 0.0, 1: 20_000.0})
    assert raw.collectives == aligned.collectives == 10
    assert raw.max_residual_us is not None and raw.max_residual_us > 19_900
    assert aligned.max_residual_us is not None and aligned.max_residual_us <= 30.0
    assert aligned.worst is not None and aligned.worst.startswith("gloo:all_reduce #")


def test_collectives_missing_on_a_rank_are_skipped() -> None:
    exits = {0: [("gloo:barrier", 10.0), ("gloo:all_reduce", 20.0)], 1: [("gloo:barrier", 11.0)]}
    check = collective_residuals(exits, {})
    assert check.collectives == 1 and check.max_residual_us == pytest.approx(1.0)
    assert collective_residuals({0: exits[0]}, {}).max_residual_us is None


def test_a_failed_clock_exchange_costs_one_warning_and_later_windows_skip_it(monkeypatch) -> None:
    """recording/clock_sync.py: the exchange raising (gloo's timeout) leaves the window going on,
    with the reason handed to the writer; the next window of the run does not try again."""
    from vt_lightning.recording import clock_sync

    calls = []

    def broken(group, rank, world_size, rounds=clock_sync.ROUNDS):
        calls.append(rank)
        raise RuntimeError("Timed out waiting 10000ms for recv operation to complete")

    monkeypatch.setattr(clock_sync, "exchange", broken)
    monkeypatch.setattr(clock_sync, "_GROUP", {"group": object(), "world": None, "failed": False})
    first = clock_sync.ClockSync(object(), rank=0, world_size=2, job_wait_s=30.0)
    with pytest.warns(UserWarning, match="clock exchange failed"):
        first.start()
    first.stop()
    data = first.collect()
    assert data["samples"] == {} and "Timed out" in data["error"] and data["world_size"] == 2
    second = clock_sync.ClockSync(object(), rank=0, world_size=2, job_wait_s=30.0)
    second.start()  # no second warning, no second wait
    assert calls == [0] and "earlier in this run" in second.collect()["error"]
    assert clock_sync.ClockSync(object(), rank=1, world_size=2, job_wait_s=30.0).collect() is None
