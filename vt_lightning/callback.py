"""Lightning hooks -> one ``WindowController`` call each. Every hook is a fault boundary: a fault
raised below becomes a warning, never the end of the user's training."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from vt_lightning.analysis.schedule import Schedule
from vt_lightning.constants import WRITER_TIMEOUT_S
from vt_lightning.controller import WindowController, messages
from vt_lightning.controller.run import batches_completed, global_batch, stage_name
from vt_lightning.export.job import URL, WindowResult
from vt_lightning.options import ConfigurationError, Options, make_options
from vt_lightning.recording.workers import raised_by_signal_handler, worker_failures_deferred

Hook = TypeVar("Hook", bound=Callable[..., Any])


def _fault_boundary(hook: Hook) -> Hook:
    """The fault boundary of a hook (``VizTraceCallback._fault``). The two training-batch hooks
    write it out: forwarding their arguments would cost every quiet batch an allocation."""

    @functools.wraps(hook)
    def guarded(self: VizTraceCallback, *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, *args, **kwargs)
        except Exception as err:  # the fault boundary
            self._fault(err, hook.__name__)
            return None

    return cast(Hook, guarded)


class TwoCallbacks(ConfigurationError, RuntimeError):
    """Two VizTraceCallbacks in one Trainer."""


class VizTraceCallback(Callback):
    """Trace your Python code (VizTracer) and torch's ops (torch.profiler) on one timeline.

    Each window of training batches the schedule selects (``torch.profiler.schedule`` semantics,
    batches counted from the fit's first batch, a resumed fit's too) becomes a trace with its
    summary and verdicts under the logger's log dir: see TensorBoard's VT_LIGHTNING tab, or
    ``vt-lightning summary|view <log dir>``.

    Args:
        skip_first: batches to skip before the first cycle.
        wait: batches of each cycle with no profiling.
        warmup: batches of each cycle where torch.profiler runs but its events are discarded.
        active: batches of each cycle that are recorded (>= 1).
        repeat: number of cycles (windows); 0 repeats until training ends.
        dirpath: where window directories go; default: the logger's log dir, else ``default_root_dir``.
        tracer_entries: VizTracer ring-buffer size in events; on overflow the oldest are lost.
        max_stack_depth: deepest Python call kept, from your outermost call (``training_step``: 1; -1: no limit).
        min_duration: drop Python calls shorter than this many microseconds.
        include_files: keep only Python calls whose code is under these paths (torch's ops are always kept).
        exclude_files: drop Python calls whose code is under these paths (not the calls they make elsewhere).
        ignore_c_function: do not record calls into C functions (builtins, extensions).
        record_shapes: record operator input shapes (torch.profiler).
        profile_memory: record tensor allocations (torch.profiler; needed for the Memory view).
        with_flops: estimate FLOPs of matrix ops (torch.profiler).
        memory_snapshot: write a memory-snapshot pickle per window (pytorch.org/memory_viz).
        memory_max_entries: allocator events kept per window for the CUDA snapshot.
        lightning_view: record ``[pl][module]`` / ``[pl][profile]`` ranges for TensorBoard's "Lightning" view.
        ranks: global ranks that trace (None: all).
        compression_level: gzip level of the trace files (1 fastest, 9 smallest).
        stages: which of ``fit`` / ``validate`` / ``test`` / ``predict`` are profiled, each on its own batches.
        summary: write a summary per window, log its scalars to the Trainer's loggers and print a table.
        slow_step_factor: open a window when a step takes over this many times the recent median (None: off).
        slow_step_baseline: steps in that median; the trigger arms once this many were measured.
        memory_growth: open a window when memory in use grew by over this fraction (0.2 = +20%; None: off).
        memory_growth_steps: batches over which growth is measured (none are sampled before it).
        trigger_file: a file ``vt_lightning.trigger`` created in ``output_dir`` opens a window (and
            is deleted). Opt-in: with DDP, any armed trigger makes the ranks join a small gloo group.
        trigger_signal: a signal name (e.g. ``"SIGUSR1"``) that opens a window; None: off.
        trigger_cooldown: batches after a triggered window before the next slow-step or memory-growth one.
        trigger_interval: seconds between checks of the file, signal, memory and DDP ranks; 0: every batch.
        budget_windows: most windows in the run (None: no limit); past any budget limit, no window opens.
        scheduled_windows: False: no scheduled windows, only triggered ones.
        spool_dir: where raw dumps wait for the writer (default: ``$TMPDIR``, else ``/tmp`` or ``/var/tmp``).
        writer_timeout: most seconds training waits for the writer in the whole run; then its windows drop.
        budget_output_mb: most megabytes of window files (traces, memory snapshots) in the run (None: no limit).
        budget_time_share: most share of the run's time windows may add, past 3 s (0.1 = 10%; None: no limit).
        keep_windows: keep only the newest this many of the run's windows on disk (None: keep all).
        trace_workers: trace the train DataLoader's workers while they fetch a window's batches.
        worker_calls: what a traced worker records: ``"user"`` (your dataset and collate code) or ``"all"``.

    Example::

        trainer = Trainer(callbacks=[VizTraceCallback(wait=1, warmup=1, active=3, repeat=2)])
        trainer.fit(model)  # then: tensorboard --logdir lightning_logs, the VT_LIGHTNING tab
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
        stages: Sequence[str] = ("fit",),
        summary: bool = True,
        slow_step_factor: float | None = None,
        slow_step_baseline: int = 50,
        memory_growth: float | None = None,
        memory_growth_steps: int = 100,
        trigger_file: bool = False,
        trigger_signal: str | None = None,
        trigger_cooldown: int = 100,
        trigger_interval: float = 0.5,
        budget_windows: int | None = 1000,
        scheduled_windows: bool = True,
        spool_dir: str | None = None,
        writer_timeout: float = WRITER_TIMEOUT_S,
        budget_output_mb: float | None = 10_240.0,
        budget_time_share: float | None = 0.1,
        keep_windows: int | None = None,
        trace_workers: bool = True,
        worker_calls: str = "user",
    ) -> None:
        super().__init__()
        arguments = locals()
        self.options: Options = make_options({name: arguments[name] for name in _PARAMETERS})
        self._controller = WindowController(self.options)

    vt_lightning_source: str | None = None  # "env" when made by the VT_LIGHTNING switch

    def __getstate__(self) -> dict[str, Any]:
        """A pickle (``strategy="ddp_spawn"`` pickles the Trainer) or a deep copy keeps the options; the
        runtime state (locks, queues, the open window, results) stays with this process."""
        return {name: value for name, value in self.__dict__.items() if name != "_controller"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._controller = WindowController(self.options)

    def __repr__(self) -> str:
        schedule = ", ".join(f"{name}={value}" for name, value in self.options.settings()["schedule"].items())
        return f"{type(self).__name__}({schedule}, stages={list(self.options.stages)})"

    @property
    def state_key(self) -> str:
        # Trainer() refuses two stateful callbacks with one key: the VT_LIGHTNING one may meet another.
        if self.vt_lightning_source == "env":
            return self._generate_state_key(source="env")
        return super().state_key

    @property
    def schedule(self) -> Schedule:
        return self.options.schedule

    @property
    def results(self) -> list[WindowResult]:
        """What the writer wrote for this run's newest windows (up to 16; complete after the stage)."""
        return list(self._controller.outcomes.results)

    @property
    def windows_skipped(self) -> int:
        return self._controller.windows_skipped

    @property
    def output_dir(self) -> Path | URL | None:
        """Where this run's window directories go (known after ``setup``)."""
        run = self._controller.run
        return run.output if run is not None else None

    def _fault(self, err: Exception, hook: str) -> None:
        """A fault of ours becomes one warning per kind (``WindowController.fail``); a setting the run
        cannot honour, or what a signal handler raised (a dead DataLoader worker's), goes on to Lightning."""
        if isinstance(err, ConfigurationError) or raised_by_signal_handler(err):
            raise err
        self._controller.fail(err, hook)

    @_fault_boundary
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        callbacks = [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, VizTraceCallback)]
        given = [cb for cb in callbacks if cb.vt_lightning_source is None]
        if len(given) > 1:  # one tracer per process: two callbacks would fight over it
            raise TwoCallbacks(messages.two_callbacks([repr(cb) for cb in given]))
        # With VT_LIGHTNING set beside a callback given in code or on the CLI, that one profiles.
        other = next((cb for cb in callbacks if cb is not self), None) if self.vt_lightning_source == "env" else None
        self._controller.setup(trainer, pl_module, stage_name(stage), repr(other) if other is not None else None)

    @_fault_boundary
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.train_start(trainer)

    @_fault_boundary
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.end_stage("fit", batches_completed(trainer))

    @_fault_boundary
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        with worker_failures_deferred():  # a dead DataLoader worker's error must not cut this short
            self._controller.exception(exception)

    @_fault_boundary
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._controller.teardown(stage_name(stage))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Quiet batches: two clock reads, one attribute chain and one comparison; ``ready`` counts
        # the batch in progress.
        try:
            controller = self._controller
            window, untraced = controller.window, controller.untraced
            # a warmup only prepares torch.profiler (nothing is recorded): its fetch counts as untraced
            untraced.batch_start(time.perf_counter(), window is not None and window.active)
            ready = trainer.fit_loop.epoch_loop.batch_progress.total.ready
            if ready <= controller.next_look:
                return
            with worker_failures_deferred():  # see on_exception
                controller.train_batch_start(trainer, ready)
            untraced.resume(time.perf_counter())
        except Exception as err:  # the fault boundary
            self._fault(err, "on_train_batch_start")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            controller = self._controller
            window = controller.window
            controller.untraced.batch_end(time.perf_counter(), window is not None and window.active)
            if window is not None:
                with worker_failures_deferred():
                    controller.batch_end(global_batch(trainer))
                controller.untraced.ended_at(time.perf_counter())
        except Exception as err:  # the fault boundary
            self._fault(err, "on_train_batch_end")

    @_fault_boundary
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.not_a_step()  # the interval across an epoch boundary is no training step

    @_fault_boundary
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.range("validation", begin=True)

    @_fault_boundary
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.not_a_step()  # the interval that holds a validation loop is no training step
        self._controller.range("validation", begin=False)
        self._controller.end_stage("validate")

    @_fault_boundary
    def on_validation_batch_start(self, *args: Any, **kwargs: Any) -> None:
        self._controller.eval_batch_start("validate")

    @_fault_boundary
    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._controller.eval_batch_end("validate")

    @_fault_boundary
    def on_test_batch_start(self, *args: Any, **kwargs: Any) -> None:
        self._controller.eval_batch_start("test")

    @_fault_boundary
    def on_test_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._controller.eval_batch_end("test")

    @_fault_boundary
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.end_stage("test")

    @_fault_boundary
    def on_predict_batch_start(self, *args: Any, **kwargs: Any) -> None:
        self._controller.eval_batch_start("predict")

    @_fault_boundary
    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._controller.eval_batch_end("predict")

    @_fault_boundary
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._controller.end_stage("predict")


_PARAMETERS = tuple(inspect.signature(VizTraceCallback.__init__).parameters)[1:]
