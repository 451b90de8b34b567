"""Every option of ``VizTraceCallback`` in one frozen dataclass, validated in one function: bad
input is a ValueError naming the argument, raised at construction, before any Trainer exists."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from vt_lightning.analysis.budget import BudgetLimits
from vt_lightning.analysis.filters import path_matches_anything
from vt_lightning.analysis.schedule import Schedule
from vt_lightning.analysis.triggers import TriggerConfig, parse_trigger_signal
from vt_lightning.constants import STAGES
from vt_lightning.recording.probes import foreign_signal_handler
from vt_lightning.recording.pytracer import PythonTracerConfig
from vt_lightning.recording.spool import check_spool_dir
from vt_lightning.recording.torchtracer import TorchTracerConfig


class ConfigurationError(ValueError):
    """A setting this run cannot honour, found at setup (``ranks`` past the world size, two callbacks):
    the user's to fix, so the hooks' fault boundary lets it through and fit stops."""


@dataclass(frozen=True)
class Options:
    """The validated options, grouped by who reads them (the defaults are ``VizTraceCallback``'s)."""

    schedule: Schedule
    python: PythonTracerConfig
    torch: TorchTracerConfig
    triggers: TriggerConfig
    dirpath: str | None
    memory_snapshot: bool
    memory_max_entries: int
    lightning_view: bool
    ranks: tuple[int, ...] | None
    compression_level: int
    stages: tuple[str, ...]
    summary: bool
    scheduled_windows: bool
    spool_dir: str | None
    writer_timeout: float
    keep_windows: int | None  # newest windows kept on disk (None: all)
    trace_workers: bool  # DataLoader workers' Python calls for a window's batches (recording/workers.py)
    worker_calls: str  # what a traced worker records: WORKER_CALLS (recording/worker_side.py)
    budget: BudgetLimits

    def settings(self) -> dict[str, Any]:
        """The options a window's metadata records."""
        return {"schedule": asdict(self.schedule), "tracer": asdict(self.python), "torch": asdict(self.torch)}


# Ranges. Past an upper limit a value is a slip (1e300, 10**30) that would overflow or exhaust
# memory during training, never a setting a run needs. docs/options.md lists every range.
MAX_BATCHES = 10**12  # batch counts: more batches than any run has
MAX_SECONDS = 86_400.0  # waits and intervals: one day
MAX_EVENTS = 10**8  # ring buffers (tracer_entries: ~100 B each, allocated at setup)
BUDGET_GRACE_SECONDS = 3.0  # windows may always add this much before budget_time_share applies
_INTEGERS = {  # (lowest, highest, whether None is taken)
    "skip_first": (0, MAX_BATCHES, False),
    "wait": (0, MAX_BATCHES, False),
    "warmup": (0, MAX_BATCHES, False),
    "active": (1, MAX_BATCHES, False),
    "repeat": (0, MAX_BATCHES, False),
    "tracer_entries": (1, MAX_EVENTS, False),
    "max_stack_depth": (-1, 100_000, False),
    "memory_max_entries": (1, MAX_EVENTS, False),
    "compression_level": (1, 9, False),
    "slow_step_baseline": (5, 10_000, False),  # its median is recomputed at every check
    "memory_growth_steps": (1, MAX_BATCHES, False),
    "trigger_cooldown": (0, MAX_BATCHES, False),
    "budget_windows": (1, MAX_BATCHES, True),
    "keep_windows": (1, MAX_BATCHES, True),
}
_NUMBERS = {  # (low, high, what, whether ``low`` itself is refused, whether None is taken)
    "min_duration": (0, 3.6e9, "a number of microseconds", False, False),  # one hour
    "writer_timeout": (0, MAX_SECONDS, "a number of seconds", True, False),
    "trigger_interval": (0, MAX_SECONDS, "a number of seconds", False, False),
    "slow_step_factor": (1, 1000.0, "a number", True, True),
    "memory_growth": (0, 100.0, "a fraction (0.2 = +20%)", True, True),  # +10,000 %
    "budget_output_mb": (0, 1e9, "megabytes", True, True),  # a petabyte
    "budget_time_share": (0, 1, "a fraction of the run (0.1 = 10%)", True, True),
}
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
    "trigger_file",
)
WORKER_CALLS = ("user", "all")  # what a traced DataLoader worker records (``worker_calls``)
MAX_RANK = 2**31 - 1


