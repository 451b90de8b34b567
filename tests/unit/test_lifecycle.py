"""The window lifecycle table and the one-way hand-off, without a Trainer.

The controller runs exactly what ``analysis.lifecycle.TRANSITIONS`` lists; driving the table here
over a schedule must give the sequence of actions a window needs: open at its warmup, one step per
active batch, close right after its last one. The inbox must deliver exactly one answer per
hand-off, whatever happened to the writer.
"""

from __future__ import annotations

import dataclasses
import itertools
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vt_lightning.analysis.clock import ClockPair
from vt_lightning.analysis.lifecycle import TRANSITIONS, Action, Boundary, actions, phase_in
from vt_lightning.analysis.schedule import Phase, Schedule
from vt_lightning.controller import handoff
from vt_lightning.controller.handoff import PRESTART_LEAD_BATCHES, BackgroundWriter
from vt_lightning.controller.inbox import Dropped, Inbox, Notice, Outcomes
from vt_lightning.controller.run import Run, fit_end_batch, main_command_functions, trains_on_cpu
from vt_lightning.export.job import WindowJob, WindowResult


def drive(schedule: Schedule, steps: int) -> list[tuple[int, str, Action]]:
    """What the controller's table lookups do over ``steps`` batches of one schedule (the plan
    reduced to the schedule's own windows)."""
    done: list[tuple[int, str, Action]] = []
    window = None
    phase = Phase.NONE
    for step in range(steps):
        if window is not None:
            current = phase_in(window, step)
            for action in actions(Boundary.BATCH_START, phase, current):
                done.append((step, "start", action))
            phase = current
            if current is Phase.NONE:
                window = None
        if window is None:
            nxt = schedule.next_window(step)
            if nxt is not None and step >= nxt.warmup_start:
                window, current = nxt, phase_in(nxt, step)
                for action in actions(Boundary.BATCH_START, Phase.NONE, current):
                    done.append((step, "start", action))
                phase = current
        if window is not None:
            after = phase_in(window, step + 1)
            for action in actions(Boundary.BATCH_END, phase, after):
                done.append((step, "end", action))
            if after is Phase.NONE:
                window, phase = None, Phase.NONE
    return done


def test_a_window_opens_at_warmup_records_each_active_batch_and_closes_after_the_last():
    done = drive(Schedule(skip_first=1, wait=1, warmup=2, active=3, repeat=1), 12)
    assert done == [
        (2, "start", Action.OPEN),
        (4, "start", Action.BEGIN_STEP),
        (4, "end", Action.END_STEP),
        (5, "start", Action.BEGIN_STEP),
        (5, "end", Action.END_STEP),
        (6, "start", Action.BEGIN_STEP),
        (6, "end", Action.END_STEP),
        (6, "end", Action.CLOSE),
    ]


@given(
    skip_first=st.integers(0, 3),
    wait=st.integers(0, 3),
    warmup=st.integers(0, 3),
    active=st.integers(1, 4),
    repeat=st.integers(0, 3),
)
def test_every_window_of_any_schedule_is_opened_recorded_and_closed_once(skip_first, wait, warmup, active, repeat):
    schedule = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    steps = 40
    done = drive(schedule, steps)
    opened = [step for step, _, action in done if action is Action.OPEN]
    closed = [step for step, _, action in done if action is Action.CLOSE]
    recorded = [step for step, where, action in done if action is Action.BEGIN_STEP]
    expected = [w for w in schedule.windows_until(steps) if w.end <= steps]
    assert opened[: len(expected)] == [w.warmup_start for w in expected]
    assert closed == [w.last_step for w in expected]
    assert recorded == [s for s in range(steps) if schedule.phase(s) is Phase.ACTIVE]


def test_phase_in_a_window_matches_the_schedule():
    schedule = Schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
    for step in range(20):
        index = schedule.window_index(step)
        expected = schedule.phase(step)
        if index is None:
            assert expected is Phase.NONE
        else:
            assert phase_in(schedule.window(index), step) is expected


def test_the_table_names_no_transition_the_phases_cannot_make():
    # A window never goes back to warmup, and nothing happens before a window opens.
    assert all(not (prev is Phase.ACTIVE and cur is Phase.WARMUP) for (_, prev, cur) in TRANSITIONS)
    for boundary, prev, cur in itertools.product(Boundary, Phase, Phase):
        if (boundary, prev, cur) not in TRANSITIONS:
            with pytest.raises(KeyError):
                actions(boundary, prev, cur)


# ---------------------------------------------------------------- the one-way hand-off


def _result(name: str = "w.pt.trace.json.gz", **changes) -> WindowResult:
    base = WindowResult(Path(name), 10, 100, 5, 5, overflow=False)
    return dataclasses.replace(base, **changes)


