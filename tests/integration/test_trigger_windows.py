"""Triggered windows in a real Lightning Trainer (issue 14).

Step times come from a virtual clock that the model advances (``VizTraceCallback._step_clock`` is
injected): a "slow step" or "noise" is then exact and the tests cannot flake on a loaded machine.
Everything else is real: the Trainer, the hooks, the trigger file on disk, the signal, the RSS,
the files written and their metadata.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import MS, MarkerModel, VirtualClock, load_trace, loader, make_trainer, marker_steps, trace_files

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.triggers import TRIGGER_FILE_NAME


class ClockModel(MarkerModel):
    """Each training batch advances the virtual clock by ``step_ms(batch)``, then runs ``action``."""

    def __init__(
        self,
        clock: VirtualClock,
        step_ms: Callable[[int], float],
        action: Callable[[Any, int], None] | None = None,
        val_ms: float = 0.0,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.step_ms = step_ms
        self.action = action
        self.val_ms = val_ms

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.fit_loop.total_batch_idx
        self.clock.ns += int(self.step_ms(step) * MS)
        if self.action is not None:
            self.action(self, step)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.clock.ns += int(self.val_ms * MS)  # a long validation pass: not a slow training step
        super().validation_step(batch, batch_idx)


def fit(
    tmp_path: Path,
    cb: VizTraceCallback,
    model: ClockModel,
    max_steps: int,
    batches_per_epoch: int = 1000,
    **trainer_kwargs: Any,
):
    cb._controller.step_clock = model.clock
    trainer = make_trainer(tmp_path, [cb], max_steps=max_steps, **trainer_kwargs)
    trainer.fit(model, loader(n=4 * batches_per_epoch))
    return trainer


def run_dirs(root: Path) -> list[str]:
    return sorted(p.parent.name for p in trace_files(root))


def only_trace(root: Path) -> dict[str, Any]:
    files = trace_files(root)
    assert len(files) == 1, [f.parent.name for f in files]
    return load_trace(files[0])


# ----------------------------------------------------------------------------- slow step
def test_a_40x_slow_step_opens_a_window_within_3_batches(tmp_path, caplog):
    clock = VirtualClock()
    model = ClockModel(clock, lambda step: 400.0 if step == 40 else 10.0)
    cb = VizTraceCallback(slow_step_factor=3.0, slow_step_baseline=20, warmup=1, active=2, scheduled_windows=False)
    with caplog.at_level(logging.INFO):
        fit(tmp_path, cb, model, max_steps=60)
    trace = only_trace(tmp_path)
    meta = trace["vt_lightning"]
    assert meta["steps"] == [42, 43]  # warmup at 41 (the batch after the slow one), recorded 42-43
    assert meta["steps"][0] - 40 <= 3
    assert marker_steps(trace) == {42, 43}
    trigger = meta["trigger"]
    assert trigger["reason"] == "slow_step" and trigger["batch"] == 40 and trigger["rank"] == 0
    assert trigger["value"] == pytest.approx(0.4, rel=1e-6) and trigger["baseline"] == pytest.approx(0.01, rel=1e-6)
    assert trigger["unit"] == "s"
    assert meta["window"] == 0
    assert trace_files(tmp_path)[0].parent.name == "window_000-slow_step-batches_42-43"
    assert "window_000-slow_step-batches_42-43: slow step: batch 40 took 0.4 s, 40.0x the 0.01 s median" in caplog.text
    assert sys.getprofile() is None and not torch.autograd.profiler._is_profiler_enabled


def test_150_noisy_steady_batches_open_no_window(tmp_path):
    rng = random.Random(20261123)
    noise = [rng.uniform(6.0, 18.0) for _ in range(200)]  # 3x spread around a 12 ms median
    clock = VirtualClock()
    # 40 batches per epoch (epoch boundaries) and a 2 s validation pass every 25 batches: neither is a step.
    model = ClockModel(clock, lambda step: noise[step], val_ms=200.0)
    cb = VizTraceCallback(slow_step_factor=2.0, slow_step_baseline=20, scheduled_windows=False)
    cb._controller.step_clock = clock
    trainer = make_trainer(tmp_path, [cb], max_steps=150, val_check_interval=25, limit_val_batches=10)
    data = loader(n=4 * 40)
    trainer.fit(model, data, loader(n=40))
    assert trainer.fit_loop.total_batch_idx >= 149 and trainer.current_epoch >= 3
    assert trace_files(tmp_path) == [] and cb._controller.plan.triggered == 0
    # the trigger was armed for most of the run, with the noise's median as its baseline: it could have fired
    slow = cb._controller.triggers.watch.slow
    assert slow.armed and 6 * MS < slow.baseline_ns < 18 * MS


def test_a_job_that_slows_down_for_good_is_traced_once_with_a_cooldown(tmp_path):
    clock = VirtualClock()
    model = ClockModel(clock, lambda step: 10.0 if step < 40 else 100.0)
    cb = VizTraceCallback(
        slow_step_factor=3.0, slow_step_baseline=20, warmup=1, active=1, trigger_cooldown=30, scheduled_windows=False
    )
    fit(tmp_path, cb, model, max_steps=150)
    names = run_dirs(tmp_path)
    assert names[0] == "window_000-slow_step-batches_42-42"
    # the next slow-step window waits for the cooldown; then the baseline has caught up: quiet
    assert len(names) <= 2 and all("slow_step" in n for n in names)
    if len(names) == 2:
        assert int(names[1].split("batches_")[1].split("-")[0]) >= 43 + 30


# ----------------------------------------------------------------------------- on demand
def test_a_trigger_file_created_mid_run_opens_a_window_within_3_batches(tmp_path):
    clock = VirtualClock()
    made = {}

    def create_file(model: ClockModel, step: int) -> None:
        if step == 20:
            path = Path(model.trainer.callbacks[0].output_dir) / TRIGGER_FILE_NAME
            path.touch()
            made["path"] = path

    # 250 ms steps and the default trigger_interval (0.5 s): the file is looked for every 2 batches.
    model = ClockModel(clock, lambda step: 250.0, create_file)
    cb = VizTraceCallback(warmup=1, active=2, trigger_file=True, scheduled_windows=False)
    fit(tmp_path, cb, model, max_steps=30)
    trace = only_trace(tmp_path)
    meta = trace["vt_lightning"]
    first = meta["steps"][0]
    assert 21 <= first <= 23 and meta["steps"] == [first, first + 1]
    assert marker_steps(trace) == set(meta["steps"])
    assert meta["trigger"]["reason"] == "trigger_file" and meta["trigger"]["detail"] == str(made["path"])
    assert trace_files(tmp_path)[0].parent.name == f"window_000-trigger_file-batches_{first}-{first + 1}"
    assert not made["path"].exists()  # consumed


def test_trigger_file_with_real_time_and_checks_every_batch(tmp_path):
    def create_file(model: MarkerModel, step: int) -> None:
        if step == 12:
            (Path(model.trainer.callbacks[0].output_dir) / TRIGGER_FILE_NAME).touch()

    class Model(MarkerModel):
        def training_step(self, batch, batch_idx):
            create_file(self, self.trainer.fit_loop.total_batch_idx)
            return super().training_step(batch, batch_idx)

    cb = VizTraceCallback(warmup=0, active=1, trigger_file=True, trigger_interval=0.0, skip_first=10**6)
    trainer = make_trainer(tmp_path, [cb], max_steps=20)
    trainer.fit(Model(), loader(n=80))
    assert run_dirs(tmp_path) == ["window_000-trigger_file-batches_13-13"]


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_the_opt_in_signal_opens_a_window_and_its_handler_is_restored(tmp_path):
    clock = VirtualClock()

    def send(model: ClockModel, step: int) -> None:
        if step == 15:
            os.kill(os.getpid(), signal.SIGUSR1)

    model = ClockModel(clock, lambda step: 1.0, send)  # 1 ms steps: a check only every ~16 batches ...
    cb = VizTraceCallback(warmup=1, active=1, trigger_signal="SIGUSR1", scheduled_windows=False)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    fit(tmp_path, cb, model, max_steps=30)
    meta = only_trace(tmp_path)["vt_lightning"]
    assert meta["steps"] == [17]  # ... but the signal asks for a look at the next batch: warmup 16
    assert meta["trigger"]["reason"] == "signal" and meta["trigger"]["detail"] == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


# ----------------------------------------------------------------------------- memory growth
def test_memory_growth_on_cpu_opens_a_window_with_its_snapshot(tmp_path):
    clock = VirtualClock()
    hoard: list[torch.Tensor] = []
    # Grow by a twentieth of this process's RSS a batch (at least 20 MB), touched: +50 % over the
    # 10-batch horizon whatever earlier tests left in the process, well past the 20 % threshold.
    rss = os.sysconf("SC_PAGE_SIZE") * int(Path("/proc/self/statm").read_text().split()[1])
    floats = max(5 * 2**20, rss // 20 // 4)

    def leak(model: ClockModel, step: int) -> None:
        if step >= 40:
            hoard.append(torch.ones(floats))

    model = ClockModel(clock, lambda step: 50.0, leak)
    cb = VizTraceCallback(
        memory_growth=0.2,
        memory_growth_steps=10,
        warmup=1,
        active=1,
        trigger_cooldown=1000,
        trigger_interval=0.0,
        scheduled_windows=False,
    )
    fit(tmp_path, cb, model, max_steps=70)
    hoard.clear()
    files = trace_files(tmp_path)
    assert len(files) == 1, run_dirs(tmp_path)
    meta = load_trace(files[0])["vt_lightning"]
    trigger = meta["trigger"]
    assert trigger["reason"] == "memory_growth" and trigger["detail"] == "rss" and trigger["unit"] == "bytes"
    assert 40 < trigger["batch"] <= 40 + 10 + 10
    assert trigger["value"] > 1.2 * trigger["baseline"]
    assert files[0].parent.name.startswith("window_000-memory_growth-batches_")
    assert list(files[0].parent.glob("*.memory_snapshot.pickle"))  # the window comes with its snapshot


# ----------------------------------------------------------------------------- limits and the schedule
def test_schedule_and_triggers_share_numbering_and_budget_windows(tmp_path):
    clock = VirtualClock()
    model = ClockModel(clock, lambda step: 400.0 if step in (30, 60, 90) else 10.0)
    cb = VizTraceCallback(
        skip_first=5,
        wait=0,
        warmup=1,
        active=1,
        repeat=1,
        slow_step_factor=3.0,
        slow_step_baseline=10,
        trigger_cooldown=0,
        budget_windows=3,
    )
    fit(tmp_path, cb, model, max_steps=100)
    assert run_dirs(tmp_path) == [
        "window_000-batches_6-6",
        "window_001-slow_step-batches_32-32",
        "window_002-slow_step-batches_62-62",
    ]  # batch 90's slow step would be a 4th window: budget_windows=3 refuses it
    metas = [load_trace(f)["vt_lightning"] for f in trace_files(tmp_path)]
    assert [m["window"] for m in metas] == [0, 1, 2]
    assert metas[0]["trigger"] is None and [m["trigger"]["batch"] for m in metas[1:]] == [30, 60]


def test_no_trigger_armed_keeps_the_quiet_path_as_it_was(tmp_path):
    cb = VizTraceCallback()  # every trigger is opt-in
    trainer = make_trainer(tmp_path, [cb], max_steps=8)
    trainer.fit(MarkerModel(), loader())
    assert cb._controller.triggers is None and cb._controller.slow is None


def test_armed_quiet_batches_allocate_nothing_that_grows(tmp_path):
    """Slow step + file armed: a quiet batch reads the clock once and keeps no new object."""
    import tracemalloc

    cb = VizTraceCallback(slow_step_factor=3.0, slow_step_baseline=10, scheduled_windows=False)
    trainer = make_trainer(tmp_path, [cb], max_steps=400)
    trainer.fit(MarkerModel(), loader(n=4 * 400))
    # Re-arm as during a long quiet stretch of the run (teardown disarmed it).
    from vt_lightning.analysis.triggers import SlowStep

    clock = VirtualClock()

    def tick() -> int:  # constant 1 ms steps: every quiet batch stays quiet
        clock.ns += MS
        return clock.ns

    slow = SlowStep(3.0, 10, tick)
    cb._controller.slow, cb._controller.next_look, cb._controller.next_check = slow, -1, 10**6
    for _ in range(50):
        cb.on_train_batch_start(trainer, None, None, 0)  # fills the baseline
    slow.refresh()
    assert slow.armed
    tracemalloc.start()
    for _ in range(10):
        cb.on_train_batch_start(trainer, None, None, 0)
        cb.on_train_batch_end(trainer, None, None, None, 0)
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(2000):
        cb.on_train_batch_start(trainer, None, None, 0)
        cb.on_train_batch_end(trainer, None, None, None, 0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert after - before < 512  # the deque reuses its slots; durations are replaced, not kept
    assert len(slow.durations) == 10
