"""Issue 22, items 4, 5, 11 and 15, with a real Trainer on CPU.

* 4: ``trigger_signal`` takes only signals with no standard meaning, gives way to Lightning's SLURM
  auto-requeue, and after fit, whatever its end, every handler is the one from before fit.
* 5: absurd numbers and NUL bytes are refused at construction, naming the argument.
* 11: two VizTraceCallbacks in one Trainer: our error, saying what to do.
* 15: triggers say from when they can act, and which one never could.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from conftest import MarkerModel, load_trace, loader, make_trainer, trace_files
from lightning.fabric.plugins.environments import SLURMEnvironment

from vt_lightning import VizTraceCallback
from vt_lightning.analysis.triggers import Cadence

HAS_RT = hasattr(signal, "SIGRTMIN")
pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")


def handlers() -> dict[Any, Any]:
    """Every catchable signal's handler now."""
    return {s: signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}


def vt_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("vt_lightning:")]


class Scripted(MarkerModel):
    """Runs ``act(step)`` in each training step and records the trigger signal's handler there."""

    def __init__(self, act: Any = None, watched: int = signal.SIGUSR1) -> None:
        super().__init__()
        self.act = act
        self.watched = watched
        self.seen_handlers: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen_handlers.append(signal.getsignal(self.watched))
        if self.act is not None:
            self.act(self.trainer.fit_loop.total_batch_idx)
        return super().training_step(batch, batch_idx)


def raise_at(step: int, error: BaseException) -> Any:
    def act(current: int) -> None:
        if current == step:
            raise error

    return act


@pytest.fixture
def restored_handlers() -> Iterator[dict[Any, Any]]:
    """The handlers before the test; put back after it whatever happened."""
    before = handlers()
    yield before
    for signum, handler in before.items():
        if signal.getsignal(signum) != handler and handler is not None:
            signal.signal(signum, handler)


