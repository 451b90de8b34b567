"""Triggers and the window plan without a Trainer (issue 14): pure rules, fake clocks, fake collectives."""

from __future__ import annotations

import itertools
import os
import random
import signal

import pytest
from conftest import MS, VirtualClock
from hypothesis import given, settings
from hypothesis import strategies as st

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.schedule import Schedule
from vt_lightning.analysis.sources import WindowPlan
from vt_lightning.analysis.triggers import (
    MEMORY_GROWTH,
    SIGNAL,
    SLOW_STEP,
    TRIGGER_FILE,
    Cadence,
    Firing,
    MemoryGrowth,
    SlowStep,
    TriggerConfig,
)
from vt_lightning.controller.agreement import Agreement, decode, encode
from vt_lightning.recording.probes import SignalTrigger, TriggerFile


def run_steps(detector: SlowStep, clock: VirtualClock, durations_ms: list[float]) -> list[int]:
    """Feed step durations; return the batches whose batch-start saw a slow step (the step before)."""
    fired = []
    detector.steady()  # the first batch start: starts the clock
    for batch, ms in enumerate(durations_ms, start=1):
        clock.ns += int(ms * MS)
        if not detector.steady():
            fired.append(detector.take(batch).batch)
        if batch % 10 == 0:
            detector.refresh()  # the coarse checks
    return fired


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(slow_step_factor=1.0), "slow_step_factor"),
        (dict(slow_step_factor=0.5), "slow_step_factor"),
        (dict(slow_step_factor=float("nan")), "slow_step_factor"),
        (dict(slow_step_factor=True), "slow_step_factor"),
        (dict(slow_step_baseline=2), "slow_step_baseline"),
        (dict(memory_growth=0), "memory_growth"),
        (dict(memory_growth=-0.1), "memory_growth"),
        (dict(memory_growth_steps=0), "memory_growth_steps"),
        (dict(trigger_cooldown=-1), "trigger_cooldown"),
        (dict(trigger_signal="SIGNOPE"), "trigger_signal"),
        (dict(trigger_signal="USR1"), "trigger_signal"),
        (dict(trigger_signal="SIGKILL"), "trigger_signal"),
        (dict(budget_windows=0), "budget_windows"),
        (dict(trigger_interval=-1.0), "trigger_interval"),
        (dict(trigger_file="yes"), "trigger_file"),
        (dict(scheduled_windows=None), "scheduled_windows"),
        (dict(scheduled_windows=False, trigger_file=False), "scheduled_windows"),
    ],
)
def test_bad_trigger_options_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        VizTraceCallback(**kwargs)


def test_a_signal_with_a_handler_already_is_refused():
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: None)
    try:
        with pytest.raises(ValueError, match=r"`trigger_signal`.*already has a handler"):
            VizTraceCallback(trigger_signal="SIGUSR2")
    finally:
        signal.signal(signal.SIGUSR2, previous)
    VizTraceCallback(trigger_signal="SIGUSR2")  # default handler again: accepted


def test_good_trigger_options_are_accepted():
    config = TriggerConfig(
        slow_step_factor=1.5,
        memory_growth=0.1,
        trigger_signal="SIGUSR1",
        trigger_cooldown=0,
        max_windows=1,
        trigger_interval=0,
    )
    assert config.armed
    assert not TriggerConfig(trigger_file=False).armed


# ----------------------------------------------------------------------------- slow step
def test_slow_step_fires_on_a_40x_step_and_names_it():
    clock = VirtualClock()
    detector = SlowStep(3.0, 20, clock)
    durations = [10.0] * 39 + [400.0] + [10.0] * 20  # batch 40 (1-based index 40 -> step 39) is slow
    fired = run_steps(detector, clock, durations)
    assert fired == [39]
    assert detector.armed and detector.baseline_ns == 10 * MS


def test_slow_step_is_not_armed_until_the_baseline_is_full():
    clock = VirtualClock()
    detector = SlowStep(3.0, 50, clock)
    # compilation-like first steps, then cold caches: nothing may fire before 50 steps are measured
    durations = [5000.0, 800.0] + [30.0] * 20 + [10.0] * 20
    assert run_steps(detector, clock, durations) == []
    assert not detector.armed


