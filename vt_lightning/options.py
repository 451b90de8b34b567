"""Every option of ``VizTraceCallback`` in one frozen dataclass, validated in one function.

The callback keeps its typed ``__init__`` (LightningCLI and YAML configs read that signature) and
hands the arguments to ``make_options``; nothing else reads raw keyword arguments. Bad input is a
ValueError naming the argument, raised at construction, before any Trainer exists.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from vt_lightning.analysis.budget import BudgetLimits
from vt_lightning.analysis.filters import path_matches_anything
from vt_lightning.analysis.schedule import Schedule
from vt_lightning.analysis.triggers import TriggerConfig, parse_trigger_signal
from vt_lightning.constants import STAGES, WRITER_TIMEOUT_S
from vt_lightning.recording.probes import foreign_signal_handler
from vt_lightning.recording.pytracer import PythonTracerConfig
from vt_lightning.recording.spool import check_spool_dir
from vt_lightning.recording.torchtracer import TorchTracerConfig


class ConfigurationError(ValueError):
    """A setting this run cannot honour, found at setup once the Trainer is known (``ranks`` past
    the world size, an output root this process cannot use, two callbacks in one Trainer): fit
    stops with it, as it would with a bad argument to ``VizTraceCallback()``. The hooks' fault
    boundary (``callback.py``) lets it through; it is the user's to fix, not a fault of ours."""


@dataclass(frozen=True)
class Options:
    """The validated options, grouped by who reads them."""

    schedule: Schedule
    python: PythonTracerConfig
    torch: TorchTracerConfig
    triggers: TriggerConfig
    dirpath: str | None = None
    memory_snapshot: bool = True
    memory_max_entries: int = 100_000
    lightning_view: bool = True
    ranks: tuple[int, ...] | None = None
    compression_level: int = 3
    stages: tuple[str, ...] = ("fit",)
    summary: bool = True
    scheduled_windows: bool = True
    spool_dir: str | None = None
    writer_timeout: float = WRITER_TIMEOUT_S
    keep_windows: int | None = None  # newest windows kept on disk (None: all)
    trace_workers: bool = True  # DataLoader workers' Python calls for a window's batches (recording/workers.py)
    worker_calls: str = "user"  # what a traced worker records: WORKER_CALLS (recording/worker_side.py)
    budget: BudgetLimits = field(default_factory=BudgetLimits)

    def settings(self) -> dict[str, Any]:
        """The options a window's metadata records (``schedule``, ``tracer``, ``torch``)."""
        s, p, t = self.schedule, self.python, self.torch
        return {
            "schedule": {
                "skip_first": s.skip_first,
                "wait": s.wait,
                "warmup": s.warmup,
                "active": s.active,
                "repeat": s.repeat,
            },
            "tracer": {
                "tracer_entries": p.tracer_entries,
                "max_stack_depth": p.max_stack_depth,
                "min_duration": p.min_duration,
                "include_files": list(p.include_files) if p.include_files is not None else None,
                "exclude_files": list(p.exclude_files) if p.exclude_files is not None else None,
                "ignore_c_function": p.ignore_c_function,
            },
            "torch": {"record_shapes": t.record_shapes, "profile_memory": t.profile_memory, "with_flops": t.with_flops},
        }


# Upper limits. Past them a value is a slip (1e300, 10**30) that would overflow or exhaust memory
# during training, never a setting a run needs. docs/options.md lists every range.
MAX_BATCHES = 10**12  # batch counts: more batches than any run has
MAX_SECONDS = 86_400.0  # waits and intervals: one day
MAX_EVENTS = 10**8  # ring buffers (tracer_entries: ~100 B each, allocated at setup)
MAX_SLOW_STEP_FACTOR = 1000.0
MAX_SLOW_STEP_BASELINE = 10_000  # its median is recomputed at every check
MAX_MEMORY_GROWTH = 100.0  # +10,000 %
MAX_STACK_DEPTH = 100_000
MAX_MIN_DURATION_US = 3.6e9  # one hour
MAX_RANK = 2**31 - 1
MAX_OUTPUT_MB = 1e9  # a petabyte
BUDGET_GRACE_SECONDS = 3.0  # windows may always add this much before budget_time_share applies

_FLAGS = (
    "ignore_c_function",
    "record_shapes",
    "profile_memory",
    "with_flops",
    "memory_snapshot",
    "lightning_view",
    "summary",
    "scheduled_windows",
    "trace_workers",
)
# ``worker_calls``: "user" records the dataset's and collate function's own code and the C calls
# it makes, skipping every Python call into the standard library, installed packages and torch
# (with what they call); "all" records every call, as the training process does.
WORKER_CALLS = ("user", "all")


