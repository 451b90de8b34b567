"""Arming the triggers of one run: the ranks' agreement, the probes, the watch; and disarming them.

The decisions themselves are pure (``analysis/triggers.py``); this module wires them to the probes
of this process and to the other ranks, and gives everything back at the end of the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from vt_lightning.analysis.sources import WindowPlan
from vt_lightning.analysis.triggers import ON_DEMAND, TriggerConfig, signal_number
from vt_lightning.constants import TRIGGER_FILE_NAME
from vt_lightning.controller.agreement import Agreement, gloo_agreement
from vt_lightning.controller.watch import TriggerWatch
from vt_lightning.recording.probes import SignalTrigger, memory_reader

Warn = Callable[[str, str], Any]


def agree(
    trainer: Any, config: TriggerConfig, ranks: tuple[int, ...] | None, warn: Warn
) -> tuple[Agreement | None, Any]:
    """How this rank's triggers agree with the others' (None: no trigger armed) and the process
    group made for it. Collective: every rank calls it, tracing or not."""
    rank = trainer.global_rank
    if not config.armed:
        return None, None
    if trainer.world_size <= 1:
        return Agreement(rank), None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        warn(
            "no-agreement",
            "vt_lightning: several ranks but no torch.distributed process group: "
            "each rank's triggers open windows on that rank only.",
        )
        return Agreement(rank), None
    try:
        return gloo_agreement(rank, list(ranks) if ranks is not None else None)
    except Exception as err:
        warn(
            "no-agreement",
            f"vt_lightning: could not create the gloo group for the triggers' "
            f"agreement ({err}); each rank's triggers open windows on that rank only.",
        )
        return Agreement(rank), None


class ArmedTriggers:
    """The watch of one run, and what must be given back at its end (signal handler, group)."""

    def __init__(self, watch: TriggerWatch, signal: SignalTrigger | None, group: Any) -> None:
        self.watch = watch
        self.signal = signal
        self.group = group

    def ask(self, step: int, plan: WindowPlan, options: Any, warn: Warn) -> None:
        """Plan a triggered window at this batch if a trigger fired (and the limits allow it)."""
        firing = self.watch.check(step, plan)
        if firing is None:
            return
        planned, refused = plan.request(firing, step, options.schedule.warmup, options.schedule.active)
        if planned is not None:
            return
        if refused == "max_windows":
            warn(
                "max-windows",
                f"vt_lightning: max_windows={options.triggers.max_windows} reached; "
                f"later triggers ({firing.reason} at batch {firing.batch} first) open no window.",
            )
        elif refused == "busy" and firing.reason in ON_DEMAND:
            self.watch.hold(firing)

    def request_now(self) -> bool:
        """A signal came: in one process, check at the next batch (True); with several ranks the
        request waits for the next agreed check (False)."""
        if self.watch.agreement.distributed:
            return False
        self.watch.request_now()
        return True

    def disarm(self) -> None:
        if self.signal is not None:
            self.signal.restore()
            self.signal = None
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(Exception):
                import torch.distributed as dist

                dist.destroy_process_group(group)


def arm(
    trainer: Any,
    config: TriggerConfig,
    agreement: Agreement,
    group: Any,
    root: Path,
    cuda: bool,
    warn: Warn,
    clock: Callable[[], int],
    first_check: int,
    on_signal: Callable[[], None],
) -> ArmedTriggers:
    """Install this run's probes and build the watch that checks them."""
    trigger_path = None
    if config.trigger_file:
        trigger_path = root / TRIGGER_FILE_NAME
        try:
            root.mkdir(parents=True, exist_ok=True)  # so the user can drop the file at once
        except OSError as err:
            warn("trigger-dir", f"vt_lightning: cannot create {root} for the trigger file ({err}).")
    signal_trigger = None
    if config.trigger_signal is not None:
        signal_trigger = SignalTrigger(signal_number(config.trigger_signal))
        problem = signal_trigger.install()
        if problem is not None:
            warn("trigger-signal", f"vt_lightning: `trigger_signal` is off for this run: {problem}.")
            signal_trigger = None
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
    armed = [
        *([f"slow step > {config.slow_step_factor:g}x median"] if config.slow_step_factor is not None else []),
        *(
            [f"{memory_kind} +{config.memory_growth:.0%} over {config.memory_growth_steps} batches"]
            if config.memory_growth is not None
            else []
        ),
        *([f"signal {signal_trigger.signum.name}"] if signal_trigger is not None else []),
        *([f"file {trigger_path}"] if trigger_path is not None else []),
    ]
    rank_zero_info(f"vt_lightning: triggers armed: {'; '.join(armed)}")
    return ArmedTriggers(watch, signal_trigger, group)
