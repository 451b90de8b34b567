"""Arming one run's triggers (the ranks' agreement, the probes, the watch) and disarming them."""

from __future__ import annotations

import contextlib
import signal
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment

from vt_lightning.analysis.sources import WindowPlan
from vt_lightning.analysis.triggers import FREE_SIGNALS, ON_DEMAND, SLOW_STEP, TriggerConfig, parse_trigger_signal
from vt_lightning.constants import TRIGGER_FILE_NAME
from vt_lightning.controller import messages
from vt_lightning.controller.agreement import Agreement, gloo_agreement
from vt_lightning.controller.messages import Warn
from vt_lightning.controller.watch import TriggerWatch
from vt_lightning.export.job import URL
from vt_lightning.recording.flight import flight_for
from vt_lightning.recording.probes import SignalTrigger, memory_reader


def agree(
    trainer: Any, config: TriggerConfig, ranks: tuple[int, ...] | None, warn: Warn
) -> tuple[Agreement | None, Any]:
    """(How this rank's triggers agree with the others', None: none armed; its group). Collective."""
    rank = trainer.global_rank
    if not config.armed:
        return None, None
    if trainer.world_size <= 1:
        return Agreement(rank), None
    if dist.is_available() and dist.is_initialized():
        try:
            return gloo_agreement(rank, list(ranks) if ranks is not None else None)
        except Exception as err:  # no gloo group: each rank's triggers act alone, said once
            why = f"could not create the gloo group for the triggers' agreement ({err})"
    else:
        why = "several ranks but no torch.distributed process group"
    warn("no-agreement", f"vt_lightning: {why}; each rank's triggers open windows on that rank only.")
    return Agreement(rank), None


class ArmedTriggers:
    """The watch of one run, and what must be given back at its end (signal handler, group)."""

    def __init__(self, watch: TriggerWatch, group: Any, trainer: Any, warn: Warn, earliest_memory: int) -> None:
        self.watch = watch
        self.group = group
        self.trainer = weakref.ref(trainer)
        self.warn: Warn | None = warn
        self.earliest_memory_batch = earliest_memory  # for the end-of-run note

    def ask(self, step: int, plan: WindowPlan, options: Any, warn: Warn) -> None:
        """Plan a triggered window at this batch if a trigger fired (and the limits allow it)."""
        firing = self.watch.check(step, plan)
        if firing is None:
            return
        planned, refused = plan.request(firing, step, options.schedule.warmup, options.schedule.active)
        if planned is not None:
            if firing.reason == SLOW_STEP and self.watch.flight is not None:
                self.watch.flight.assign(planned.window.warmup_start, firing.batch)  # its samples go with it
            return
        if refused == "max_windows":
            warn(
                "max-windows",
                f"vt_lightning: budget_windows={options.triggers.max_windows} reached; "
                f"later triggers ({firing.reason} at batch {firing.batch} first) open no window.",
            )
        elif refused == "busy" and firing.reason in ON_DEMAND:
            self.watch.hold(firing)

    def request_now(self) -> bool:
        """A signal came: in one process, check at the next batch (True); in DDP, at the agreed check."""
        if self.watch.agreement.distributed:
            return False
        self.watch.request_now()
        return True

    def disarm(self) -> None:
        """Give back the signal handler and the group (idempotent); say which trigger never armed."""
        if self.watch.flight is not None:
            self.watch.flight.stop()  # the sampler thread never outlives the run
        if self.watch.signal is not None:
            self.watch.signal.restore()
            _forget_in_lightning_snapshot(self.trainer(), self.watch.signal)
            self.watch.signal = None
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)
        warn, self.warn = self.warn, None
        if warn is not None and _ended_normally(self.trainer()):
            messages.triggers_never_armed(warn, self.watch, self.earliest_memory_batch)


def _ended_normally(trainer: Any) -> bool:
    """A fit that ran to its end: after an exception or Ctrl-C, "run more batches" is no advice."""
    state = getattr(trainer, "state", None)
    fn, status = getattr(state, "fn", None), getattr(state, "status", None)
    return str(getattr(fn, "value", fn)) == "fit" and str(getattr(status, "value", status)) != "interrupted"


def _forget_in_lightning_snapshot(trainer: Any, trigger: SignalTrigger) -> None:
    """Lightning puts back the handlers it saw at setup even after ``on_exception``: not ours."""
    snapshot = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
    if isinstance(snapshot, dict) and trigger.owns(snapshot.get(trigger.signum)):
        snapshot[trigger.signum] = trigger.previous if trigger.previous is not None else signal.SIG_DFL


def slurm_requeue_signal(trainer: Any) -> int | None:
    """The signal Lightning's SLURM auto-requeue handles in this run (its ``requeue_signal``), or None."""
    connector = getattr(trainer, "_accelerator_connector", None)
    environment = getattr(connector, "cluster_environment", None) or getattr(
        trainer.strategy, "cluster_environment", None
    )
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return int(environment.requeue_signal or signal.SIGUSR1)
    return None


def arm(
    trainer: Any,
    config: TriggerConfig,
    agreement: Agreement,
    group: Any,
    root: Path | URL,
    cuda: bool,
    warn: Warn,
    clock: Callable[[], int],
    first_check: int,
    on_signal: Callable[[], None],
) -> ArmedTriggers:
    """Install this run's probes and build the watch that checks them; say when each can act."""
    trigger_path = None
    if config.trigger_file:
        trigger_path = root / TRIGGER_FILE_NAME  # a URL root: looked for there, not in local staging
        try:
            if isinstance(root, Path):
                root.mkdir(parents=True, exist_ok=True)  # so the user can drop the file at once
        except OSError as err:
            warn("trigger-dir", f"vt_lightning: cannot create {root} for the trigger file ({err}).")
    signal_trigger = None
    if config.trigger_signal is not None:
        signal_trigger = _install_signal(trainer, config.trigger_signal, warn)
    read_memory = memory_kind = None
    if config.memory_growth is not None:
        try:
            read_memory, memory_kind = memory_reader(trainer.strategy.root_device if cuda else None)
        except Exception as err:  # the check still runs (DDP ranks must stay in step), without memory
            warn(
                "memory-probe",
                f"vt_lightning: cannot read memory use ({err}); the memory-growth trigger is off for this run.",
            )
    watch = TriggerWatch(
        config, agreement, clock, trigger_path, signal_trigger, read_memory, memory_kind, warn, first_check=first_check
    )
    if signal_trigger is not None:
        signal_trigger.on_request = on_signal
    watch.flight = flight_for(watch.slow, clock)
    earliest_memory = max(first_check, config.memory_growth_steps) + config.memory_growth_steps
    messages.triggers_armed(watch, first_check, earliest_memory)
    return ArmedTriggers(watch, group, trainer, warn, earliest_memory)


def _install_signal(trainer: Any, name: str, warn: Warn) -> SignalTrigger | None:
    """The signal trigger, installed; None (and a warning saying why) where it must stay off."""
    signum, name = parse_trigger_signal(name)
    if slurm_requeue_signal(trainer) == signum:
        other = next((n for n in ("SIGUSR2", "SIGUSR1") if n != name and n in FREE_SIGNALS.values()), None)
        warn("trigger-signal", messages.signal_owned_by_slurm(name, other))
        return None
    trigger = SignalTrigger(signum, name)
    problem = trigger.install()
    if problem is not None:
        warn("trigger-signal", f"vt_lightning: `trigger_signal` is off for this run: {problem}.")
        return None
    return trigger
