"""Lightning hooks -> profiling windows. Thin: the schedule, tracers, merge and output live elsewhere."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import sys
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from vt_lightning import __version__
from vt_lightning.analysis.filters import PythonFilter, module_hook_locations, path_matches_anything, path_prefixes
from vt_lightning.analysis.schedule import Schedule, Window
from vt_lightning.analysis.sources import Planned, WindowPlan
from vt_lightning.analysis.triggers import TRIGGER_FILE_NAME, Firing, TriggerConfig, signal_number
from vt_lightning.controller.agreement import Agreement, gloo_agreement
from vt_lightning.controller.handoff import BackgroundWriter, WriterAbandoned
from vt_lightning.controller.warn import WarnOnce
from vt_lightning.controller.watch import TriggerWatch
from vt_lightning.export.atomic import remove_stale_temporaries
from vt_lightning.export.layout import (
    host_name,
    memory_file_name,
    span_name,
    trace_file_name,
    window_dir_name,
    worker_name,
)
from vt_lightning.export.pipeline import BROWSER_LIMIT_BYTES, WindowJob, WindowResult, finish_window
from vt_lightning.recording.lightning_view import LightningViewHooks
from vt_lightning.recording.memory import CudaMemoryRecorder, dump_oom_snapshot, is_cuda_oom, oom_file_name
from vt_lightning.recording.probes import SignalTrigger, foreign_signal_handler, memory_reader
from vt_lightning.recording.pytracer import (
    PythonTracer,
    PythonTracerConfig,
    foreign_profiler,
    interpreter_warning,
    reap_dump_children,
)
from vt_lightning.recording.rivals import RivalProfiler
from vt_lightning.recording.spool import Spool, SpoolError, check_spool_dir, spool_directory
from vt_lightning.recording.torchtracer import TorchTracer, TorchTracerConfig, torch_profiler_active
from vt_lightning.recording.window import ProfilingWindow

log = logging.getLogger("vt_lightning")


class VizTraceCallback(Callback):
    """Trace your Python code (VizTracer) and torch's ops (torch.profiler) on one timeline.

    For the training batches a schedule selects (``torch.profiler.schedule`` semantics, one step =
    one training batch, counted globally from 0), each window becomes one merged
    ``<host>_<rank>.<span>.pt.trace.json.gz`` in a run directory of its own under the logger's log
    dir, which TensorBoard's PyTorch Profiler tab, Perfetto UI, chrome://tracing and vizviewer open.
    Outside windows no profiling hook is installed.

    Args:
        skip_first: batches to skip before the first cycle.
        wait: batches of each cycle with no profiling.
        warmup: batches of each cycle where torch.profiler runs but its events are discarded.
        active: batches of each cycle that are recorded (>= 1).
        repeat: number of cycles (windows); 0 repeats until training ends.
        dirpath: where window run directories go; default: the logger's log dir
            (``lightning_logs/version_N``), else ``trainer.log_dir`` / ``default_root_dir``.
        tracer_entries: VizTracer ring-buffer size in events; on overflow the oldest are lost.
        max_stack_depth: deepest Python call kept, counted from the outermost call of your code
            (a LightningModule hook such as ``training_step`` is depth 1; -1: no limit).
        min_duration: drop Python calls shorter than this many microseconds.
        include_files: keep only Python calls whose code is under these paths, wherever their
            callers live (torch's ops and kernels are always kept).
        exclude_files: drop Python calls whose code is under these paths; calls they make into
            other code are kept.
        ignore_c_function: do not record calls into C functions (builtins, extensions).
        record_shapes: record operator input shapes (torch.profiler).
        profile_memory: record tensor allocations (torch.profiler; needed for the Memory view).
        with_flops: estimate FLOPs of matrix ops (torch.profiler).
        memory_snapshot: write a memory-snapshot pickle per window (pytorch.org/memory_viz).
        memory_max_entries: allocator events kept per window for the CUDA snapshot.
        lightning_view: record ``[pl][module]`` / ``[pl][profile]`` ranges during active batches so
            TensorBoard offers its "Lightning" view.
        ranks: global ranks that trace (None: all).
        compression_level: gzip level of the trace files (1 fastest, 9 smallest).
        stages: which of ``trainer.fit`` / ``validate`` / ``test`` / ``predict`` are profiled; each
            runs the schedule on its own batches (counted from 0), and its windows are named by
            stage (``validate-window_000-batches_2-4``). Validation inside ``fit`` is not a stage:
            inside a window it shows as a ``[pl][profile]validation`` range.
        summary: write ``<worker>.<span>.summary.json`` / ``.md`` per window (computed in the writer
            process), log its scalars to the Trainer's loggers and print a table at the end of fit.
        slow_step_factor: open a window when a step takes longer than this many times the median of
            recent steps (> 1; None: off). See docs/triggers.md.
        slow_step_baseline: steps in that median; the trigger arms once this many were measured.
        memory_growth: open a window when memory in use (CUDA allocated, or RSS on CPU) grew by more
            than this fraction (0.2 = +20%) over ``memory_growth_steps`` batches (None: off).
        memory_growth_steps: batches over which growth is measured (none are sampled before it).
        trigger_file: a file ``vt_lightning.trigger`` created in ``output_dir`` opens a window (and
            is deleted). Opt-in: with DDP, any armed trigger makes the ranks join a small gloo group.
        trigger_signal: a signal name (e.g. ``"SIGUSR1"``) that opens a window; None: off.
        trigger_cooldown: batches between the end of a triggered window and the next slow-step or
            memory-growth window.
        trigger_interval: seconds between checks of the file, signal, memory (and, with DDP, the
            ranks' agreement); 0: every batch.
        max_windows: most windows in the run, scheduled and triggered together (None: no limit).
        scheduled_windows: False: no scheduled windows, only triggered ones.
        spool_dir: where raw dumps wait for the writer (default: ``$TMPDIR``, else ``/tmp``, or
            ``/var/tmp`` if ``/tmp`` is a RAM tmpfs; never ``/dev/shm``, which DataLoader workers
            need); a window whose dump might not fit there is dropped with a warning.
        writer_timeout: the most seconds training waits for the writer, at a window's start (for
            room) and at the end of fit (for the last windows); past it the window is dropped, the
            stuck writer is killed, and training goes on.

    Example::

        trainer = Trainer(callbacks=[VizTraceCallback(wait=1, warmup=1, active=3, repeat=2)])
        trainer.fit(model)
        # tensorboard --logdir lightning_logs  ->  PyTorch Profiler tab
    """

    def __init__(
        self,
        skip_first: int = 0,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        dirpath: str | None = None,
        tracer_entries: int = 1_000_000,
        max_stack_depth: int = -1,
        min_duration: float = 0.0,
        include_files: list[str] | None = None,
        exclude_files: list[str] | None = None,
        ignore_c_function: bool = False,
        record_shapes: bool = False,
        profile_memory: bool = True,
        with_flops: bool = False,
        memory_snapshot: bool = True,
        memory_max_entries: int = 100_000,
        lightning_view: bool = True,
        ranks: list[int] | None = None,
        compression_level: int = 3,
        stages: list[str] | None = None,
        summary: bool = True,
        slow_step_factor: float | None = None,
        slow_step_baseline: int = 50,
        memory_growth: float | None = None,
        memory_growth_steps: int = 100,
        trigger_file: bool = False,
        trigger_signal: str | None = None,
        trigger_cooldown: int = 100,
        trigger_interval: float = 0.5,
        max_windows: int | None = None,
        scheduled_windows: bool = True,
        spool_dir: str | None = None,
        writer_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self.schedule = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
        _check_int("tracer_entries", tracer_entries, minimum=1)
        _check_int("max_stack_depth", max_stack_depth, minimum=-1)
        _check_int("memory_max_entries", memory_max_entries, minimum=1)
        _check_int("compression_level", compression_level, minimum=1, maximum=9)
        if (
            isinstance(min_duration, bool)
            or not isinstance(min_duration, (int, float))
            or not (math.isfinite(min_duration) and min_duration >= 0)
        ):
            raise ValueError(f"`min_duration` must be a number of microseconds >= 0, got {min_duration!r}")
        if include_files is not None and exclude_files is not None:
            raise ValueError("`include_files` and `exclude_files` cannot both be set; choose one")
        include = _check_paths("include_files", include_files)
        exclude = _check_paths("exclude_files", exclude_files)
        for name, paths in (("include_files", include), ("exclude_files", exclude)):
            for path in paths or ():
                if not path_matches_anything(path):
                    rank_zero_warn(f"`{name}` entry {path!r} matches no file or directory; it filters nothing.")
        self.spool_dir = check_spool_dir(spool_dir)
        if (
            isinstance(writer_timeout, bool)
            or not isinstance(writer_timeout, (int, float))
            or not (math.isfinite(writer_timeout) and writer_timeout > 0)
        ):
            raise ValueError(f"`writer_timeout` must be a number of seconds > 0, got {writer_timeout!r}")
        self.writer_timeout = float(writer_timeout)
        if dirpath is not None and (not isinstance(dirpath, (str, os.PathLike)) or not str(dirpath)):
            raise ValueError(f"`dirpath` must be a non-empty path or None, got {dirpath!r}")
        for name, flag in (
            ("ignore_c_function", ignore_c_function),
            ("record_shapes", record_shapes),
            ("profile_memory", profile_memory),
            ("with_flops", with_flops),
            ("memory_snapshot", memory_snapshot),
            ("lightning_view", lightning_view),
            ("summary", summary),
        ):
            if not isinstance(flag, bool):
                raise ValueError(f"`{name}` must be True or False, got {flag!r}")
        if ranks is not None:
            if not isinstance(ranks, (list, tuple)) or not ranks:
                raise ValueError(f"`ranks` must be a non-empty list of global ranks or None, got {ranks!r}")
            for rank in ranks:
                _check_int("ranks", rank, minimum=0)
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"`ranks` lists a rank twice: {ranks!r}")

        self.stages = _check_stages(stages)
        self.dirpath = str(dirpath) if dirpath is not None else None
        self.python_config = PythonTracerConfig(
            tracer_entries=tracer_entries,
            max_stack_depth=max_stack_depth,
            min_duration=float(min_duration),
            include_files=include,
            exclude_files=exclude,
            ignore_c_function=ignore_c_function,
        )
        self.torch_config = TorchTracerConfig(
            record_shapes=record_shapes, profile_memory=profile_memory, with_flops=with_flops
        )
        self.memory_snapshot = memory_snapshot
        self.lightning_view = lightning_view
        self.memory_max_entries = memory_max_entries
        self.ranks = list(ranks) if ranks is not None else None
        self.compression_level = compression_level
        self.summary = summary
        self.triggers = TriggerConfig(
            slow_step_factor=slow_step_factor,
            slow_step_baseline=slow_step_baseline,
            memory_growth=memory_growth,
            memory_growth_steps=memory_growth_steps,
            trigger_file=trigger_file,
            trigger_signal=trigger_signal,
            trigger_cooldown=trigger_cooldown,
            trigger_interval=trigger_interval,
            max_windows=max_windows,
        )
        if not isinstance(scheduled_windows, bool):
            raise ValueError(f"`scheduled_windows` must be True or False, got {scheduled_windows!r}")
        self.scheduled_windows = scheduled_windows
        if not scheduled_windows and not self.triggers.armed:
            raise ValueError(
                "`scheduled_windows`: False with no trigger armed would record nothing: arm a trigger "
                "(slow_step_factor, memory_growth, trigger_file, trigger_signal) or keep the schedule"
            )
        if trigger_signal is not None and foreign_signal_handler(signal_number(trigger_signal)) is not None:
            raise ValueError(
                f"`trigger_signal`: {trigger_signal} already has a handler "
                f"({foreign_signal_handler(signal_number(trigger_signal))!r}); choose another signal"
            )

        self._warn = WarnOnce()
        self._python: PythonTracer | None = None
        self._python_filter: PythonFilter | None = None
        self._window: ProfilingWindow | None = None
        self._writer: BackgroundWriter | None = None
        self._spool: Spool | None = None
        self._root: Path | None = None
        self._enabled = False
        self._next_step: float = math.inf
        self._next_check: float = math.inf  # with the slow-step trigger: batches up to here only read the clock
        self._plan = WindowPlan(self.schedule, scheduled_windows, max_windows, trigger_cooldown)
        self._planned: Planned | None = None  # what the open window is (scheduled or why triggered)
        self._watch: TriggerWatch | None = None
        self._slow_step: Any = None  # the watch's SlowStep, read on every batch
        self._signal: SignalTrigger | None = None
        self._group: Any = None
        self._triggered_runs: list[tuple[str, Firing]] = []
        self._rank_info: dict[str, Any] = {}
        self._cuda = False
        self._completed: set[int] = set()
        self.results: list[WindowResult] = []
        self.windows_skipped = 0
        self._stage: str | None = None  # the stage being profiled (set in setup, cleared at its end)
        self._eval_step = -1  # batch index within a validate / test / predict stage
        self._windows_recorded = 0  # windows of this run that recorded at least one batch
        self._batches_seen = 0
        self._trainer: Any = None  # weakref to the Trainer, for the logging step at window close
        self._unlogged: deque[WindowResult] = deque()  # summaries the writer returned, not yet logged

    def __repr__(self) -> str:
        s = self.schedule
        return (
            f"{type(self).__name__}(skip_first={s.skip_first}, wait={s.wait}, warmup={s.warmup}, "
            f"active={s.active}, repeat={s.repeat}, stages={self.stages})"
        )

    @property
    def state_key(self) -> str:
        # The VT_LIGHTNING callback gets its own key: two stateful callbacks with the same key make
        # Trainer() raise, and the env switch may meet one given in code or on the CLI.
        if getattr(self, "_vt_lightning_source", None) == "env":
            return self._generate_state_key(source="env")
        return super().state_key

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        stage = _stage_name(stage)
        if stage not in self.stages:
            return
        self._start_run(stage)
        log_dir = trainer.log_dir  # every rank must call it: it is broadcast from rank 0
        self._trainer = weakref.ref(trainer)
        rank = trainer.global_rank
        if self.ranks is not None:
            unknown = [r for r in self.ranks if r >= trainer.world_size]
            if unknown:
                raise ValueError(f"`ranks` names {unknown}, but this run has world_size={trainer.world_size}")
        self._enabled = self.ranks is None or rank in self.ranks
        self._plan = WindowPlan(
            self.schedule, self.scheduled_windows, self.triggers.max_windows, self.triggers.trigger_cooldown
        )
        self._cuda = trainer.strategy.root_device.type == "cuda"
        other = next((cb for cb in trainer.callbacks if isinstance(cb, VizTraceCallback) and cb is not self), None)
        if getattr(self, "_vt_lightning_source", None) == "env" and other is not None:
            self._enabled = False
            self._warn(
                "duplicate",
                f"vt_lightning: VT_LIGHTNING is set, but the Trainer already has {other!r} (given in code "
                "or on the command line); that one profiles, the one from VT_LIGHTNING stays idle and its "
                "VT_LIGHTNING_* options are ignored.",
            )
            self._stage = None
            return
        if self._enabled and self.memory_snapshot and not self._cuda and not self.torch_config.profile_memory:
            self._warn(
                "cpu-memory",
                "vt_lightning: on CPU the memory snapshot is built from torch.profiler's memory events, "
                "which `profile_memory=False` turns off: no memory snapshots will be written.",
            )
        known_bug = interpreter_warning()
        if known_bug and self._enabled:
            self._warn("interpreter", known_bug)
        rival = _rival_lightning_profiler(trainer)
        if rival is not None and self._enabled:
            self._enabled = False
            self._warn(
                "lightning-profiler",
                f"vt_lightning: Trainer(profiler=...) is {rival}, which takes over the same profiling hooks; "
                "VizTraceCallback records nothing in this run. Remove one of the two.",
            )
        self._rank_info = {
            "global_rank": rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        if self.dirpath is not None:
            self._root = Path(self.dirpath)
        else:
            self._root = Path(log_dir or trainer.default_root_dir)
        agreement = self._agreement(trainer, rank) if rival is None else None
        if not self._enabled:
            return
        self._python = self._python or PythonTracer(self.python_config)  # reused: see pytracer._TRACERS
        c = self.python_config
        self._python_filter = PythonFilter(
            include=path_prefixes(c.include_files) if c.include_files is not None else None,
            exclude=path_prefixes(c.exclude_files) if c.exclude_files is not None else None,
            max_depth=c.max_stack_depth,
            hook_locations=module_hook_locations(pl_module),
        )
        self._writer = BackgroundWriter(timeout=self.writer_timeout, on_problem=self._warn)
        # Leftovers of writers killed mid-write; on the writer thread, as a hung mount must not hang setup.
        self._writer.submit(remove_stale_temporaries, self._root)
        self._spool = spool_directory(self.spool_dir)
        if agreement is not None:
            self._arm_triggers(trainer, agreement)
        self._schedule_from(_global_batch(trainer) if stage == "fit" else 0)

    def _start_run(self, stage: str) -> None:
        """A fit / validate / test / predict begins: forget the previous one's windows and results,
        so a callback reused on another Trainer (or for another fit) profiles by its schedule."""
        self._stage = stage
        self._completed = set()  # a resumed fit restores it after setup (load_state_dict)
        self.results = []
        self.windows_skipped = 0
        self._warn = WarnOnce()
        self._eval_step = -1
        self._windows_recorded = 0
        self._batches_seen = 0
        self._window = None
        self._planned = None
        self._triggered_runs = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Quiet batches: one attribute chain and one comparison, no allocation. ``ready`` counts the
        # batch in progress, so the global batch index is ``ready - 1``: ``step < next`` is ``ready <= next``.
        ready = trainer.fit_loop.epoch_loop.batch_progress.total.ready
        if ready <= self._next_step:
            return
        # With the slow-step trigger armed, ``_next_step`` is -1 and quiet batches also read the clock once.
        slow = self._slow_step
        if slow is not None and slow.steady() and ready <= self._next_check:
            return
        if self._unlogged and self._window is None:  # never inside a window: it would be traced
            self._log_summaries(trainer)
        step = _global_batch(trainer)
        try:
            self._scheduled_batch_start(trainer, step)
        except Exception as err:  # a profiler fault never stops training
            self._fail_window(err)
        if self._unlogged:  # arrived meanwhile: log at the next batch
            self._next_step = -1

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._window is None:
            return
        self._batch_end(_global_batch(trainer))

    def _batch_end(self, step: int) -> None:
        window = self._window
        if window is None:
            return
        if self._slow_step is not None:
            self._slow_step.skip_next()  # a batch of a window is no baseline step, nor is the close after it
        try:
            if window.active:
                window.step_end(step)
            if step >= window.window.last_step:
                self._close_window()
        except Exception as err:
            self._fail_window(err)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._slow_step is not None:
            self._slow_step.skip_next()  # the interval across an epoch boundary is no training step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stage == "fit":
            self._batches_seen = trainer.fit_loop.epoch_loop.batch_progress.total.ready
            self._finalize(reason=_END_REASONS["fit"])

    # ---------------------------------------------------------------- validation inside fit
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        window = self._window
        if self._stage == "fit" and window is not None and window.active:
            try:
                window.begin_range("validation")
            except Exception as err:
                self._fail_window(err)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._slow_step is not None:
            self._slow_step.skip_next()  # the interval that holds a validation loop is no training step
        window = self._window
        if self._stage == "fit" and window is not None:
            try:
                window.end_range("validation")
            except Exception as err:
                self._fail_window(err)
        elif self._stage == "validate":
            self._end_eval_stage()

    # ---------------------------------------------------------------- validate / test / predict stages
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._stage == "validate":
            self._eval_batch_start(trainer)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._stage == "validate":
            self._batch_end(self._eval_step)

    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._stage == "test":
            self._eval_batch_start(trainer)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._stage == "test":
            self._batch_end(self._eval_step)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stage == "test":
            self._end_eval_stage()

    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._stage == "predict":
            self._eval_batch_start(trainer)

    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._stage == "predict":
            self._batch_end(self._eval_step)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stage == "predict":
            self._end_eval_stage()

    def _eval_batch_start(self, trainer: pl.Trainer) -> None:
        self._eval_step += 1  # batches of this stage, across its dataloaders, from 0
        if self._eval_step < self._next_step:
            return
        try:
            self._scheduled_batch_start(trainer, self._eval_step)
        except Exception as err:
            self._fail_window(err)

    def _end_eval_stage(self) -> None:
        self._batches_seen = self._eval_step + 1
        self._finalize(reason=_END_REASONS.get(self._stage or "", "the stage ended inside the window"))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning does not call teardown after on_exception.
        if is_cuda_oom(exception):
            self._dump_oom()
        self._finalize(reason=f"{type(exception).__name__} during the window", partial=True)
        self._shutdown()
        self._stage = None

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        stage = _stage_name(stage)
        if stage != self._stage:
            return
        self._finalize(reason=_END_REASONS.get(stage, "the stage ended inside the window"))
        self._report_nothing_recorded()
        self._shutdown()
        self._stage = None

    def state_dict(self) -> dict[str, Any]:
        return {"completed_windows": sorted(self._completed)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores the global batch count; this guards against writing a window twice.
        # The windows are those of training: they say nothing about a validate / test / predict run.
        if self._stage in (None, "fit"):
            self._completed = set(state_dict.get("completed_windows", []))

    # ------------------------------------------------------------------ windows
    def _scheduled_batch_start(self, trainer: pl.Trainer, step: int) -> None:
        window = self._window
        if window is not None and step > window.window.last_step:
            self._close_window()  # its last batch end was never seen
        if self._watch is not None:
            self._ask_triggers(step)
        if self._window is None:
            planned = self._plan.next_window(step)
            if planned is None or step < planned.window.warmup_start:
                self._quiet_until(planned.window.warmup_start if planned is not None else math.inf)
                return
            self._plan.begin(planned)
            target = dataclasses.replace(planned.window, index=planned.number)
            if planned.trigger is None and planned.window.index in self._completed:
                self._skip(target)
                return
            self._planned = planned
            self._window = self._open_window(target, trainer)
            if self._window is None:
                self._skip(target)
                return
            self._quiet_until(step)  # every batch of the window needs a look
        if step >= self._window.window.active_start:
            self._window.step_begin(step)
            self._batches_seen = step + 1

    def _ask_triggers(self, step: int) -> None:
        """Plan a triggered window at this batch if a trigger fired (and the limits allow it)."""
        assert self._watch is not None
        firing = self._watch.check(step, self._plan)
        if firing is None:
            return
        planned, refused = self._plan.request(firing, step, self.schedule.warmup, self.schedule.active)
        if planned is not None:
            return
        if refused == "max_windows":
            self._warn(
                "max-windows",
                f"vt_lightning: max_windows={self.triggers.max_windows} reached; "
                f"later triggers ({firing.reason} at batch {firing.batch} first) open no window.",
            )
        elif refused == "busy" and firing.reason in ("trigger_file", "signal"):
            self._watch.hold(firing)

    def _agreement(self, trainer: pl.Trainer, rank: int) -> Agreement | None:
        """How this rank's triggers agree with the others' (None: no trigger armed). Collective: every
        rank calls it, tracing or not."""
        if not self.triggers.armed:
            return None
        if trainer.world_size <= 1:
            return Agreement(rank)
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self._warn(
                "no-agreement",
                "vt_lightning: several ranks but no torch.distributed process group: "
                "each rank's triggers open windows on that rank only.",
            )
            return Agreement(rank)
        try:
            agreement, self._group = gloo_agreement(rank, self.ranks)
        except Exception as err:
            self._warn(
                "no-agreement",
                f"vt_lightning: could not create the gloo group for the triggers' "
                f"agreement ({err}); each rank's triggers open windows on that rank only.",
            )
            return Agreement(rank)
        return agreement

    def _arm_triggers(self, trainer: pl.Trainer, agreement: Agreement) -> None:
        config = self.triggers
        assert self._root is not None
        trigger_path = None
        if config.trigger_file:
            trigger_path = self._root / TRIGGER_FILE_NAME
            try:
                self._root.mkdir(parents=True, exist_ok=True)  # so the user can drop the file at once
            except OSError as err:
                self._warn("trigger-dir", f"vt_lightning: cannot create {self._root} for the trigger file ({err}).")
        if config.trigger_signal is not None:
            self._signal = SignalTrigger(signal_number(config.trigger_signal))
            problem = self._signal.install()
            if problem is not None:
                self._warn("trigger-signal", f"vt_lightning: `trigger_signal` is off for this run: {problem}.")
                self._signal = None
        read_memory = memory_kind = None
        if config.memory_growth is not None:
            try:
                read_memory, memory_kind = memory_reader(trainer.strategy.root_device if self._cuda else None)
            except Exception as err:  # the check still runs (DDP ranks must stay in step), without memory
                self._warn(
                    "memory-probe",
                    f"vt_lightning: cannot read memory use ({err}); the memory-growth trigger is off for this run.",
                )
        self._watch = TriggerWatch(
            config,
            agreement,
            self._step_clock,
            trigger_path,
            self._signal,
            read_memory,
            memory_kind,
            self._warn,
            first_check=_global_batch(trainer) + 1,
        )
        if self._signal is not None:
            self._signal.on_request = self._look_now
        self._slow_step = self._watch.slow
        armed = [
            *([f"slow step > {config.slow_step_factor:g}x median"] if config.slow_step_factor is not None else []),
            *(
                [f"{memory_kind} +{config.memory_growth:.0%} over {config.memory_growth_steps} batches"]
                if config.memory_growth is not None
                else []
            ),
            *([f"signal {self._signal.signum.name}"] if self._signal is not None else []),
            *([f"file {trigger_path}"] if trigger_path is not None else []),
        ]
        rank_zero_info(f"vt_lightning: triggers armed: {'; '.join(armed)}")

    def _look_now(self) -> None:
        """From the signal handler: in one process, look at the very next batch."""
        watch = self._watch
        if watch is not None and not watch.agreement.distributed:
            watch.request_now()
            self._quiet_until(-1)

    def _quiet_until(self, boundary: float) -> None:
        """Batches before ``boundary`` need no look (with the slow-step trigger: only its clock read)."""
        if self._watch is not None:
            boundary = min(boundary, self._watch.next_check)
        if self._slow_step is not None:
            self._next_step, self._next_check = -1, boundary
        else:
            self._next_step = boundary

    def _open_window(self, target: Window, trainer: pl.Trainer) -> ProfilingWindow | None:
        assert self._python is not None and self._writer is not None
        conflict = foreign_profiler() or (
            "a torch profiler that is already recording" if torch_profiler_active() else None
        )
        if conflict:
            self._warn(
                "conflict:" + conflict,
                f"vt_lightning: {conflict} is active, so window {target.index} (and any other window "
                "meeting it) is skipped; the other tool is left untouched.",
            )
            return None
        waited, room = self._writer.wait_for_room()
        if not room:
            self._warn(
                "writer-stuck",
                f"vt_lightning: the writer did not finish earlier windows within writer_timeout="
                f"{self.writer_timeout:g} s (a hung or very slow filesystem under {self._root}?); window "
                f"{target.index} is dropped, the stuck writer was stopped, and training goes on. Later "
                "windows that find it busy are dropped without waiting.",
            )
            return None
        if waited > 0.05:
            self._warn(
                "backlog",
                f"vt_lightning: windows come faster than the writer finishes them; window {target.index} "
                f"waited {waited:.2f} s for earlier windows to be written. Raise `wait` to space windows out.",
            )
        step_hooks = LightningViewHooks(trainer, trainer.lightning_module) if self.lightning_view else None
        recorder = CudaMemoryRecorder(self.memory_max_entries) if self.memory_snapshot and self._cuda else None
        window = ProfilingWindow(
            target,
            self._python,
            TorchTracer(self.torch_config, cuda_available=self._cuda),
            memory_recorder=recorder,
            step_hooks=step_hooks,
            on_problem=self._warn,
        )
        self._window = window  # before warmup: an interruption from here on finds it and closes it
        try:
            window.warmup()
        except BaseException:
            self._window = None
            window.abort()
            raise
        return window

    def _schedule_from(self, step: int) -> None:
        """Quiet until the warmup of the first window not over by ``step`` (or the next trigger check)."""
        self._quiet_until(self._plan.next_boundary(step))
        if self._unlogged:  # the writer returned a summary: log it at the next batch start
            self._next_step = -1

    def _skip(self, target: Window) -> None:
        self.windows_skipped += 1
        self._schedule_from(target.end)

    def _close_window(self, reason: str | None = None, partial: bool = False) -> None:
        window, self._window = self._window, None
        if window is None:
            return
        try:
            self._hand_off(window, reason, partial)
        except BaseException:
            window.abort()  # interrupted or failed anywhere: no tracer, hook or patch stays behind
            raise

    def _hand_off(self, window: ProfilingWindow, reason: str | None, partial: bool) -> None:
        assert self._root is not None and self._spool is not None and self._writer is not None
        target = window.window
        planned = self._planned
        trigger = planned.trigger if planned is not None else None
        if planned is not None and trigger is None:
            self._completed.add(planned.window.index)
        self._schedule_from(target.end)
        run_dir, worker, span, memory_name = self._paths(window)
        if trigger is not None:
            self._triggered_runs.append((run_dir.name, trigger))
        incomplete = len(window.steps) < len(target.active_steps)
        if incomplete:
            self._warn_cut_window(window, reason or "the window was closed early")
        metadata = {
            "version": __version__,
            "stage": self._stage or "fit",
            "window": target.index,
            "steps": list(window.steps),
            # First and last batch (inclusive), not lists: metadata scales with what was recorded.
            "scheduled_steps": _bounds(target.active_start, target.end),
            "warmup_steps": _bounds(target.warmup_start, target.active_start),
            "schedule": _schedule_dict(self.schedule),
            "partial": partial or incomplete,
            **({"partial_reason": reason} if (partial or incomplete) and reason else {}),
            "tracer": _python_settings(self.python_config),
            "torch": dataclasses.asdict(self.torch_config),
            "lightning_view": self.lightning_view,
            "validation": window.range_log("validation"),
            "trigger": trigger.to_metadata() if trigger is not None else None,
            "worker": worker,
            "span": span,
            "log_step": self._log_step(),
            **self._rank_info,
        }
        job = window.close(
            self._spool,
            metadata,
            run_dir,
            trace_file_name(worker, span),
            memory_name,
            self.compression_level,
        )
        if job is not None:
            job.python_filter = self._python_filter
            self._windows_recorded += 1
            job.summary = self.summary
            self._writer.submit(self._finish_job, job)

    def _warn_cut_window(self, window: ProfilingWindow, reason: str) -> None:
        """A window that ends before its last scheduled batch says so once, with what it holds."""
        target = window.window
        scheduled = f"{target.active_start}-{target.last_step}"
        if window.steps:
            self._warn(
                f"cut:{target.index}",
                f"vt_lightning: {self._stage_label()}window {target.index} was cut short: it holds batches "
                f"{window.steps[0]}-{window.steps[-1]} of the scheduled {scheduled}, because {reason}.",
            )
        elif self._windows_recorded:  # with no window at all, the end-of-run line says it instead
            self._warn(
                f"cut:{target.index}",
                f"vt_lightning: {self._stage_label()}window {target.index} recorded nothing: {reason} during "
                f"its warmup, before its first active batch {target.active_start}.",
            )

    def _stage_label(self) -> str:
        return "" if self._stage in (None, "fit") else f"{self._stage} "

    def _report_nothing_recorded(self) -> None:
        """One line when a run ends without any window, saying why (short run, warmup, skips)."""
        if not self._enabled or self._windows_recorded or self._writer is None:
            return
        first = self.schedule.window(0)
        stage = self._stage or "fit"
        unit = "training batch(es)" if stage == "fit" else f"{stage} batch(es)"
        ran = self._batches_seen
        if self.windows_skipped:
            why = f"{self.windows_skipped} window(s) were skipped (see the warnings above)"
        elif not self.scheduled_windows:
            why = f"{stage} ran {ran} {unit} with only triggers opening windows, and none fired"
        elif ran <= first.warmup_start:
            why = (
                f"{stage} ran {ran} {unit}, and the first window's warmup starts at batch "
                f"{first.warmup_start} (skip_first={self.schedule.skip_first}, wait={self.schedule.wait})"
            )
        else:
            why = (
                f"{stage} ran {ran} {unit} and ended during the first window's warmup "
                f"(batches {first.warmup_start}-{first.active_start - 1}); recording starts at batch "
                f"{first.active_start}"
            )
        rank_zero_info(
            f"vt_lightning: no window was recorded: {why}. Lower `skip_first` / `wait` / `warmup`, or run more batches."
        )

    def _paths(self, window: ProfilingWindow) -> tuple[Path, str, str, str | None]:
        """(run directory, worker, span, memory snapshot name or None) of a window."""
        assert self._root is not None
        target = window.window
        first = window.steps[0] if window.steps else target.active_start
        last = window.steps[-1] if window.steps else target.last_step  # a cut window names what it holds
        worker = worker_name(self._rank_info.get("global_rank", 0), host_name())
        span = span_name(target.active_start)
        snapshots = self.memory_snapshot and (self._cuda or self.torch_config.profile_memory)
        memory_name = memory_file_name(worker, span) if snapshots else None
        reason = self._planned.reason if self._planned is not None else None
        run_dir = self._root / window_dir_name(target.index, first, last, stage=self._stage or "fit", reason=reason)
        return run_dir, worker, span, memory_name

    def _dump_oom(self) -> None:
        """On a CUDA out-of-memory error inside a window, keep the allocator's state of that moment."""
        window = self._window
        if window is None or window.memory_recorder is None or not window.active:
            return
        run_dir, _, _, memory_name = self._paths(window)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            dump_oom_snapshot(run_dir / oom_file_name(memory_name or "memory_snapshot.pickle"), window.memory_recorder)
        except Exception as err:
            self._warn("oom", f"vt_lightning: could not write the out-of-memory snapshot ({err})")

    def _finish_job(self, job: WindowJob) -> WindowResult | None:
        """Runs on the writer thread; the heavy part runs in the writer process when there is one."""
        try:
            result = self._run_job(job)
        except WriterAbandoned:  # reported once, when the writer was given up
            return None
        except SpoolError as err:  # the raw dumps, not the output directory, are the problem
            self._warn(f"spool:{err.errno}", f"vt_lightning: window dropped: {err.strerror}; training goes on.")
            return None
        except Exception as err:
            self._warn(
                f"write:{type(err).__name__}:{job.run_dir.parent}",
                f"vt_lightning: could not write the window to {job.run_dir} ({type(err).__name__}: {err}); "
                "training goes on, and later windows that fail the same way are not reported again.",
            )
            return None
        self.results.append(result)
        for note in result.notes:
            self._warn(f"note:{note.split('(')[0]}", f"vt_lightning: {result.trace_path.name}: {note}")
        if result.overflow:
            self._warn(
                "overflow",
                f"vt_lightning: VizTracer's ring buffer (tracer_entries={self.python_config.tracer_entries}) "
                f"overflowed in {result.trace_path.name}; only the window's last events were kept. "
                f"Set `tracer_entries` to about {result.suggested_tracer_entries or 'twice the current value'} "
                "(estimated from this window's event rate), or record fewer calls with `min_duration` / "
                "`ignore_c_function=True` (`include_files` / `exclude_files` / `max_stack_depth` shrink "
                "the written file, not the ring buffer).",
            )
        if result.json_bytes > BROWSER_LIMIT_BYTES:
            self._warn(
                "large",
                f"vt_lightning: {result.trace_path.name} holds {result.json_bytes / 2**20:.0f} MB of JSON; "
                "browser trace viewers go blank above ~300 MB. Lower `active`, or set `min_duration`, "
                "`max_stack_depth`, `include_files` or `ignore_c_function=True`.",
            )
        log.info("vt_lightning: wrote %s", result.trace_path)
        if result.summary is not None:
            # Loggers are not thread-safe: the training thread logs it at its next batch start
            # (forced off the quiet path) or at the end of fit. Append first, then lower the bar.
            self._unlogged.append(result)
            self._next_step = -1
        return result

    def _run_job(self, job: WindowJob) -> WindowResult:
        writer = self._writer
        return writer.run(job) if writer is not None else finish_window(job)

    def _fail_window(self, err: Exception) -> None:
        window, self._window = self._window, None
        if window is not None:
            self._skip(window.window)
            window.abort()
        if isinstance(err, RivalProfiler):
            self._warn(
                f"rival:{err}",
                f"vt_lightning: {err} started during a window; the window stopped at once and was dropped "
                "so that tool works undisturbed. Later windows that meet it are skipped; training goes on.",
            )
            return
        self._warn(
            f"fault:{type(err).__name__}",
            f"vt_lightning: profiling failed ({type(err).__name__}: {err}); the window was dropped, training goes on.",
        )

    def _finalize(self, reason: str, partial: bool = False) -> None:
        if self._window is not None:
            try:
                self._close_window(reason=reason, partial=partial)
            except Exception as err:
                self._fail_window(err)
        if self._writer is not None and not self._writer.drain():
            self._warn_unfinished()
        trainer = self._trainer() if self._trainer is not None else None
        if self._unlogged and trainer is not None:
            self._log_summaries(trainer)

    def _log_step(self) -> int | None:
        """The step Lightning logs this batch's metrics at (``_batches_that_stepped``, as its own
        LearningRateMonitor does), so the window's scalars line up with the training curves."""
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is None:
            return None
        loop = trainer.fit_loop.epoch_loop
        return int(getattr(loop, "_batches_that_stepped", trainer.global_step))

    def _log_summaries(self, trainer: pl.Trainer) -> None:
        """On the training thread: every returned summary to every logger of the Trainer."""
        from vt_lightning.controller.loggers import log_summary

        while self._unlogged:
            result = self._unlogged.popleft()  # thread-safe against the writer thread's append
            try:
                log_summary(trainer.loggers, result.summary or {}, result.summary_markdown)
            except Exception as err:
                self._warn(
                    f"logger:{type(err).__name__}",
                    f"vt_lightning: could not log a window summary to the Trainer's loggers "
                    f"({type(err).__name__}: {err}); the summary files are written anyway.",
                )

    def _shutdown(self) -> None:
        if self._writer is not None:
            if not self._writer.close():
                self._warn_unfinished()
            self._writer = None
            if self.results:
                _print_end_of_fit(
                    self._root,
                    len(self.results),
                    [r.summary for r in self.results if r.summary is not None],
                    [f"{name}: {firing.describe()}" for name, firing in self._triggered_runs],
                )
        reap_dump_children()  # of windows interrupted between their dump and its hand-off
        if self._spool is not None:
            self._spool.remove()
            self._spool = None
        self._next_step = self._next_check = math.inf
        self._slow_step = None
        if self._signal is not None:
            self._signal.restore()
            self._signal = None
        if self._group is not None:
            group, self._group = self._group, None
            try:
                import torch.distributed as dist

                dist.destroy_process_group(group)
            except Exception:
                pass

    # The clock of the slow-step trigger and the trigger checks (tests inject a deterministic one).
    _step_clock = staticmethod(time.perf_counter_ns)

    def _warn_unfinished(self) -> None:
        self._warn(
            "writer-stuck-end",
            f"vt_lightning: the writer did not finish the last window(s) within writer_timeout="
            f"{self.writer_timeout:g} s (a hung or very slow filesystem under {self._root}?); they are "
            "dropped and the stuck writer was stopped, so fit is not held up.",
        )

    @property
    def output_dir(self) -> Path | None:
        """Where this run's window directories go (known after ``setup``)."""
        return self._root


STAGES = ("fit", "validate", "test", "predict")
_END_REASONS = {
    "fit": "training ended first (max_steps, max_epochs, limit_train_batches, fast_dev_run or a stop request)",
    "validate": "validation ran out of batches",
    "test": "testing ran out of batches",
    "predict": "prediction ran out of batches",
}


def _stage_name(stage: Any) -> str:
    """Lightning passes ``TrainerFn`` members (a str enum: ``TrainerFn.FITTING == "fit"``)."""
    return str(getattr(stage, "value", stage))


def _check_stages(stages: list[str] | None) -> tuple[str, ...]:
    if stages is None:
        return ("fit",)
    if isinstance(stages, (str, bytes)) or not isinstance(stages, (list, tuple)) or not stages:
        raise ValueError(f"`stages` must be a non-empty list drawn from {list(STAGES)}, got {stages!r}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"`stages` names {unknown}, which are not stages; choose from {list(STAGES)}")
    if len(set(stages)) != len(stages):
        raise ValueError(f"`stages` lists a stage twice: {stages!r}")
    return tuple(stages)


@rank_zero_only
def _print_end_of_fit(root: Path | None, files: int, summaries: list[dict[str, Any]], triggered: list[str]) -> None:
    """The windows' table, why triggered windows opened, and commands that work without an
    activated venv."""
    command = f"{sys.executable} -m vt_lightning"
    if summaries:
        from vt_lightning.export.report import print_windows_table

        try:
            print_windows_table(sorted(summaries, key=lambda s: s["window"].get("index") or 0))
        except Exception as err:  # a console problem never fails the run
            log.warning("vt_lightning: could not print the summary table (%s)", err)
    rank_zero_info(
        f"vt_lightning: {files} window trace(s) in {root}\n"
        + "".join(f"  {line}\n" for line in triggered)
        + f"  summary: {command} summary {root}\n"
        f"  view:    {command} view {root}   (Perfetto UI, offline)\n"
        f"  or:      tensorboard --logdir {root}  (PyTorch Profiler tab)"
    )


def _rival_lightning_profiler(trainer: pl.Trainer) -> str | None:
    """Lightning profilers that own torch.profiler or the profile hook (Simple/PassThrough are fine)."""
    from lightning.pytorch.profilers import AdvancedProfiler, PyTorchProfiler

    profiler = trainer.profiler
    if isinstance(profiler, (PyTorchProfiler, AdvancedProfiler)):
        return type(profiler).__name__
    return None


def _global_batch(trainer: pl.Trainer) -> int:
    """0-based index of the current training batch across epochs (restored on resume)."""
    return trainer.fit_loop.total_batch_idx


def _schedule_dict(schedule: Schedule) -> dict[str, int]:
    return {
        "skip_first": schedule.skip_first,
        "wait": schedule.wait,
        "warmup": schedule.warmup,
        "active": schedule.active,
        "repeat": schedule.repeat,
    }


def _python_settings(config: PythonTracerConfig) -> dict[str, Any]:
    return {
        "tracer_entries": config.tracer_entries,
        "max_stack_depth": config.max_stack_depth,
        "min_duration": config.min_duration,
        "include_files": list(config.include_files) if config.include_files is not None else None,
        "exclude_files": list(config.exclude_files) if config.exclude_files is not None else None,
        "ignore_c_function": config.ignore_c_function,
    }


def _bounds(start: int, end: int) -> list[int]:
    """``[first, last]`` of the batches ``[start, end)``; ``[]`` when there are none."""
    return [start, end - 1] if end > start else []


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"`{name}` must be an integer {bound}, got {value!r}")


def _check_paths(name: str, paths: list[str] | None) -> tuple[str, ...] | None:
    if paths is None:
        return None
    # A list or tuple only: a string would be split into characters, a dict or set is a slip.
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p for p in paths):
        raise ValueError(f"`{name}` must be a list of non-empty paths, got {paths!r}")
    return tuple(os.path.abspath(p) for p in paths)
