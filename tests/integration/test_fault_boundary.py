"""The callback's fault boundary (``callback.py``): a fault in vt_lightning's code, wherever below a
Lightning hook it is raised, is one warning, leaves nothing installed, and never stops training;
what is the run's own (a signal handler's exception, a setting it cannot honour, Ctrl-C) goes on
to Lightning."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from pathlib import Path

import pytest
from conftest import MarkerModel, hooks_left, loader, make_trainer, raising_at, trace_files

from vt_lightning import VizTraceCallback
from vt_lightning.controller import side_recorders
from vt_lightning.controller.controller import WindowController
from vt_lightning.recording.torchtracer import TorchTracer


class Boom(RuntimeError):
    """The injected fault."""


class UsersOwnError(Exception):
    """An exception of the user's code."""


def faults(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "profiling failed" in str(w.message)]


def fit(root: Path, cb: VizTraceCallback, steps: int = 10, **kwargs) -> tuple[MarkerModel, list[str]]:
    """``steps`` batches; with ``limit_val_batches``, validation runs on its own loader."""
    model = MarkerModel()
    val = loader(n=8) if kwargs.get("limit_val_batches") else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(root, [cb], max_steps=steps, **kwargs).fit(model, loader(n=4 * steps), val_dataloaders=val)
    return model, faults(caught)


def raise_at(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, call: int = 0) -> list[int]:
    """Make the ``call``-th call (from 0) of ``owner.name`` raise ``Boom``; returns the call count."""
    wrapper, calls = raising_at(getattr(owner, name), call, lambda: Boom(f"injected into {name}"))
    monkeypatch.setattr(owner, name, wrapper)
    return calls


def test_a_fault_in_a_recording_call_mid_window_is_one_warning_and_the_next_window_records(tmp_path, monkeypatch):
    # Windows at batches 2-3 and 6-7; torch's tracer fails to open batch 3's step (at batch 2's end).
    calls = raise_at(monkeypatch, TorchTracer, "step_begin", call=1)
    cb = VizTraceCallback(wait=1, warmup=1, active=2, repeat=2, memory_snapshot=False)
    model, said = fit(tmp_path, cb)
    assert model.train_batches == list(range(10))  # training went on, every batch
    assert len(said) == 1 and "in on_train_batch_end (Boom: injected into step_begin)" in said[0], said
    assert hooks_left(model) == []
    assert calls[0] > 2 and cb.windows_skipped == 1
    assert [r.trace_path.parent.name for r in cb.results] == ["window_001-batches_6-7"]
    assert len(trace_files(tmp_path)) == 1


@pytest.mark.parametrize(
    "method, call, hook",
    [
        ("train_start", 0, "on_train_start"),
        ("train_batch_start", 0, "on_train_batch_start"),
        ("batch_end", 0, "on_train_batch_end"),
        ("not_a_step", 0, "on_train_epoch_start"),
        ("range", 0, "on_validation_start"),
        ("range", 1, "on_validation_end"),
        ("eval_batch_start", 0, "on_validation_batch_start"),
        ("end_stage", 0, "on_validation_end"),
        ("finalize", 0, "on_train_end"),  # validation inside fit is no stage: it finalizes nothing
        ("finalize", 1, "teardown"),
    ],
)
def test_a_fault_at_any_hook_keeps_training_and_leaves_nothing_installed(tmp_path, monkeypatch, method, call, hook):
    raise_at(monkeypatch, WindowController, method, call)
    cb = VizTraceCallback(wait=1, warmup=1, active=3, trigger_signal="SIGUSR1", memory_snapshot=False)
    before = signal.getsignal(signal.SIGUSR1)
    model, said = fit(tmp_path, cb, steps=6, limit_val_batches=2, val_check_interval=3)
    assert model.train_batches == list(range(6))
    assert len(said) == 1 and f"in {hook} (Boom" in said[0], said
    assert hooks_left(model) == []
    assert signal.getsignal(signal.SIGUSR1) == before  # the trigger's handler was given back
    assert cb._controller.writer is None and cb._controller.spool is None  # the run was shut down


def test_a_fault_while_finishing_after_the_users_exception_lets_that_exception_through(tmp_path, monkeypatch):
    class Failing(MarkerModel):
        def training_step(self, batch, batch_idx):
            if self.trainer.fit_loop.total_batch_idx == 3:
                raise UsersOwnError("the user's training_step")
            return super().training_step(batch, batch_idx)

    raise_at(monkeypatch, WindowController, "finalize")  # on_exception's close of the open window
    cb = VizTraceCallback(wait=1, warmup=1, active=3, trigger_signal="SIGUSR1", memory_snapshot=False)
    before = signal.getsignal(signal.SIGUSR1)
    model = Failing()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UsersOwnError, match="the user's training_step"):
            make_trainer(tmp_path, [cb], max_steps=6).fit(model, loader(n=24))
    said = faults(caught)
    assert len(said) == 1 and "in on_exception (Boom" in said[0], said
    assert hooks_left(model) == [] and signal.getsignal(signal.SIGUSR1) == before
    assert cb._controller.writer is None and cb._controller.spool is None


def test_a_fault_late_in_setup_undoes_what_setup_installed(tmp_path, monkeypatch):
    # Worker tracing is set up last, after the triggers armed their signal and the writer started.
    raise_at(monkeypatch, side_recorders, "start_run")
    cb = VizTraceCallback(wait=1, warmup=1, active=2, trigger_signal="SIGUSR1")
    before = signal.getsignal(signal.SIGUSR1)
    threads = set(threading.enumerate())
    model, said = fit(tmp_path, cb, steps=6)
    assert model.train_batches == list(range(6))
    assert len(said) == 1 and "in setup (Boom" in said[0], said
    assert signal.getsignal(signal.SIGUSR1) == before
    assert not [t.name for t in set(threading.enumerate()) - threads if t.name.startswith("vt_lightning")]
    assert trace_files(tmp_path) == [] and hooks_left(model) == []  # the run was not profiled


def test_what_a_signal_handler_raises_inside_a_hook_reaches_lightning(tmp_path, monkeypatch):
    """The user's handler (or torch's, for a dead DataLoader worker) runs wherever the training
    thread is, in our hook too: its exception is the run's, not a fault to swallow."""

    def handler(signum, frame):
        raise UsersOwnError("the user's handler")

    original = WindowController.train_batch_start

    def signalled(self, trainer, ready):
        os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs here, inside our code
        return original(self, trainer, ready)

    monkeypatch.setattr(WindowController, "train_batch_start", signalled)
    previous = signal.signal(signal.SIGUSR2, handler)
    cb = VizTraceCallback(wait=1, warmup=1, active=2, memory_snapshot=False)
    model = MarkerModel()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(UsersOwnError, match="the user's handler"):
                make_trainer(tmp_path, [cb], max_steps=6).fit(model, loader(n=24))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert faults(caught) == []
    assert hooks_left(model) == []


def test_keyboard_interrupt_inside_a_hook_reaches_lightning(tmp_path, monkeypatch):
    original = WindowController.batch_end

    def interrupted(self, step):
        if step == 2:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(WindowController, "batch_end", interrupted)
    cb = VizTraceCallback(wait=1, warmup=1, active=2, memory_snapshot=False)
    model = MarkerModel()
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning turns Ctrl-C into exit(1), after on_exception
            make_trainer(tmp_path, [cb], max_steps=6).fit(model, loader(n=24))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert model.train_batches == [0, 1, 2] and hooks_left(model) == []