def test_slow_step_ignores_intervals_that_are_not_steps():
    clock = VirtualClock()
    detector = SlowStep(3.0, 10, clock)
    run_steps(detector, clock, [10.0] * 30)
    assert detector.armed
    detector.skip_next()  # e.g. validation ran between these two batch starts
    clock.ns += 5000 * MS
    assert detector.steady() and detector.fired is None
    clock.ns += 10 * MS
    assert detector.steady()


def test_noisy_steady_steps_never_fire():
    rng = random.Random(1234)
    durations = [rng.uniform(5.0, 20.0) * (1.5 if rng.random() < 0.05 else 1.0) for _ in range(1000)]
    clock = VirtualClock()
    detector = SlowStep(3.0, 50, clock)
    assert run_steps(detector, clock, durations) == []
    assert detector.armed  # it was armed all along: the test could have failed


def test_a_job_that_stays_slow_stops_firing():
    clock = VirtualClock()
    detector = SlowStep(3.0, 20, clock)
    fired = run_steps(detector, clock, [10.0] * 40 + [100.0] * 60)
    assert fired and fired[0] == 40 and max(fired) < 40 + 20  # once slow steps are the majority: quiet


# ----------------------------------------------------------------------------- memory growth
def test_memory_growth_fires_over_the_set_number_of_steps():
    growth = MemoryGrowth(0.2, steps=10)
    assert growth.observe(5, 100) is None  # nothing is sampled in the first `steps` batches ...
    assert growth.observe(9, 10_000) is None  # ... (optimizer state, caches): not even a reference
    assert growth.observe(10, 100) is None
    assert growth.observe(15, 150) is None  # +50%, but over 5 batches only
    assert growth.observe(20, 119) is None  # +19% over 10 batches
    assert growth.observe(25, 121) is None  # reference is now batch 15 (the newest >= 10 batches old)
    firing = growth.observe(30, 150)  # reference batch 20: 119 -> 150 is +26%
    assert firing == Firing(MEMORY_GROWTH, 30, 150.0, 119.0, "bytes")
    assert growth.observe(40, 170) is None  # the history restarted at 150: +13%
    assert growth.observe(50, 210).baseline == 170.0


def test_memory_growth_is_measured_over_at_least_the_window():
    growth = MemoryGrowth(0.5, steps=10)
    for batch, value in [(10, 100), (12, 100), (14, 100), (19, 160)]:
        assert growth.observe(batch, value) is None  # 19 - 10 < 10: too early to compare
    firing = growth.observe(22, 160)  # reference: newest sample >= 10 batches old = batch 12 (100)
    assert firing is not None and firing.baseline == 100.0 and firing.value == 160.0


# ----------------------------------------------------------------------------- cadence
def test_cadence_targets_the_interval_and_ramps_up():
    cadence = Cadence(0.5)
    batch, now, gaps = 0, 0, []
    for _ in range(10):
        gap = cadence.next_gap(batch, now)
        gaps.append(gap)
        batch += gap
        now += gap * 10 * MS  # 10 ms steps: 50 batches per 0.5 s
    assert gaps == [1, 2, 4, 8, 16, 32, 50, 50, 50, 50]
    assert Cadence(0.0).next_gap(5, 0) == 1 and Cadence(0.0).next_gap(6, 10) == 1
    slow = Cadence(0.5)
    slow.next_gap(0, 0)
    assert slow.next_gap(1, 2_000 * MS) == 1  # 2 s steps: every batch


# ----------------------------------------------------------------------------- the window plan
def windows(plan: WindowPlan, until: int, step: int = 0) -> list[tuple[int, int, int, str | None]]:
    """Walk batches like the callback: (number, warmup_start, end, reason) of every begun window."""
    out = []
    while step < until:
        planned = plan.next_window(step)
        if planned is None:
            break
        if step < planned.window.warmup_start:
            step = planned.window.warmup_start
            continue
        plan.begin(planned)
        out.append((planned.number, planned.window.warmup_start, planned.window.end, planned.reason))
        step = planned.window.end
    return out


def test_plan_without_triggers_is_the_schedule():
    schedule = Schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=3)
    plan = WindowPlan(schedule)
    assert windows(plan, 100) == [(w.index, w.warmup_start, w.end, None) for w in schedule.windows_until(100)]