def make_options(arguments: Mapping[str, Any]) -> Options:
    """Validate ``VizTraceCallback``'s keyword arguments (all of them, by name) into ``Options``."""
    a = dict(arguments)
    schedule = Schedule(
        skip_first=a["skip_first"], wait=a["wait"], warmup=a["warmup"], active=a["active"], repeat=a["repeat"]
    )
    for name in ("skip_first", "wait", "warmup", "active", "repeat"):
        _check_int(name, a[name], minimum=1 if name == "active" else 0, maximum=MAX_BATCHES)
    python = _python_config(a)
    _check_int("memory_max_entries", a["memory_max_entries"], minimum=1, maximum=MAX_EVENTS)
    _check_int("compression_level", a["compression_level"], minimum=1, maximum=9)
    for name in ("dirpath", "spool_dir"):
        _check_no_nul(name, a[name])
    spool_dir = check_spool_dir(a["spool_dir"])
    writer_timeout = _check_number(
        "writer_timeout", a["writer_timeout"], 0, MAX_SECONDS, "a number of seconds", above=True
    )
    dirpath = a["dirpath"]
    if dirpath is not None and (not isinstance(dirpath, (str, os.PathLike)) or not str(dirpath)):
        raise ValueError(f"`dirpath` must be a non-empty path or None, got {dirpath!r}")
    for name in _FLAGS:
        if not isinstance(a[name], bool):
            raise ValueError(f"`{name}` must be True or False, got {a[name]!r}")
    ranks = _check_ranks(a["ranks"])
    stages = _check_stages(a["stages"])
    triggers = _check_triggers(a)
    if not a["scheduled_windows"] and not triggers.armed:
        raise ValueError(
            "`scheduled_windows`: False with no trigger armed would record nothing: arm a trigger "
            "(slow_step_factor, memory_growth, trigger_file, trigger_signal) or keep the schedule"
        )
    if triggers.trigger_signal is not None:
        handler = foreign_signal_handler(parse_trigger_signal(triggers.trigger_signal)[0])
        if handler is not None:
            raise ValueError(
                f"`trigger_signal`: {triggers.trigger_signal} already has a handler ({handler!r}); "
                "choose another signal"
            )
    return Options(
        schedule=schedule,
        python=python,
        torch=TorchTracerConfig(
            record_shapes=a["record_shapes"], profile_memory=a["profile_memory"], with_flops=a["with_flops"]
        ),
        triggers=triggers,
        dirpath=str(dirpath) if dirpath is not None else None,
        memory_snapshot=a["memory_snapshot"],
        memory_max_entries=a["memory_max_entries"],
        lightning_view=a["lightning_view"],
        ranks=ranks,
        compression_level=a["compression_level"],
        stages=stages,
        summary=a["summary"],
        scheduled_windows=a["scheduled_windows"],
        spool_dir=spool_dir,
        writer_timeout=writer_timeout,
        keep_windows=_check_keep_windows(a["keep_windows"]),
        trace_workers=a["trace_workers"],
        worker_calls=_check_worker_calls(a["worker_calls"]),
        budget=_check_budget(a),
    )


def _python_config(a: Mapping[str, Any]) -> PythonTracerConfig:
    """The Python tracer's options, checked: buffer, depth, minimum duration and file filters."""
    _check_int("tracer_entries", a["tracer_entries"], minimum=1, maximum=MAX_EVENTS)
    _check_int("max_stack_depth", a["max_stack_depth"], minimum=-1, maximum=MAX_STACK_DEPTH)
    min_duration = _check_number("min_duration", a["min_duration"], 0, MAX_MIN_DURATION_US, "a number of microseconds")
    for name in ("include_files", "exclude_files"):
        for path in a[name] if isinstance(a[name], (list, tuple)) else ():
            _check_no_nul(name, path)
    if a["include_files"] is not None and a["exclude_files"] is not None:
        raise ValueError("`include_files` and `exclude_files` cannot both be set; choose one")
    include = _check_paths("include_files", a["include_files"])
    exclude = _check_paths("exclude_files", a["exclude_files"])
    for name, paths in (("include_files", include), ("exclude_files", exclude)):
        for path in paths or ():
            if not path_matches_anything(path):
                rank_zero_warn(f"`{name}` entry {path!r} matches no file or directory; it filters nothing.")
    return PythonTracerConfig(
        tracer_entries=a["tracer_entries"],
        max_stack_depth=a["max_stack_depth"],
        min_duration=min_duration,
        include_files=include,
        exclude_files=exclude,
        ignore_c_function=a["ignore_c_function"],
    )


