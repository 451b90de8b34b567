"""What a run is, read from the Trainer's attributes here, so that a Lightning change lands here."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.profilers import AdvancedProfiler, PyTorchProfiler

from vt_lightning.analysis.usercode import command_functions
from vt_lightning.constants import STAGES
from vt_lightning.controller.messages import Warn
from vt_lightning.controller.remote import output_root
from vt_lightning.export.job import URL
from vt_lightning.options import ConfigurationError
from vt_lightning.recording.lightning_hooks import user_hook_names
from vt_lightning.recording.pytracer import interpreter_warning

# Why a window still open when a stage ends was cut there (the cut-window warning says it).
END_REASONS = {
    "fit": "training ended first (max_steps, max_epochs, limit_train_batches, fast_dev_run or a stop request)",
    "validate": "validation ran out of batches",
    "test": "testing ran out of batches",
    "predict": "prediction ran out of batches",
}
assert set(END_REASONS) == set(STAGES)


@dataclass(frozen=True)
class Run:
    """The facts of one run that windows need: where files go and who this process is."""

    stage: str
    root: Path
    rank_info: dict[str, Any]  # global/local/node rank, world size, host, pid (window metadata)
    cuda: bool
    user_hooks: dict[str, str] = dataclasses.field(default_factory=dict)  # window metadata: the module's own hooks
    remote: URL | None = None  # a remote output root (``root`` is then local staging): controller/remote.py
    device: str = "cpu"  # the root device's type: "cpu", "cuda", "mps", "xla", ...
    command: list[str] = dataclasses.field(default_factory=list)  # window metadata: `python -c`'s functions

    @property
    def output(self) -> Path | URL:
        """Where the user finds this run's window directories."""
        return self.remote if self.remote is not None else self.root

    @property
    def global_rank(self) -> int:
        return int(self.rank_info.get("global_rank", 0))


def read_run(trainer: Any, stage: str, dirpath: str | None, spool_dir: str | None = None) -> Run:
    """Collective: every rank must call it (``trainer.log_dir`` is broadcast from rank 0)."""
    root, remote = output_root(dirpath, trainer.log_dir, trainer.default_root_dir, spool_dir)  # URLs: never Path()
    rank_info = {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    device = str(trainer.strategy.root_device.type)
    hooks = user_hook_names(getattr(trainer, "lightning_module", None))
    return Run(stage, root, rank_info, device == "cuda", hooks, remote, device, main_command_functions())


def main_command_functions() -> list[str]:
    """The functions of the ``python -c`` command this process runs (``usercode.command_functions``),
    ``[]`` when ``__main__`` came from a file, a module or stdin. The command follows ``-c`` (or
    ``-Ic``...) in ``sys.orig_argv``, before the arguments ``sys.argv`` holds after ``"-c"``."""
    argv, orig = sys.argv, sys.orig_argv
    at = len(orig) - len(argv)
    if not argv or argv[0] != "-c" or at < 2 or not (orig[at - 1].startswith("-") and orig[at - 1].endswith("c")):
        return []
    return command_functions(orig[at])


def trains_on_cpu(run: Run) -> bool:
    """Training's own threads take every core (``handoff.HAND_OFF_START_ON_CPU``)."""
    return run.device == "cpu"


def stage_name(stage: Any) -> str:
    """Lightning passes ``TrainerFn`` members (a str enum: ``TrainerFn.FITTING == "fit"``)."""
    return str(getattr(stage, "value", stage))


def global_batch(trainer: Any) -> int:
    """0-based index of the current training batch across epochs (restored on resume)."""
    return int(trainer.fit_loop.total_batch_idx)


def fit_end_batch(trainer: Any) -> int | None:
    """The global batch count at which fit stops by ``max_steps`` or ``max_epochs`` (None: unbounded)."""
    bounds = []
    max_steps = getattr(trainer, "max_steps", -1)
    if isinstance(max_steps, int) and max_steps > 0:
        accumulate = getattr(trainer, "accumulate_grad_batches", 1)
        bounds.append(max_steps * (accumulate if isinstance(accumulate, int) and accumulate > 0 else 1))
    max_epochs = getattr(trainer, "max_epochs", None)
    per_epoch = getattr(trainer, "num_training_batches", None)
    if isinstance(max_epochs, int) and max_epochs > 0 and isinstance(per_epoch, int):
        epochs_left = max(max_epochs - int(trainer.current_epoch), 0)
        epoch_start = global_batch(trainer) + 1 - int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)
        bounds.append(epoch_start + per_epoch * epochs_left)
    return min(bounds, default=None)