def test_triggered_window_starts_at_the_batch_and_displaces_overlapping_scheduled_windows():
    schedule = Schedule(skip_first=0, wait=4, warmup=1, active=2, repeat=3)  # windows at 4-6, 11-13, 18-20
    plan = WindowPlan(schedule, cooldown=0)
    assert windows(plan, 8) == [(0, 4, 7, None)]
    planned, why = plan.request(Firing(SLOW_STEP, 9, 1.0, 0.1, "s"), start=10, warmup=1, active=2)
    assert why == "" and (planned.window.warmup_start, planned.window.active_start, planned.window.end) == (10, 11, 13)
    assert planned.number == 1
    # the scheduled window at 11-13 overlaps: it gives way; the one at 18 follows as number 2 + 1
    assert windows(plan, 100, step=8) == [(1, 10, 13, SLOW_STEP), (3, 18, 21, None)]


def test_plan_refuses_busy_cooldown_and_max_windows_but_on_demand_skips_the_cooldown():
    plan = WindowPlan(Schedule(), scheduled=False, max_windows=3, cooldown=50)
    slow = Firing(SLOW_STEP, 9, 1.0, 0.1, "s")
    first, _ = plan.request(slow, 10, 1, 3)
    assert first is not None
    assert plan.request(slow, 11, 1, 3) == (None, "busy")  # accepted, not yet begun
    plan.begin(first)
    assert plan.request(slow, 12, 1, 3) == (None, "busy")  # recording
    assert plan.request(slow, 20, 1, 3) == (None, "cooldown")  # 14 + 50 > 20
    on_demand, why = plan.request(Firing(TRIGGER_FILE, 20), 20, 1, 3)
    assert why == "" and on_demand.number == 1
    plan.begin(on_demand)
    third, _ = plan.request(slow, 100, 1, 3)
    plan.begin(third)
    assert plan.request(Firing(SIGNAL, 200), 200, 1, 3) == (None, "max_windows")
    assert plan.next_window(300) is None


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 200), st.sampled_from([SLOW_STEP, TRIGGER_FILE])), max_size=12),
    max_windows=st.one_of(st.none(), st.integers(1, 6)),
    cooldown=st.integers(0, 30),
)
def test_planned_windows_never_overlap_and_numbers_grow(requests, max_windows, cooldown):
    plan = WindowPlan(
        Schedule(skip_first=3, wait=7, warmup=1, active=2, repeat=0), max_windows=max_windows, cooldown=cooldown
    )
    asks = dict(sorted(requests))
    begun: list[tuple[int, int, int]] = []
    for step in range(260):
        if step in asks:
            plan.request(Firing(asks[step], step), step, 1, 2)
        planned = plan.next_window(step)
        if planned is not None and planned.window.warmup_start == step:
            plan.begin(planned)
            begun.append((planned.number, planned.window.warmup_start, planned.window.end))
    for (n1, _, end1), (n2, start2, _) in itertools.pairwise(begun):
        assert end1 <= start2 and n1 < n2
    if max_windows is not None:
        assert len(begun) <= max_windows


# ----------------------------------------------------------------------------- DDP agreement
def fake_group(others: list[list[int]], other_numbers: list[list[float]]):
    """Collectives of a job where the other ranks contributed ``others`` (MAX) / ``other_numbers`` (SUM)."""

    def reduce_max(values):
        return [max([v, *(o[i] for o in others)]) for i, v in enumerate(values)]

    def reduce_sum(values):
        return [v + sum(o[i] for o in other_numbers) for i, v in enumerate(values)]

    return reduce_max, reduce_sum


def test_encoding_picks_the_earliest_batch_then_the_lowest_rank():
    a = encode([Firing(SLOW_STEP, 30, 1.0, 0.1, "s")], gap=8, rank=3)
    b = encode([Firing(SLOW_STEP, 31, 2.0, 0.1, "s")], gap=4, rank=1)
    c = encode([Firing(SLOW_STEP, 30, 3.0, 0.1, "s")], gap=16, rank=5)
    reduced = [max(x) for x in zip(a, b, c, strict=True)]
    assert decode(reduced) == ((SLOW_STEP, 30, 3), 4)
    assert decode([max(x) for x in zip(encode([], 8, 0), encode([], 2, 1), strict=True)]) == (None, 2)


