"""What the user reads: one warning per kind of problem (``WarnOnce``) and the console's texts."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from vt_lightning.analysis.schedule import Window
from vt_lightning.analysis.schema import Summary
from vt_lightning.analysis.verdict_report import verdict_line
from vt_lightning.constants import LOGGER_NAME
from vt_lightning.controller.watch import TriggerWatch
from vt_lightning.export.job import Location
from vt_lightning.export.report import print_history_table, straggler_text, window_line
from vt_lightning.export.terminal import printable, printable_lines
from vt_lightning.options import Options
from vt_lightning.recording.rivals import RivalProfiler
from vt_lightning.recording.unsafe_names import UnsafeImport

log = logging.getLogger(LOGGER_NAME)
Warn = Callable[[str, str], Any]  # (key, message): said once per key (``WarnOnce``)
GOES_ON = "training goes on, and later windows that fail the same way are not reported again."


class WarnOnce:
    """One warning per kind of problem (``key``), not one per window, from any thread."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        warnings.warn(printable_lines(message), RuntimeWarning, stacklevel=2)
        return True


def say(text: str) -> None:
    """Every line the callback prints (rank 0): a name or path in it, from the run or its files,
    may hold ESC, CR or bidi controls, shown escaped (export/terminal), never sent raw."""
    rank_zero_info(printable_lines(text))


def warn_cut_window(
    warn: Warn, stage: str | None, target: Window, steps: Sequence[int], reason: str, recorded_before: int
) -> None:
    """A window that ends before its last scheduled batch says so once, with what it holds."""
    scheduled = f"{target.active_start}-{target.last_step}"
    label = "" if stage in (None, "fit") else f"{stage} "
    if steps:
        warn(
            f"cut:{target.index}",
            f"vt_lightning: {label}window {target.index} was cut short: it holds batches "
            f"{steps[0]}-{steps[-1]} of the scheduled {scheduled}, because {reason}.",
        )
    elif recorded_before:  # with no window at all, the end-of-run line says it instead
        warn(
            f"cut:{target.index}",
            f"vt_lightning: {label}window {target.index} recorded nothing: {reason} during "
            f"its warmup, before its first active batch {target.active_start}.",
        )


def nothing_recorded(options: Options, stage: str | None, span: tuple[int, int], skipped: int) -> None:
    """One line when a run ends without any window: what ran in it, why no window, and what would help."""
    schedule, (first, batches) = options.schedule, span
    window = schedule.window(0)
    stage = stage or "fit"
    unit = "training batch(es)" if stage == "fit" else f"{stage} batch(es)"
    ran = f"{stage} ran {batches} {unit}"
    if first:  # a resumed fit, or a Trainer's second: the schedule counts from this fit's first batch
        ran += f" from global batch {first} (the schedule counts from each fit's first batch)"
    if skipped:
        why, advice = f"{skipped} window(s) were skipped", "See the warnings above."
    elif not options.scheduled_windows:
        why, advice = f"{ran} with only triggers opening windows, and none fired", "Lower the triggers' thresholds."
    elif batches <= window.warmup_start:
        why = (
            f"{ran}, and the first window's warmup starts at its batch {window.warmup_start} "
            f"(skip_first={schedule.skip_first}, wait={schedule.wait})"
        )
        advice = "Lower `skip_first` / `wait`, or run more batches."
    else:
        why = (
            f"{ran} and ended during the first window's warmup (its batches {window.warmup_start}-"
            f"{window.active_start - 1}); recording starts at its batch {window.active_start}"
        )
        advice = "Lower `warmup`, or run more batches."
    say(f"vt_lightning: no window was recorded: {why}. {advice}")


TRIGGERED_SHOWN = 5  # triggered windows named at the end of a run (the latest)


@rank_zero_only
def end_of_run(
    root: Path | None,
    outcomes: Any,
    triggered_runs: Sequence[tuple[str, Any]],
    stage: str | None = None,
    span: tuple[int, int] = (0, 0),
) -> None:
    """After a run that wrote windows: the full table into the output root, a bounded one on the console."""
    history = outcomes.history
    if not history.count:
        return
    python = os.path.normpath(sys.executable)  # `../.venv/bin/python train.py` gives a path with `..` in it
    command = f"{python} -m vt_lightning"
    full_table = outcomes.table.write(root, stage, history, span) if outcomes.table is not None else None
    if history.step.count or history.first:
        try:
            print_history_table(history)
        except Exception as err:  # a console problem never fails the run
            log.warning("vt_lightning: could not print the summary table (%s)", printable(err))
    deleted = f" ({history.deleted} older ones deleted by keep_windows)" if history.deleted else ""
    lost = outcomes.not_written()
    deleted += f"; {lost}" if lost else ""
    where = Path(os.path.abspath(root)) if isinstance(root, Path) else root  # works from any directory
    say(
        f"vt_lightning: {history.count} window trace(s) in {where}{deleted}\n"
        + "".join(f"  {name}: {firing.describe()}\n" for name, firing in triggered_runs)
        + (f"  table:   {full_table}  (every window)\n" if full_table else "")
        + f"  summary: {command} summary {where}\n"
        f"  view:    {command} view {where}   (Perfetto UI, offline)\n"
        f"  or:      {python} -m tensorboard.main --logdir {where}  (the VT_LIGHTNING tab)"
    )


@rank_zero_only
def print_verdicts(summary: Summary) -> None:
    """A window's line (compiled model, cost of observing), then one line per verdict, when its result
    is read (never inside a window)."""
    index = (summary.get("window") or {}).get("index")
    line = window_line(summary)
    if line:
        say(f"vt_lightning: window {index}: {line}")
    for verdict in summary.get("verdicts") or []:
        say(f"vt_lightning: window {index}: {verdict_line(verdict)}")


