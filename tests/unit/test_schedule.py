"""The schedule is torch.profiler.schedule's, batch for batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerAction
from torch.profiler import schedule as torch_schedule

from vt_lightning.analysis.schedule import Phase, Schedule

counts = st.integers(min_value=0, max_value=6)


@settings(max_examples=300, deadline=None)
@given(skip_first=counts, wait=counts, warmup=counts, active=st.integers(1, 6), repeat=st.integers(0, 4))
def test_phases_match_torch_profiler_schedule(skip_first, wait, warmup, active, repeat):
    ours = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when warmup == 0
        theirs = torch_schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    for step in range(skip_first + (wait + warmup + active) * (repeat + 2)):
        action = theirs(step)
        phase = ours.phase(step)
        expected = {
            ProfilerAction.NONE: Phase.NONE,
            ProfilerAction.WARMUP: Phase.WARMUP,
            ProfilerAction.RECORD: Phase.ACTIVE,
            ProfilerAction.RECORD_AND_SAVE: Phase.ACTIVE,
        }[action]
        assert phase is expected, (step, action, phase)


@settings(max_examples=200, deadline=None)
@given(
    skip_first=counts,
    wait=counts,
    warmup=counts,
    active=st.integers(1, 6),
    repeat=st.integers(0, 4),
    step=st.integers(0, 200),
)
def test_next_window_is_the_first_not_yet_ended(skip_first, wait, warmup, active, repeat, step):
    s = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    nxt = s.next_window(step)
    windows = s.windows_until(step + s.skip_first + 3 * s.cycle)
    not_ended = [w for w in windows if w.end > step]
    if nxt is None:
        assert not not_ended
    else:
        assert nxt == not_ended[0]
        for inner in range(nxt.warmup_start, nxt.end):
            assert s.phase(inner) is not Phase.NONE
        assert [s.phase(i) for i in nxt.active_steps] == [Phase.ACTIVE] * active


def test_windows_until_counts_repeats():
    s = Schedule(skip_first=2, wait=1, warmup=1, active=3, repeat=2)
    assert [(w.warmup_start, w.active_start, w.end) for w in s.windows_until(100)] == [(3, 4, 7), (8, 9, 12)]
    assert len(Schedule(wait=0, warmup=0, active=1, repeat=0).windows_until(10)) == 10


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"active": 0}, "active"),
        ({"wait": -1}, "wait"),
        ({"warmup": -2}, "warmup"),
        ({"skip_first": -1}, "skip_first"),
        ({"repeat": -1}, "repeat"),
        ({"active": 1.5}, "active"),
        ({"wait": True}, "wait"),
    ],
)
def test_bad_counts_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        Schedule(**kwargs)