def test_on_demand_wins_over_measured_triggers_at_the_same_check():
    mine = encode([Firing(SLOW_STEP, 10, 1.0, 0.1, "s")], 4, 0)
    theirs = encode([Firing(TRIGGER_FILE, 12)], 4, 1)
    assert decode([max(x) for x in zip(mine, theirs, strict=True)])[0] == (TRIGGER_FILE, 12, 1)


def test_a_rank_that_did_not_fire_gets_the_winners_numbers():
    winner = Firing(SLOW_STEP, 30, 0.4, 0.01, "s")
    reduce_max, reduce_sum = fake_group([encode([winner], 8, 1)], [[1.0, 0.4, 0.01]])
    agreement = Agreement(0, reduce_max, reduce_sum)
    firing, gap = agreement.agree([], 16)
    assert firing == Firing(SLOW_STEP, 30, 0.4, 0.01, "s", rank=1) and gap == 8
    # and the winner keeps its own (identical) record
    reduce_max, reduce_sum = fake_group([encode([], 8, 0)], [[0.0, 0.0, 0.0]])
    assert Agreement(1, reduce_max, reduce_sum).agree([winner], 16)[0] == Firing(SLOW_STEP, 30, 0.4, 0.01, "s", rank=1)


def test_one_process_agrees_with_itself_by_priority():
    firing, gap = Agreement(0).agree([Firing(SLOW_STEP, 3, 1.0, 0.1, "s"), Firing(SIGNAL, 4, detail="SIGUSR1")], 7)
    assert firing.reason == SIGNAL and firing.rank == 0 and gap == 7


# ----------------------------------------------------------------------------- probes
def test_trigger_file_is_consumed(tmp_path):
    problems = []
    probe = TriggerFile(tmp_path / "vt_lightning.trigger", lambda key, message: problems.append(message))
    assert not probe.seen()
    probe.path.touch()
    assert probe.seen() and not probe.path.exists()
    assert not probe.seen() and problems == []


def test_trigger_file_that_cannot_be_deleted_fires_once_and_warns_once(tmp_path, monkeypatch):
    problems = []
    probe = TriggerFile(tmp_path / "vt_lightning.trigger", lambda key, message: problems.append(message))
    probe.path.write_text("x")

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "unlink", refuse)  # as in a read-only directory (root ignores chmod)
    assert probe.seen()
    assert [probe.seen() for _ in range(5)] == [False] * 5
    assert len(problems) == 1 and "could not delete" in problems[0]
    probe.path.write_text("again, longer")  # a new request (the file changed): seen once more
    assert probe.seen() and not probe.seen()


def test_signal_trigger_sets_a_flag_and_restores_the_handler():
    trigger = SignalTrigger(signal.SIGUSR2)
    assert trigger.install() is None
    assert signal.getsignal(signal.SIGUSR2) == trigger._handle
    os.kill(os.getpid(), signal.SIGUSR2)
    assert trigger.take() and not trigger.take()
    trigger.restore()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_trigger_options_come_through_the_environment_switch():
    from vt_lightning.cli.lightning import callbacks_from_env

    env = {
        "VT_LIGHTNING": "1",
        "VT_LIGHTNING_SLOW_STEP_FACTOR": "3",
        "VT_LIGHTNING_MEMORY_GROWTH": "0.2",
        "VT_LIGHTNING_TRIGGER_SIGNAL": "SIGUSR1",
        "VT_LIGHTNING_BUDGET_WINDOWS": "4",
        "VT_LIGHTNING_SCHEDULED_WINDOWS": "false",
        "VT_LIGHTNING_TRIGGER_INTERVAL": "0",
    }
    (cb,) = callbacks_from_env(env)
    assert cb.options.triggers == TriggerConfig(
        slow_step_factor=3.0, memory_growth=0.2, trigger_signal="SIGUSR1", max_windows=4, trigger_interval=0.0
    )
    assert cb.options.scheduled_windows is False
    with pytest.raises(ValueError, match=r"VT_LIGHTNING_SLOW_STEP_FACTOR.*`slow_step_factor`"):
        callbacks_from_env({"VT_LIGHTNING": "1", "VT_LIGHTNING_SLOW_STEP_FACTOR": "0.5"})