def _check_budget(a: Mapping[str, Any]) -> BudgetLimits:
    """The run budget's limits (None lifts one); ``budget_windows`` is checked with the triggers."""
    output_mb, share = a["budget_output_mb"], a["budget_time_share"]
    if output_mb is not None:
        output_mb = _check_number(
            "budget_output_mb", output_mb, 0, MAX_OUTPUT_MB, "megabytes", above=True, optional=True
        )
    if share is not None:
        share = _check_number(
            "budget_time_share", share, 0, 1, "a fraction of the run (0.1 = 10%)", above=True, optional=True
        )
    return BudgetLimits(budget_output_mb=output_mb, budget_time_share=share, grace_seconds=BUDGET_GRACE_SECONDS)


def _check_keep_windows(keep: Any) -> int | None:
    if keep is not None:
        _check_int("keep_windows", keep, minimum=1, maximum=MAX_BATCHES)
    return keep


def _check_triggers(a: Mapping[str, Any]) -> TriggerConfig:
    """The trigger options, checked (ranges in docs/options.md and docs/triggers.md)."""
    factor, growth = a["slow_step_factor"], a["memory_growth"]
    if factor is not None:
        factor = _check_number(
            "slow_step_factor", factor, 1, MAX_SLOW_STEP_FACTOR, "a number", above=True, optional=True
        )
    _check_int("slow_step_baseline", a["slow_step_baseline"], minimum=5, maximum=MAX_SLOW_STEP_BASELINE)
    if growth is not None:
        growth = _check_number(
            "memory_growth", growth, 0, MAX_MEMORY_GROWTH, "a fraction (0.2 = +20%)", above=True, optional=True
        )
    _check_int("memory_growth_steps", a["memory_growth_steps"], minimum=1, maximum=MAX_BATCHES)
    if not isinstance(a["trigger_file"], bool):
        raise ValueError(f"`trigger_file` must be True or False, got {a['trigger_file']!r}")
    signal_name = parse_trigger_signal(a["trigger_signal"])[1] if a["trigger_signal"] is not None else None
    _check_int("trigger_cooldown", a["trigger_cooldown"], minimum=0, maximum=MAX_BATCHES)
    interval = _check_number("trigger_interval", a["trigger_interval"], 0, MAX_SECONDS, "a number of seconds")
    if a["budget_windows"] is not None:
        _check_int("budget_windows", a["budget_windows"], minimum=1, maximum=MAX_BATCHES)
    return TriggerConfig(
        slow_step_factor=factor,
        slow_step_baseline=a["slow_step_baseline"],
        memory_growth=growth,
        memory_growth_steps=a["memory_growth_steps"],
        trigger_file=a["trigger_file"],
        trigger_signal=signal_name,
        trigger_cooldown=a["trigger_cooldown"],
        trigger_interval=interval,
        max_windows=a["budget_windows"],
    )


def _check_number(
    name: str, value: Any, low: float, high: float, what: str, *, above: bool = False, optional: bool = False
) -> float:
    """A finite int or float in [low, high] (``above``: in (low, high]), as a float."""
    if not _finite_number(value) or value < low or (above and value == low) or value > high:
        bounds = f"{'>' if above else '>='} {low:g} and <= {high:g}"
        raise ValueError(f"`{name}` must be {what} {bounds}{' or None' if optional else ''}, got {value!r}")
    return float(value)


def _check_no_nul(name: str, path: Any) -> None:
    """No file system takes a NUL byte; refused here, it would fail only when a window is written."""
    if isinstance(path, (str, os.PathLike)) and "\0" in str(os.fspath(path)):
        raise ValueError(f"`{name}` holds a NUL byte ('\\0'), which no path may contain, got {path!r}")


def _finite_number(value: Any) -> bool:
    """An int (any size: ``math.isfinite(10**400)`` would raise) or a finite float; not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"`{name}` must be an integer {bound}, got {value!r}")


def _check_paths(name: str, paths: Any) -> tuple[str, ...] | None:
    if paths is None:
        return None
    # A list or tuple only: a string would be split into characters, a dict or set is a slip.
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p for p in paths):
        raise ValueError(f"`{name}` must be a list of non-empty paths, got {paths!r}")
    return tuple(os.path.abspath(p) for p in paths)


def _check_ranks(ranks: Any) -> tuple[int, ...] | None:
    if ranks is None:
        return None
    if not isinstance(ranks, (list, tuple)) or not ranks:
        raise ValueError(f"`ranks` must be a non-empty list of global ranks or None, got {ranks!r}")
    for rank in ranks:
        _check_int("ranks", rank, minimum=0, maximum=MAX_RANK)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"`ranks` lists a rank twice: {ranks!r}")
    return tuple(ranks)


def _check_worker_calls(calls: Any) -> str:
    if calls not in WORKER_CALLS:
        raise ValueError(f"`worker_calls` must be one of {list(WORKER_CALLS)}, got {calls!r}")
    return str(calls)


def _check_stages(stages: Any) -> tuple[str, ...]:
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
