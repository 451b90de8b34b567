"""Lightning hooks -> profiling windows. Thin: the schedule, tracers, merge and output live elsewhere."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from . import __version__
from .atomic import remove_stale_temporaries
from .finish import BROWSER_LIMIT_BYTES, WindowJob, WindowResult, finish_window
from .lightning_view import LightningViewHooks
from .memory import CudaMemoryRecorder, dump_oom_snapshot, is_cuda_oom, oom_file_name
from .background import BackgroundWriter, WriterAbandoned
from .names import host_name, memory_file_name, span_name, trace_file_name, window_dir_name, worker_name
from .spool import Spool, SpoolError, check_spool_dir, spool_directory
from .warn import WarnOnce
from .pytracer import PythonTracer, PythonTracerConfig, foreign_profiler, reap_dump_children
from .rivals import RivalProfiler
from .schedule import Phase, Schedule, Window
from .torchtracer import TorchTracer, TorchTracerConfig, torch_profiler_active
from .window import ProfilingWindow

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
        max_stack_depth: deepest Python call depth recorded (-1: no limit).
        min_duration: drop Python calls shorter than this many microseconds.
        include_files: trace only Python code under these paths.
        exclude_files: do not trace Python code under these paths.
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
        spool_dir: str | None = None,
        writer_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self.schedule = Schedule(
            skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
        )
        _check_int("tracer_entries", tracer_entries, minimum=1)
        _check_int("max_stack_depth", max_stack_depth, minimum=-1)
        _check_int("memory_max_entries", memory_max_entries, minimum=1)
        _check_int("compression_level", compression_level, minimum=1, maximum=9)
        if isinstance(min_duration, bool) or not isinstance(min_duration, (int, float)) or not (
            math.isfinite(min_duration) and min_duration >= 0
        ):
            raise ValueError(f"`min_duration` must be a number of microseconds >= 0, got {min_duration!r}")
        if include_files is not None and exclude_files is not None:
            raise ValueError("`include_files` and `exclude_files` cannot both be set; choose one")
        include = _check_paths("include_files", include_files)
        exclude = _check_paths("exclude_files", exclude_files)
        self.spool_dir = check_spool_dir(spool_dir)
        if isinstance(writer_timeout, bool) or not isinstance(writer_timeout, (int, float)) or not (
            math.isfinite(writer_timeout) and writer_timeout > 0
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

        self._warn = WarnOnce()
        self._python: PythonTracer | None = None
        self._window: ProfilingWindow | None = None
        self._writer: BackgroundWriter | None = None
        self._spool: Spool | None = None
        self._root: Path | None = None
        self._enabled = False
        self._next_step: float = math.inf
        self._rank_info: dict[str, Any] = {}
        self._cuda = False
        self._completed: set[int] = set()
        self.results: list[WindowResult] = []
        self.windows_skipped = 0

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        log_dir = trainer.log_dir  # every rank must call it: it is broadcast from rank 0
        rank = trainer.global_rank
        if self.ranks is not None:
            unknown = [r for r in self.ranks if r >= trainer.world_size]
            if unknown:
                raise ValueError(
                    f"`ranks` names {unknown}, but this run has world_size={trainer.world_size}"
                )
        self._enabled = self.ranks is None or rank in self.ranks
        self._cuda = trainer.strategy.root_device.type == "cuda"
        if getattr(self, "_vt_lightning_source", None) == "env" and any(
            isinstance(cb, VizTraceCallback) and cb is not self for cb in trainer.callbacks
        ):
            self._enabled = False
            self._warn(
                "duplicate",
                "vt_lightning: VT_LIGHTNING is set but the Trainer already has a VizTraceCallback; "
                "the one from the environment stays idle.",
            )
            return
        if self._enabled and self.memory_snapshot and not self._cuda and not self.torch_config.profile_memory:
            self._warn(
                "cpu-memory",
                "vt_lightning: on CPU the memory snapshot is built from torch.profiler's memory events, "
                "which `profile_memory=False` turns off: no memory snapshots will be written.",
            )
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
        if not self._enabled:
            return
        self._python = self._python or PythonTracer(self.python_config)
        self._writer = BackgroundWriter(timeout=self.writer_timeout, on_problem=self._warn)
        # Leftovers of writers killed mid-write; on the writer thread, as a hung mount must not hang setup.
        self._writer.submit(remove_stale_temporaries, self._root)
        self._spool = spool_directory(self.spool_dir)
        self._schedule_from(_global_batch(trainer))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Quiet batches: one attribute chain and one comparison, no allocation. ``ready`` counts the
        # batch in progress, so the global batch index is ``ready - 1``: ``step < next`` is ``ready <= next``.
        if trainer.fit_loop.epoch_loop.batch_progress.total.ready <= self._next_step:
            return
        step = _global_batch(trainer)
        try:
            self._scheduled_batch_start(trainer, step)
        except Exception as err:  # a profiler fault never stops training
            self._fail_window(err)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        window = self._window
        if window is None:
            return
        try:
            step = _global_batch(trainer)
            if window.active:
                window.step_end(step)
            if step >= window.window.last_step:
                self._close_window()
        except Exception as err:
            self._fail_window(err)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finalize(reason="training ended inside the window")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning does not call teardown after on_exception.
        if is_cuda_oom(exception):
            self._dump_oom()
        self._finalize(reason=f"{type(exception).__name__} during the window", partial=True)
        self._shutdown()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._finalize(reason="training ended inside the window")
        self._shutdown()

    def state_dict(self) -> dict[str, Any]:
        return {"completed_windows": sorted(self._completed)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores the global batch count; this guards against writing a window twice.
        self._completed = set(state_dict.get("completed_windows", []))

    # ------------------------------------------------------------------ windows
    def _scheduled_batch_start(self, trainer: pl.Trainer, step: int) -> None:
        window = self._window
        if window is not None and step > window.window.last_step:
            self._close_window()  # its last batch end was never seen
        if self._window is None:
            target = self.schedule.next_window(step)
            if target is None:
                self._next_step = math.inf
                return
            if step < target.warmup_start:
                self._next_step = target.warmup_start
                return
            if target.index in self._completed:
                self._skip(target)
                return
            self._window = self._open_window(target, trainer)
            if self._window is None:
                self._skip(target)
                return
        if self.schedule.phase(step) is Phase.ACTIVE:
            self._window.step_begin(step)

    def _open_window(self, target: Window, trainer: pl.Trainer) -> ProfilingWindow | None:
        assert self._python is not None and self._writer is not None
        conflict = foreign_profiler() or ("a torch profiler that is already recording" if torch_profiler_active() else None)
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
        """Quiet until the warmup of the first window not over by ``step``."""
        nxt = self.schedule.next_window(step)
        self._next_step = nxt.warmup_start if nxt is not None else math.inf

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
        self._completed.add(target.index)
        self._schedule_from(target.end)
        run_dir, worker, span, memory_name = self._paths(window)
        incomplete = len(window.steps) < len(target.active_steps)
        metadata = {
            "version": __version__,
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
            "worker": worker,
            "span": span,
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
            self._writer.submit(self._finish_job, job)

    def _paths(self, window: ProfilingWindow) -> tuple[Path, str, str, str | None]:
        """(run directory, worker, span, memory snapshot name or None) of a window."""
        assert self._root is not None
        target = window.window
        first = window.steps[0] if window.steps else target.active_start
        worker = worker_name(self._rank_info.get("global_rank", 0), host_name())
        span = span_name(target.active_start)
        snapshots = self.memory_snapshot and (self._cuda or self.torch_config.profile_memory)
        memory_name = memory_file_name(worker, span) if snapshots else None
        return self._root / window_dir_name(target.index, first, target.last_step), worker, span, memory_name

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
                "(estimated from this window's event rate), or narrow tracing with `include_files` / "
                "`max_stack_depth` / `min_duration`.",
            )
        if result.json_bytes > BROWSER_LIMIT_BYTES:
            self._warn(
                "large",
                f"vt_lightning: {result.trace_path.name} holds {result.json_bytes / 2**20:.0f} MB of JSON; "
                "browser trace viewers go blank above ~300 MB. Lower `active`, or set `min_duration`, "
                "`max_stack_depth`, `include_files` or `ignore_c_function=True`.",
            )
        log.info("vt_lightning: wrote %s", result.trace_path)
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

    def _shutdown(self) -> None:
        if self._writer is not None:
            if not self._writer.close():
                self._warn_unfinished()
            self._writer = None
            if self.results:
                rank_zero_info(
                    f"vt_lightning: {len(self.results)} window trace(s) in {self._root}\n"
                    f"  view: tensorboard --logdir {self._root}  (PyTorch Profiler tab)"
                )
        reap_dump_children()  # of windows interrupted between their dump and its hand-off
        if self._spool is not None:
            self._spool.remove()
            self._spool = None
        self._next_step = math.inf

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
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
        maximum is not None and value > maximum
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