_EVAL_BATCHES = {"validate": "num_val_batches", "test": "num_test_batches", "predict": "num_predict_batches"}


def stage_batches(trainer: Any, stage: str) -> int | None:
    """The batches a validate / test / predict stage runs, over its dataloaders (None: unknown or
    unbounded); known from ``on_<stage>_start`` on, ``limit_*_batches`` applied."""
    counts = getattr(trainer, _EVAL_BATCHES.get(stage, ""), None)
    total = sum(counts) if isinstance(counts, list) and counts else None
    return int(total) if isinstance(total, (int, float)) and math.isfinite(total) else None


def batches_started(trainer: Any) -> int:
    """Training batches started so far; the one in progress included."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.total.ready)


def batches_completed(trainer: Any) -> int:
    """Training batches finished so far: at fit's end, every batch it ran (after a mid-epoch resume
    Lightning 2.4 counts one batch more ready than it ran)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.total.completed)


def log_step(trainer: Any) -> int:
    """The step Lightning logs this batch's metrics at (as its LearningRateMonitor reads it)."""
    loop = trainer.fit_loop.epoch_loop
    return int(getattr(loop, "_batches_that_stepped", trainer.global_step))


def any_rank(trainer: Any) -> Callable[[bool], bool]:
    """A decision every rank takes together, at the same batch: True on all when True on any."""
    if trainer.world_size <= 1:
        return bool
    strategy = trainer.strategy
    return lambda flag: bool(strategy.reduce_boolean_decision(flag, all=False))


def should_record(
    run: Run, options: Any, trainer: Any, superseded_by: str | None, warn: Warn
) -> tuple[bool, str | None]:
    """Whether this rank records in this run, and the rival Lightning profiler if any; says why not."""
    world = run.rank_info["world_size"]
    if options.ranks is not None and any(r >= world for r in options.ranks):
        unknown = [r for r in options.ranks if r >= world]
        raise ConfigurationError(f"`ranks` names {unknown}, but this run has world_size={world}")
    enabled = options.ranks is None or run.global_rank in options.ranks
    if superseded_by is not None:
        warn(
            "duplicate",
            f"vt_lightning: VT_LIGHTNING is set, but the Trainer already has {superseded_by} (given in code "
            "or on the command line); that one profiles, the one from VT_LIGHTNING stays idle and its "
            "VT_LIGHTNING_* options are ignored.",
        )
        return False, None
    if enabled and options.memory_snapshot and not run.cuda and not options.torch.profile_memory:
        warn(
            "cpu-memory",
            "vt_lightning: on CPU the memory snapshot is built from torch.profiler's memory events, "
            "which `profile_memory=False` turns off: no memory snapshots will be written.",
        )
    known_bug = interpreter_warning()
    if known_bug and enabled:
        warn("interpreter", known_bug)
    # Lightning profilers that own torch.profiler or the profile hook (not Simple or PassThrough).
    profiler = getattr(trainer, "profiler", None)
    rival = type(profiler).__name__ if isinstance(profiler, (PyTorchProfiler, AdvancedProfiler)) else None
    if rival is not None and enabled:
        enabled = False
        warn(
            "lightning-profiler",
            f"vt_lightning: Trainer(profiler=...) is {rival}, which takes over the same profiling hooks; "
            "VizTraceCallback records nothing in this run. Remove one of the two.",
        )
    return enabled, rival