def writer_stuck(timeout: float, root: Path | str | None, index: int) -> str:
    return (
        f"vt_lightning: the writer did not finish earlier windows within writer_timeout="
        f"{timeout:g} s (a hung or very slow filesystem under {root}?); window "
        f"{index} is dropped, the stuck writer was stopped, and training goes on. Later "
        "windows that find it busy are dropped without waiting."
    )


def writer_unfinished(timeout: float, root: Path | None) -> str:
    return (
        f"vt_lightning: the writer did not finish the last window(s) within writer_timeout="
        f"{timeout:g} s (a hung or very slow filesystem under {root}, or cores kept busy by other "
        "processes: the writer runs at low priority?); they are "
        "dropped and the stuck writer was stopped, so fit is not held up."
    )


def fault(err: Exception, hook: str) -> tuple[str, str]:
    """The (key, message) of a fault in vt_lightning's code, caught at the boundary of ``hook``."""
    if isinstance(err, UnsafeImport):  # one warning with the windows skipped while it is loaded
        return "unsafe-file", str(err)
    if isinstance(err, RivalProfiler):
        return (
            f"rival:{err}",
            f"vt_lightning: {err} started during a window; the window stopped at once and was dropped "
            "so that tool works undisturbed. Later windows that meet it are skipped; training goes on.",
        )
    return (
        f"fault:{type(err).__name__}",
        f"vt_lightning: profiling failed in {hook} ({type(err).__name__}: {err}); the window it was recording, if "
        "any, was dropped with nothing of it left installed, and training goes on.",
    )


def triggers_armed(watch: TriggerWatch, first_check: int, earliest_memory: int) -> None:
    """At setup (rank 0): each armed trigger and from when it can open a window."""
    config, lines = watch.config, []
    if config.slow_step_factor is not None:
        baseline = config.slow_step_baseline
        lines.append(
            f"slow step > {config.slow_step_factor:g}x the median step: arms once {baseline} steps are measured "
            f"(`slow_step_baseline`), at batch {first_check + baseline} at the earliest"
        )
    if config.memory_growth is not None and watch.read_memory is not None:
        steps = config.memory_growth_steps
        lines.append(
            f"memory growth ({watch.memory_kind or 'memory'} +{config.memory_growth:.0%} over {steps} batches): "
            f"measured from batch {earliest_memory} at the earliest (`memory_growth_steps`={steps}: sampling "
            f"starts at batch {steps})"
        )
    if watch.signal is not None:
        lines.append(f"signal {watch.signal.name} (kill -{watch.signal.name[3:]} {os.getpid()}): from now")
    if watch.file is not None:
        lines.append(f"file {watch.file.path} (create it to open a window): from now")
    if lines:
        say("vt_lightning: triggers armed:\n" + "\n".join(f"  {line}" for line in lines))


@rank_zero_only
def triggers_never_armed(warn: Warn, watch: TriggerWatch, earliest_memory: int) -> None:
    """At the end of a run (rank 0), once per trigger that never could fire, with its option."""
    slow, memory, baseline = watch.slow, watch.memory, watch.config.slow_step_baseline
    if slow is not None and not slow.armed:
        warn(
            "never-armed:slow_step",
            f"vt_lightning: the slow-step trigger never armed in this run: it measured {len(slow.durations)} of "
            f"the {baseline} steps its median needs (`slow_step_baseline`={baseline}; batches of windows, "
            "epoch edges and validation do not count). Lower `slow_step_baseline` (>= 5) or run more batches.",
        )
    if memory is not None and watch.read_memory is not None and not memory.compared:
        warn(
            "never-armed:memory_growth",
            f"vt_lightning: the memory-growth trigger never armed in this run: growth is measured over "
            f"`memory_growth_steps`={memory.steps} batches, from batch {earliest_memory} at the earliest. Lower "
            "`memory_growth_steps` or run more batches.",
        )


def signal_owned_by_slurm(name: str, alternative: str | None) -> str:
    instead = f"trigger_signal='{alternative}' or trigger_file=True" if alternative else "trigger_file=True"
    return (
        f"vt_lightning: `trigger_signal` is off for this run: Lightning's SLURM auto-requeue "
        f"(SLURMEnvironment(auto_requeue=True)) handles {name}, and a trigger there would stop the "
        f"job from being requeued. Use {instead}."
    )


def two_callbacks(callbacks: Sequence[str]) -> str:
    return (
        f"vt_lightning: this Trainer has {len(callbacks)} VizTraceCallbacks ({', '.join(callbacks)}); "
        "it takes one, since a process has one Python tracer and one torch profiler for them to share. "
        "Keep one VizTraceCallback: its schedule (`repeat`, or `repeat=0` for windows until the end), "
        "its triggers (`slow_step_factor`, `memory_growth`, `trigger_file`, `trigger_signal`) and "
        "`stages` open as many windows as you need."
    )


def job_written(trace_path: Location, job: dict[str, Any]) -> None:
    """Rank 0, at the window's end: one line on the job file and its straggler."""
    where = trace_path.parent / str(job.get("file"))  # a URL stays one (``Path`` makes s3:// s3:/)
    ranks = job.get("ranks") or []
    residual = (job.get("collective_check") or {}).get("max_residual_us")
    spread = f", collective exits within {residual:.0f} µs" if isinstance(residual, (int, float)) else ""
    verdict = straggler_text((job.get("straggler") or {}).get("straggler"))
    say(f"vt_lightning: {len(ranks)} ranks on one timeline{spread}: {where}; {verdict}")
