"""What the user reads on the console about windows: cut windows, runs that recorded nothing, the
end-of-run table and the commands that open the files. Texts only; the controller decides when."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from vt_lightning.analysis.schedule import Schedule, Window
from vt_lightning.analysis.schema import Summary
from vt_lightning.constants import LOGGER_NAME

log = logging.getLogger(LOGGER_NAME)


def stage_label(stage: str | None) -> str:
    return "" if stage in (None, "fit") else f"{stage} "


def warn_cut_window(
    warn: Callable[[str, str], Any],
    stage: str | None,
    target: Window,
    steps: Sequence[int],
    reason: str,
    recorded_before: int,
) -> None:
    """A window that ends before its last scheduled batch says so once, with what it holds."""
    scheduled = f"{target.active_start}-{target.last_step}"
    label = stage_label(stage)
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


def nothing_recorded(options: Any, stage: str | None, batches: int, skipped: int) -> None:
    """One line when a run ends without any window, saying why (short run, warmup, skips)."""
    schedule: Schedule = options.schedule
    scheduled_windows: bool = options.scheduled_windows
    first = schedule.window(0)
    stage = stage or "fit"
    unit = "training batch(es)" if stage == "fit" else f"{stage} batch(es)"
    if skipped:
        why = f"{skipped} window(s) were skipped (see the warnings above)"
    elif not scheduled_windows:
        why = f"{stage} ran {batches} {unit} with only triggers opening windows, and none fired"
    elif batches <= first.warmup_start:
        why = (
            f"{stage} ran {batches} {unit}, and the first window's warmup starts at batch "
            f"{first.warmup_start} (skip_first={schedule.skip_first}, wait={schedule.wait})"
        )
    else:
        why = (
            f"{stage} ran {batches} {unit} and ended during the first window's warmup "
            f"(batches {first.warmup_start}-{first.active_start - 1}); recording starts at batch "
            f"{first.active_start}"
        )
    rank_zero_info(
        f"vt_lightning: no window was recorded: {why}. Lower `skip_first` / `wait` / `warmup`, or run more batches."
    )


def end_of_run(root: Path | None, results: Sequence[Any], triggered_runs: Sequence[tuple[str, Any]]) -> None:
    """After a run that wrote windows: the table and the commands (rank 0 only)."""
    if results:
        print_end_of_run(
            root,
            len(results),
            [r.summary for r in results if r.summary is not None],
            [f"{name}: {firing.describe()}" for name, firing in triggered_runs],
        )


@rank_zero_only
def print_end_of_run(root: Path | None, files: int, summaries: list[Summary], triggered: list[str]) -> None:
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
        f"{timeout:g} s (a hung or very slow filesystem under {root}?); they are "
        "dropped and the stuck writer was stopped, so fit is not held up."
    )


def fault(err: Exception) -> tuple[str, str]:
    """The (key, message) of a profiling failure that dropped a window."""
    from vt_lightning.recording.rivals import RivalProfiler

    if isinstance(err, RivalProfiler):
        return (
            f"rival:{err}",
            f"vt_lightning: {err} started during a window; the window stopped at once and was dropped "
            "so that tool works undisturbed. Later windows that meet it are skipped; training goes on.",
        )
    return (
        f"fault:{type(err).__name__}",
        f"vt_lightning: profiling failed ({type(err).__name__}: {err}); the window was dropped, training goes on.",
    )


# ------------------------------------------------------------------ triggers: when they can act
def triggers_armed(lines: Sequence[str]) -> None:
    """At setup (rank 0): each armed trigger and from when it can open a window."""
    rank_zero_info("vt_lightning: triggers armed:\n" + "\n".join(f"  {line}" for line in lines))


def slow_step_arms(factor: float, baseline: int, earliest: int) -> str:
    return (
        f"slow step > {factor:g}x the median step: arms once {baseline} steps are measured "
        f"(`slow_step_baseline`), at batch {earliest} at the earliest"
    )


def memory_growth_arms(kind: str, growth: float, steps: int, earliest: int) -> str:
    return (
        f"memory growth ({kind} +{growth:.0%} over {steps} batches): measured from batch {earliest} "
        f"at the earliest (`memory_growth_steps`={steps}: sampling starts at batch {steps})"
    )


def on_demand_arms(what: str) -> str:
    return f"{what}: from now"


@rank_zero_only
def triggers_never_armed(warn: Callable[[str, str], Any], notes: Sequence[tuple[str, str]]) -> None:
    """At the end of a run (rank 0), once per trigger that never could fire, with its option."""
    for key, text in notes:
        warn(f"never-armed:{key}", text)


def slow_step_never_armed(measured: int, baseline: int) -> str:
    return (
        f"vt_lightning: the slow-step trigger never armed in this run: it measured {measured} of the "
        f"{baseline} steps its median needs (`slow_step_baseline`={baseline}; batches of windows, "
        "epoch edges and validation do not count). Lower `slow_step_baseline` (>= 5) or run more batches."
    )


def memory_growth_never_armed(steps: int, earliest: int) -> str:
    return (
        f"vt_lightning: the memory-growth trigger never armed in this run: growth is measured over "
        f"`memory_growth_steps`={steps} batches, from batch {earliest} at the earliest. Lower "
        "`memory_growth_steps` or run more batches."
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