# ----------------------------------------------------------------------------- 4: which signals
@pytest.mark.parametrize("name", ["SIGCHLD", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGINT", "SIGTERM", "SIGALRM"])
def test_a_signal_with_a_standard_meaning_is_refused_naming_it(name):
    with pytest.raises(ValueError, match=rf"`trigger_signal`: {name} \(.*\) has a standard meaning.*SIGUSR2"):
        VizTraceCallback(trigger_signal=name)
    with pytest.raises(ValueError, match=rf"`trigger_signal`: {name} "):
        VizTraceCallback(trigger_signal=int(getattr(signal, name)))


@pytest.mark.parametrize("value", ["USR1", "sigusr1", "SIGNOPE", "SIGRTMIN-1", "SIGRTMAX+1", "", True, 10**30])
def test_a_name_that_is_no_free_signal_is_refused(value):
    with pytest.raises(ValueError, match="`trigger_signal` must be SIGUSR1, SIGUSR2"):
        VizTraceCallback(trigger_signal=value)


@pytest.mark.parametrize(
    "value, canonical",
    [
        ("SIGUSR1", "SIGUSR1"),
        (signal.SIGUSR2, "SIGUSR2"),
        *(
            [
                ("SIGRTMIN", "SIGRTMIN"),
                ("SIGRTMIN+3", "SIGRTMIN+3"),
                ("SIGRTMAX-1", None),
                (int(signal.SIGRTMIN) + 2, "SIGRTMIN+2"),
            ]
            if HAS_RT
            else []
        ),
    ],
)
def test_free_signals_are_accepted_under_one_name(value, canonical, restored_handlers):
    name = VizTraceCallback(trigger_signal=value).options.triggers.trigger_signal
    if canonical is None:  # SIGRTMAX-1, spelled from the low end
        assert name == f"SIGRTMIN+{int(signal.SIGRTMAX) - 1 - int(signal.SIGRTMIN)}"
    else:
        assert name == canonical


@pytest.mark.skipif(not HAS_RT, reason="no real-time signals on this platform")
def test_a_real_time_signal_opens_a_window_named_by_it(tmp_path, restored_handlers):
    def send(step: int) -> None:
        if step == 3:
            os.kill(os.getpid(), int(signal.SIGRTMIN) + 3)

    cb = VizTraceCallback(
        warmup=0, active=1, trigger_signal="SIGRTMIN+3", trigger_interval=0.0, scheduled_windows=False
    )
    model = Scripted(send, watched=int(signal.SIGRTMIN) + 3)
    make_trainer(tmp_path, [cb], max_steps=8).fit(model, loader())
    (trace,) = trace_files(tmp_path)
    assert load_trace(trace)["vt_lightning"]["trigger"]["detail"] == "SIGRTMIN+3"
    assert trace.parent.name.startswith("window_000-signal-")
    assert model.seen_handlers[0] not in (signal.SIG_DFL, None)  # ours, during fit
    assert handlers() == restored_handlers


# ----------------------------------------------------------------------------- 4: handlers after fit
ENDS = {
    "normal": (None, None),
    "exception in training_step": (RuntimeError("boom"), RuntimeError),
    "KeyboardInterrupt": (KeyboardInterrupt(), SystemExit),  # Lightning turns it into sys.exit(1)
}


def fit_to_its_end(tmp_path: Path, end: str, model: Scripted, cb: VizTraceCallback, **kwargs: Any) -> L.Trainer:
    error, expected = ENDS[end]
    if error is not None:
        model.act = raise_at(3, error)
    trainer = make_trainer(tmp_path, [cb, *kwargs.pop("callbacks", [])], max_steps=8, **kwargs)
    if expected is None:
        trainer.fit(model, loader())
    else:
        with pytest.raises(expected) as raised:
            trainer.fit(model, loader())
        if expected is SystemExit:
            assert raised.value.code == 1
    return trainer


@pytest.mark.parametrize("end", list(ENDS))
def test_every_handler_is_the_one_from_before_fit_whatever_the_end(tmp_path, end, restored_handlers):
    model = Scripted()
    cb = VizTraceCallback(wait=0, warmup=1, active=2, trigger_signal="SIGUSR1")
    fit_to_its_end(tmp_path, end, model, cb)
    assert model.seen_handlers and all(h not in (signal.SIG_DFL, None) for h in model.seen_handlers)  # ours ran
    assert handlers() == restored_handlers


class InstallsOnFitStart(L.Callback):
    """The user's own handlers, installed after the VizTraceCallback was built."""

    def __init__(self) -> None:
        self.own = {signal.SIGUSR1: self.handle, signal.SIGUSR2: self.handle}

    def handle(self, signum: int, frame: Any) -> None:
        pass

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        for signum, handler in self.own.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("end", list(ENDS))
def test_a_handler_the_user_installs_in_on_fit_start_stays(tmp_path, end, restored_handlers):
    user = InstallsOnFitStart()
    cb = VizTraceCallback(wait=0, warmup=1, active=2, trigger_signal="SIGUSR1")
    fit_to_its_end(tmp_path, end, Scripted(), cb, callbacks=[user])
    assert signal.getsignal(signal.SIGUSR1) == user.handle  # it replaced ours: left alone
    assert signal.getsignal(signal.SIGUSR2) == user.handle
    expected = {**restored_handlers, **user.own}
    assert handlers() == expected


def test_a_handler_installed_after_the_callback_was_built_keeps_the_signal(tmp_path, restored_handlers):
    cb = VizTraceCallback(wait=0, warmup=1, active=2, trigger_signal="SIGUSR2")

    def mine(signum: int, frame: Any) -> None:
        pass

    signal.signal(signal.SIGUSR2, mine)
    model = Scripted(watched=signal.SIGUSR2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=6).fit(model, loader())
    assert any("`trigger_signal` is off for this run: SIGUSR2 already has a handler" in m for m in vt_warnings(caught))
    assert set(model.seen_handlers) == {mine}
    assert signal.getsignal(signal.SIGUSR2) == mine


# ----------------------------------------------------------------------------- 4: SLURM owns SIGUSR1
@pytest.fixture
def slurm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in dict(
        SLURM_NTASKS="1", SLURM_JOB_NAME="job", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_ID="7"
    ).items():
        monkeypatch.setenv(name, value)


def test_slurm_auto_requeue_keeps_sigusr1_and_the_warning_says_use_sigusr2(tmp_path, slurm_env, restored_handlers):
    cb = VizTraceCallback(wait=0, warmup=1, active=2, trigger_signal="SIGUSR1")
    model = Scripted()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(tmp_path, [cb], max_steps=6, plugins=[SLURMEnvironment(auto_requeue=True)])
        trainer.fit(model, loader())
    (message,) = [m for m in vt_warnings(caught) if "trigger_signal" in m]
    assert "SLURM auto-requeue" in message and "trigger_signal='SIGUSR2'" in message
    # Lightning's requeue handler, not ours, held SIGUSR1 during training
    assert {type(h).__name__ for h in model.seen_handlers} == {"_HandlersCompose"}
    assert handlers() == restored_handlers


def test_slurm_auto_requeue_leaves_sigusr2_to_the_trigger(tmp_path, slurm_env, restored_handlers):
    cb = VizTraceCallback(wait=0, warmup=1, active=2, trigger_signal="SIGUSR2")
    model = Scripted(watched=signal.SIGUSR2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(tmp_path, [cb], max_steps=6, plugins=[SLURMEnvironment(auto_requeue=True)])
        trainer.fit(model, loader())
    assert not [m for m in vt_warnings(caught) if "trigger_signal" in m]
    assert all(getattr(h, "__self__", None) is not None for h in model.seen_handlers)  # our bound handler
    assert handlers() == restored_handlers


# ----------------------------------------------------------------------------- 5: limits
NUL = "\0"


@pytest.mark.parametrize(
    "name, value",
    [
        ("trigger_interval", 1e300),
        ("trigger_interval", math.inf),
        ("trigger_interval", math.nan),
        ("trigger_interval", 86_401),
        ("writer_timeout", 1e300),
        ("writer_timeout", math.inf),
        ("min_duration", math.inf),
        ("min_duration", 10**400),
        ("slow_step_factor", 1e300),
        ("slow_step_factor", math.inf),
        ("slow_step_baseline", 10**9),
        ("memory_growth", math.nan),
        ("memory_growth", 1e300),
        ("memory_growth_steps", 10**30),
        ("trigger_cooldown", 10**30),
        ("budget_windows", 10**30),
        ("tracer_entries", 10**12),
        ("memory_max_entries", 10**12),
        ("max_stack_depth", 10**9),
        ("compression_level", 10),
        ("skip_first", 10**30),
        ("active", 10**30),
        ("repeat", 10**30),
        ("ranks", [2**40]),
        ("dirpath", f"runs{NUL}x"),
        ("spool_dir", f"/tmp/spool{NUL}"),
        ("include_files", ["src", f"src{NUL}/x.py"]),
        ("exclude_files", [f"{NUL}"]),
        ("trigger_signal", f"SIGUSR1{NUL}"),
    ],
)
def test_absurd_numbers_and_nul_bytes_are_refused_naming_the_argument(name, value):
    with pytest.raises(ValueError, match=f"`{name}`"):
        VizTraceCallback(**{name: value})


def test_the_limits_themselves_are_accepted(restored_handlers):
    cb = VizTraceCallback(
        trigger_interval=86_400,
        writer_timeout=86_400,
        slow_step_factor=1000,
        slow_step_baseline=10_000,
        memory_growth=100,
        tracer_entries=10**8,
        memory_max_entries=10**8,
        max_stack_depth=100_000,
        min_duration=3.6e9,
        budget_windows=10**12,
    )
    assert cb.options.triggers.trigger_interval == 86_400.0 and cb.options.writer_timeout == 86_400.0


def test_the_longest_trigger_interval_trains_and_writes_every_window(tmp_path):
    # 1e300 raised OverflowError in training and lost both windows; the largest value allowed works.
    cb = VizTraceCallback(wait=1, warmup=0, active=1, repeat=2, trigger_interval=86_400, trigger_file=True)
    make_trainer(tmp_path, [cb], max_steps=8).fit(MarkerModel(), loader())
    assert len(cb.results) == 2 and len(trace_files(tmp_path)) == 2
    gaps = {Cadence(86_400).next_gap(batch, batch * 1000) for batch in range(1, 20)}  # 1 µs steps
    assert max(gaps) <= 1000


# ----------------------------------------------------------------------------- 11: two callbacks
@pytest.mark.parametrize("same", [False, True], ids=["two callbacks", "one callback twice"])
def test_two_callbacks_fail_at_fit_start_saying_what_to_do(tmp_path, same):
    first = VizTraceCallback()
    trainer = make_trainer(tmp_path, [first, first if same else VizTraceCallback(wait=5)])  # Trainer() accepts it
    with pytest.raises(RuntimeError, match=r"this Trainer has 2 VizTraceCallbacks") as raised:
        trainer.fit(MarkerModel(), loader())
    assert "Keep one VizTraceCallback" in str(raised.value) and "repeat" in str(raised.value)
    assert trace_files(tmp_path) == [] and first.results == []


# ----------------------------------------------------------------------------- 15: when triggers act
@pytest.fixture
def info_lines() -> Iterator[list[str]]:
    """What ``rank_zero_info`` says during the test."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = Keep(level=logging.INFO)
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def test_triggers_say_when_they_arm_and_which_never_did(tmp_path, info_lines, restored_handlers):
    cb = VizTraceCallback(slow_step_factor=3.0, memory_growth=0.5, memory_growth_steps=40, trigger_file=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=20).fit(MarkerModel(), loader())
    (text,) = [line for line in info_lines if line.startswith("vt_lightning: triggers armed:")]
    assert "arms once 50 steps are measured (`slow_step_baseline`), at batch 50 at the earliest" in text
    assert "measured from batch 80 at the earliest (`memory_growth_steps`=40" in text
    assert "vt_lightning.trigger (create it to open a window): from now" in text
    never = [m for m in vt_warnings(caught) if "never armed" in m]
    assert len(never) == 2
    assert "slow-step trigger never armed" in never[0] and "Lower `slow_step_baseline`" in never[0]
    assert "memory-growth trigger never armed" in never[1] and "Lower `memory_growth_steps`" in never[1]


def test_a_trigger_that_armed_is_not_reported(tmp_path):
    cb = VizTraceCallback(slow_step_factor=3.0, slow_step_baseline=5, trigger_interval=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], max_steps=20).fit(MarkerModel(), loader())
    assert not [m for m in vt_warnings(caught) if "never armed" in m]


def test_a_run_that_crashed_gets_no_advice_to_run_longer(tmp_path):
    cb = VizTraceCallback(slow_step_factor=3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="boom"):
            make_trainer(tmp_path, [cb], max_steps=20).fit(Scripted(raise_at(3, RuntimeError("boom"))), loader())
    assert not [m for m in vt_warnings(caught) if "never armed" in m]