def test_a_handed_off_job_cannot_be_changed():
    pair = ClockPair(1.0, 2, 0.1)
    job = WindowJob(Path("run"), "t.pt.trace.json.gz", Path("t.json"), None, pair, pair, None, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.run_dir = Path("elsewhere")  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        _result().notes = ("x",)  # type: ignore[misc]


def test_the_inbox_answers_once_per_hand_off_whatever_the_writer_did():
    inbox = Inbox()
    written, failed, cancelled = Future(), Future(), Future()
    for future in (written, failed, cancelled):
        inbox.expect(future)
    assert inbox.outstanding == 3 and inbox.take_all() == []
    written.set_result(_result())
    failed.set_exception(RuntimeError("abandoned"))
    cancelled.cancel()
    inbox.notice("writer-died", "the writer process stopped")
    answers = inbox.take_all()
    assert inbox.outstanding == 0
    assert answers == [_result(), Dropped(None), Dropped(None), Notice("writer-died", "the writer process stopped")]


def test_outcomes_warn_once_per_kind_and_keep_results_in_order():
    seen: list[tuple[str, str]] = []
    outcomes = Outcomes(lambda key, message: seen.append((key, message)), tracer_entries=1000)
    outcomes.receive(
        [
            _result("a.pt.trace.json.gz", overflow=True, suggested_tracer_entries=5000),
            Dropped(Notice("spool:28", "vt_lightning: window dropped: No space left on device")),
            Dropped(None),
            _result("b.pt.trace.json.gz", summary={"window": {"index": 1}}),
        ]
    )
    assert [r.trace_path.name for r in outcomes.results] == ["a.pt.trace.json.gz", "b.pt.trace.json.gz"]
    assert [key for key, _ in seen] == ["overflow", "spool:28"]
    assert "about 5000" in seen[0][1]
    assert [r.trace_path.name for r in outcomes.unlogged] == ["b.pt.trace.json.gz"]


def _trainer(batch: int = -1, epoch: int = 0, ready: int = 0, **limits: object) -> SimpleNamespace:
    """``batch``: the global batch in progress; ``ready``: the batches of this epoch started."""
    progress = SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(ready=ready)))
    loop = SimpleNamespace(total_batch_idx=batch, epoch_loop=progress)
    return SimpleNamespace(fit_loop=loop, current_epoch=epoch, **limits)


@pytest.mark.parametrize(
    ("limits", "end"),
    [
        (dict(max_steps=40, max_epochs=None), 40),
        (dict(max_steps=40, accumulate_grad_batches=4, max_epochs=-1), 160),  # optimizer steps
        (dict(max_steps=-1, max_epochs=3, num_training_batches=10), 30),
        (dict(max_steps=25, max_epochs=3, num_training_batches=10), 25),  # whichever stops first
        (dict(max_steps=-1, max_epochs=3, num_training_batches=float("inf")), None),  # no length
        (dict(max_steps=-1, max_epochs=-1, num_training_batches=10), None),  # endless (max_time)
        (dict(max_steps=-1, max_epochs=None), None),
    ],
)
def test_fit_end_batch_is_the_batch_count_at_which_the_limits_stop_fit(limits, end):
    assert fit_end_batch(_trainer(**limits)) == end


def test_fit_end_batch_counts_the_remaining_epochs_of_a_resumed_run():
    resumed = _trainer(batch=19, epoch=2, max_steps=-1, max_epochs=5, num_training_batches=10)
    assert fit_end_batch(resumed) == 50


def test_fit_end_batch_mid_epoch_counts_the_epochs_batches_already_run():
    mid_epoch = _trainer(batch=24, epoch=2, ready=5, max_steps=-1, max_epochs=5, num_training_batches=10)
    assert fit_end_batch(mid_epoch) == 50  # the 5th batch of epoch 2 (batches 20-29), then epochs 3 and 4


@pytest.mark.parametrize(
    "first_warmup, run_end, cpu_bound, hand_off_on_cpu, starts",
    [
        (20, 40, False, True, True),  # ahead, within the run, on an accelerator: in the background now
        (20, None, False, True, True),  # the run's length unknown (iterable data, max_time): ahead all the same
        (20, 40, True, True, False),  # training on the CPU: at the first hand-off, inside the window's cost
        (20, 40, True, False, True),  # the CPU rule switched off (short_run.py's vt_ahead): as on an accelerator
        (50, 40, False, True, False),  # past the run: no window, no writer
        (PRESTART_LEAD_BATCHES - 1, 40, False, True, False),  # too close: its start-up would overlap the window
        (float("inf"), None, False, True, False),  # no window planned
    ],
)
def test_the_writer_starts_ahead_only_for_a_window_within_the_run_and_off_the_cpu(
    first_warmup, run_end, cpu_bound, hand_off_on_cpu, starts, monkeypatch
):
    monkeypatch.setattr(handoff, "HAND_OFF_START_ON_CPU", hand_off_on_cpu)
    writer = BackgroundWriter(use_process=False)
    submitted = []
    writer.submit = lambda fn, *args: submitted.append(fn)  # type: ignore[method-assign]
    try:
        writer.prestart(first_warmup, 0, run_end, cpu_bound=cpu_bound)
    finally:
        writer.close()
    assert submitted == ([writer.writer_process] if starts else [])


@pytest.mark.parametrize("device, on_cpu", [("cpu", True), ("cuda", False), ("mps", False), ("xla", False)])
def test_only_a_run_on_the_cpu_counts_as_training_on_the_cpu(device, on_cpu):
    run = Run("fit", Path("."), {}, device == "cuda", device=device)
    assert trains_on_cpu(run) is on_cpu


@pytest.mark.parametrize(
    "argv, orig_argv, found",
    [
        (["-c", "fast"], ["python", "-c", "def f(): pass", "fast"], True),
        (["-c"], ["python", "-X", "dev", "-Ic", "def f(): pass"], True),  # options before, combined flags
        (["train.py", "-c", "x"], ["python", "train.py", "-c", "x"], False),  # the script's own -c
        (["-"], ["python", "-"], False),  # stdin: <stdin> is the user's file already
    ],
)
def test_the_command_of_python_c_is_found_after_its_flag(argv, orig_argv, found, monkeypatch):
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.setattr("sys.orig_argv", orig_argv)
    assert main_command_functions() == (["f (<string>:1)"] if found else [])