def make_options(arguments: Mapping[str, Any]) -> Options:
    """Validate ``VizTraceCallback``'s keyword arguments (all of them, by name) into ``Options``."""
    a = dict(arguments)
    schedule = Schedule(  # first: its own check says what a schedule needs (``active`` >= 1)
        skip_first=a["skip_first"], wait=a["wait"], warmup=a["warmup"], active=a["active"], repeat=a["repeat"]
    )
    for name in _FLAGS:
        if not isinstance(a[name], bool):
            raise ValueError(f"`{name}` must be True or False, got {a[name]!r}")
    for name, (minimum, maximum, optional) in _INTEGERS.items():
        if not (_is_int(a[name], minimum, maximum) or (optional and a[name] is None)):
            raise ValueError(f"`{name}` must be an integer between {minimum} and {maximum}, got {a[name]!r}")
    for name, (low, high, what, above, optional) in _NUMBERS.items():
        if not (optional and a[name] is None):
            a[name] = _check_number(name, a[name], low, high, what, above=above, optional=optional)
    for name in ("dirpath", "spool_dir"):
        _check_no_nul(name, a[name])
    dirpath = a["dirpath"]
    if dirpath is not None and (not isinstance(dirpath, (str, os.PathLike)) or not str(dirpath)):
        raise ValueError(f"`dirpath` must be a non-empty path or None, got {dirpath!r}")
    if a["worker_calls"] not in WORKER_CALLS:
        raise ValueError(f"`worker_calls` must be one of {list(WORKER_CALLS)}, got {a['worker_calls']!r}")
    return Options(
        schedule=schedule,
        python=_python_config(a),
        torch=TorchTracerConfig(
            record_shapes=a["record_shapes"], profile_memory=a["profile_memory"], with_flops=a["with_flops"]
        ),
        triggers=_trigger_config(a),
        dirpath=str(dirpath) if dirpath is not None else None,
        memory_snapshot=a["memory_snapshot"],
        memory_max_entries=a["memory_max_entries"],
        lightning_view=a["lightning_view"],
        ranks=_check_ranks(a["ranks"]),
        compression_level=a["compression_level"],
        stages=_check_stages(a["stages"]),
        summary=a["summary"],
        scheduled_windows=a["scheduled_windows"],
        spool_dir=check_spool_dir(a["spool_dir"]),
        writer_timeout=a["writer_timeout"],
        keep_windows=a["keep_windows"],
        trace_workers=a["trace_workers"],
        worker_calls=a["worker_calls"],
        budget=BudgetLimits(a["budget_output_mb"], a["budget_time_share"], BUDGET_GRACE_SECONDS),
    )


def _trigger_config(a: Mapping[str, Any]) -> TriggerConfig:
    """The triggers' options (their numbers are checked with the others')."""
    signum, signal_name = parse_trigger_signal(a["trigger_signal"]) if a["trigger_signal"] is not None else (None, None)
    if signum is not None and (handler := foreign_signal_handler(signum)) is not None:
        raise ValueError(f"`trigger_signal`: {signal_name} already has a handler ({handler!r}); choose another signal")
    triggers = TriggerConfig(
        slow_step_factor=a["slow_step_factor"],
        slow_step_baseline=a["slow_step_baseline"],
        memory_growth=a["memory_growth"],
        memory_growth_steps=a["memory_growth_steps"],
        trigger_file=a["trigger_file"],
        trigger_signal=signal_name,
        trigger_cooldown=a["trigger_cooldown"],
        trigger_interval=a["trigger_interval"],
        max_windows=a["budget_windows"],
    )
    if not a["scheduled_windows"] and not triggers.armed:
        raise ValueError(
            "`scheduled_windows`: False with no trigger armed would record nothing: arm a trigger "
            "(slow_step_factor, memory_growth, trigger_file, trigger_signal) or keep the schedule"
        )
    return triggers


def _python_config(a: Mapping[str, Any]) -> PythonTracerConfig:
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
        min_duration=a["min_duration"],
        include_files=include,
        exclude_files=exclude,
        ignore_c_function=a["ignore_c_function"],
    )


def _is_int(value: Any, minimum: int, maximum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum


def _check_number(name: str, value: Any, low: float, high: float, what: str, *, above: bool, optional: bool) -> float:
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
        if not _is_int(rank, 0, MAX_RANK):
            raise ValueError(f"`ranks` must be an integer between 0 and {MAX_RANK}, got {rank!r}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"`ranks` lists a rank twice: {ranks!r}")
    return tuple(ranks)


def _check_stages(stages: Any) -> tuple[str, ...]:
    if stages is None:
        return ("fit",)
    if not isinstance(stages, (list, tuple)) or not stages:
        raise ValueError(f"`stages` must be a non-empty list drawn from {list(STAGES)}, got {stages!r}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"`stages` names {unknown}, which are not stages; choose from {list(STAGES)}")
    if len(set(stages)) != len(stages):
        raise ValueError(f"`stages` lists a stage twice: {stages!r}")
    return tuple(stages)
