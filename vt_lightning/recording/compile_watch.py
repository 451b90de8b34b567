"""torch.compile inside a window (a side recorder): compile spans on VizTracer's clock from dynamo's
compile callbacks (private: every name looked up with a guard), the ``CompilationMetrics`` new since
``start``, torch's compile counters at open and close, and graph breaks from a filter on the
``graph_breaks`` logger (never ``torch._logging.set_logs``, which resets the user's settings).
Nothing changes beyond the window (docs/compile.md); a part this torch lacks is skipped, with a note."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from vt_lightning.analysis.compile import is_recompile_id
from vt_lightning.recording.pytracer import PythonTracer

GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
ALWAYS_SKIPPED_MODULES = ("torch._dynamo.convert_frame", "torch._dynamo.metrics_context")
MAX_GRAPH_BREAK_RECORDS = 1000  # per window: a break in a loop is logged once per compile anyway
_METRIC_FIELDS = (
    "compile_id",
    "co_name",
    "co_filename",
    "co_firstlineno",
    "is_forward",
    "start_time",
    "start_time_us",
    "duration_us",
    "entire_frame_compile_time_s",
    "backend_compile_time_s",
    "inductor_compile_time_s",
    "dynamo_cumulative_compile_time_us",
    "aot_autograd_cumulative_compile_time_us",
    "inductor_cumulative_compile_time_us",
    "recompile_reason",
    "cache_size",
    "fail_type",
    "fail_reason",
)


def _plain(value: Any) -> Any:
    """A metrics field as plain, picklable data (sets and odd types become lists / strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (set, frozenset, list, tuple)):
        return [str(v) for v in value]
    return str(value)


def metrics_record(record: Any) -> dict[str, Any]:
    """The fields of one ``CompilationMetrics`` the analysis reads (absent ones left out)."""
    return {name: _plain(getattr(record, name)) for name in _METRIC_FIELDS if getattr(record, name, None) is not None}


class CompileWatch:
    """One window's torch.compile recorder (``WindowJob.extras["compile"]``)."""

    name = "compile"

    def __init__(self, python: PythonTracer | None) -> None:
        self.python = python
        self._lock = threading.Lock()
        self._notes: list[str] = []
        self._spans: list[dict[str, Any]] = []
        self._open: dict[int, dict[str, Any]] = {}  # thread native id -> its compile in flight
        self._breaks: list[dict[str, Any]] = []
        self._metrics_before: set[int] = set()
        self._metrics_kept: list[Any] = []
        self._metrics: list[dict[str, Any]] = []
        self._counts: dict[str, dict[str, Any] | None] = {}  # "before" / "after": compile_counts
        self._frames: dict[str, list[Any]] = {}  # compile id -> [function, file, line] of its frame
        self._handler: Any = None  # torch._dynamo.callback.callback_handler while registered
        self._logger: logging.Logger | None = None  # with ``_graph_break`` as its filter
        self._pass_through = False  # the user's settings would show graph breaks
        self._level_before: int | None = None
        self._paused = False
        self._torch_dir = ""
        self._always_skipped: tuple[str, ...] = ()
        self._active = False

    def start(self) -> None:
        # A model compiled before the window imported torch._dynamo; without it nothing compiles.
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None:
            return
        self._active = True
        torch = sys.modules["torch"]
        torch_file = getattr(torch, "__file__", None)
        self._torch_dir = os.path.dirname(os.path.abspath(torch_file)) + os.sep if torch_file else ""
        if getattr(sys.modules.get("torch._dynamo.utils"), "get_compilation_metrics", None) is None:
            self._note("this torch keeps no compilation metrics: no compile phases or recompile reasons")
        existing = self._read_metrics()
        self._counts["before"] = compile_counts(existing)
        self._metrics_kept = existing  # held, so that no new record can reuse an old one's id
        self._metrics_before = {id(r) for r in existing}
        if existing or (self._counts["before"] or {}).get("graphs"):  # the run compiles: skip its files now
            self._skip_always()
        handler = getattr(getattr(dynamo, "callback", None), "callback_handler", None)
        if handler is not None and all(
            hasattr(handler, name)
            for name in ("register_start_callback", "register_end_callback", "remove_start_callback")
        ):
            handler.register_start_callback(self._compile_started)
            handler.register_end_callback(self._compile_ended)
            self._handler = handler
        else:
            self._note(
                f"torch {getattr(torch, '__version__', '?')} has no compile start/end callbacks: no compile "
                "spans, and the Python tracer records the compiler's own calls in full"
            )
        self._watch_graph_breaks()

    def _watch_graph_breaks(self) -> None:
        if GRAPH_BREAK_LOGGER not in logging.Logger.manager.loggerDict:
            self._note("this torch has no graph_breaks logging artifact: graph breaks seen only at run time")
            return
        logger = logging.getLogger(GRAPH_BREAK_LOGGER)
        enabled = self._pass_through = logger.isEnabledFor(logging.DEBUG)
        logger.addFilter(self._graph_break)
        self._logger = logger
        if not enabled:
            self._level_before = logger.level
            logger.setLevel(logging.DEBUG)

    def stop(self) -> None:
        """Remove the callbacks and the filter, put the logger's level back, end any pause."""
        handler, self._handler = self._handler, None
        if handler is not None:
            for remove, callback in (
                (handler.remove_start_callback, self._compile_started),
                (getattr(handler, "remove_end_callback", None), self._compile_ended),
            ):
                try:
                    if remove is not None:
                        remove(callback)
                except ValueError:  # already gone (torch._dynamo.reset() clears the lists)
                    pass
        logger, self._logger = self._logger, None
        if logger is not None:
            logger.removeFilter(self._graph_break)
            if self._level_before is not None:
                logger.setLevel(self._level_before)
        self._level_before = None
        self._paused = False
        if self.python is not None and self._active:
            self.python.resume_files()
        if self._active:
            after = self._read_metrics()
            new = [r for r in after if id(r) not in self._metrics_before]
            self._metrics = [metrics_record(r) for r in new]
            self._counts["after"] = compile_counts(after)
            self._frames = {
                str(r.compile_id): [r.co_name, getattr(r, "co_filename", None), getattr(r, "co_firstlineno", None)]
                for r in after
                if getattr(r, "co_name", None) and getattr(r, "compile_id", None) is not None
            }
            self._metrics_kept = []
            if new and not hasattr(new[0], "recompile_reason"):
                self._note(
                    "this torch keeps no recompile reasons (CompilationMetrics.recompile_reason): "
                    "recompiles are listed without one"
                )
            if len(new) >= 64 and len(new) == len(after):
                self._note("more compiles than dynamo keeps records of (64): the earliest have no phases")

    def collect(self) -> dict[str, Any] | None:
        if not self._active:
            return None
        with self._lock:
            spans = list(self._spans)
            breaks = list(self._breaks)
        return {
            "torch": _torch_version(),
            "spans": spans,
            "compiles": list(self._metrics),
            "graph_breaks": breaks,
            "notes": list(self._notes),
            **self._counts,
            "frames": dict(self._frames),
        }

    def _compile_started(self, *args: Any) -> None:
        """dynamo's start callback, on the compiling thread (a ``CallbackArgs`` since torch 2.6)."""
        try:
            info = args[0] if args else None
            span = {
                "pid": os.getpid(),
                "tid": threading.get_native_id(),
                "compile_id": _plain(getattr(info, "compile_id", None)),
                "trigger": getattr(getattr(info, "callback_trigger", None), "name", None),
                "wall_start": time.time(),
                "start_us": self._clock(),
            }
            with self._lock:
                self._open[span["tid"]] = span
            self._pause()
        except Exception as err:  # in torch's compile callback: never fail the user's compile
            self._note(f"compile start not recorded ({type(err).__name__}: {err})")

    def _compile_ended(self, *args: Any) -> None:
        try:
            end_us = self._clock()
            self._resume()
            with self._lock:
                # dynamo runs the end callbacks once the last of overlapping compiles ends, on the
                # thread that ran it: close this thread's span, else the one still open.
                tid = threading.get_native_id()
                if tid not in self._open and not self._open:
                    return
                span = self._open.pop(tid if tid in self._open else next(iter(self._open)))
                span["end_us"] = end_us
                span["wall_end"] = time.time()
                self._spans.append(span)
        except Exception as err:  # in torch's compile callback: never fail the user's compile
            self._note(f"compile end not recorded ({type(err).__name__}: {err})")

    def _graph_break(self, record: logging.LogRecord) -> bool:
        """The logger's filter: takes the record, lets it through where the user's settings would."""
        try:
            message = record.getMessage()
            error = record.exc_info[1] if record.exc_info else None
            if error is not None:  # torch 2.4 logs the reason as the record's exception, not in its text
                message += f"\n{type(error).__module__}.{type(error).__qualname__}: {error}"
            compile_id = _current_compile_id()
        except Exception:  # in torch's logging: never fail the user's compile
            return self._pass_through
        with self._lock:
            if len(self._breaks) < MAX_GRAPH_BREAK_RECORDS:
                # The head has the place and reason, the tail the innermost frame (its function).
                kept = message if len(message) <= 6000 else f"{message[:3000]}\n…\n{message[-3000:]}"
                self._breaks.append({"message": kept, "compile_id": compile_id})
        return self._pass_through

    def _clock(self) -> float | None:
        return self.python.clock_us() if self.python is not None else None

    def _skip_always(self) -> None:
        """Skip what is never the user's code (dynamo's frame callback, the metrics' logging), once the run
        compiles: every skipped file costs VizTracer a comparison per call."""
        if self._always_skipped:
            return
        files = (getattr(sys.modules.get(name), "__file__", None) for name in ALWAYS_SKIPPED_MODULES)
        self._always_skipped = tuple(f for f in files if f)
        if self.python is not None and self._always_skipped:
            self.python.pause_files(self._always_skipped)

    def _pause(self) -> None:
        """Skip every call into torch's files until the compile ends."""
        self._skip_always()
        if self.python is not None and self._torch_dir:
            self._paused = self.python.pause_files((*self._always_skipped, self._torch_dir))

    def _resume(self) -> None:
        """Back to skipping ``convert_frame`` only."""
        if self._paused and self.python is not None:
            self._paused = False
            self.python.pause_files(self._always_skipped)

    def _note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    @staticmethod
    def _read_metrics() -> list[Any]:
        read = getattr(sys.modules.get("torch._dynamo.utils"), "get_compilation_metrics", None)
        return [] if read is None else list(read())


def compile_counts(records: list[Any]) -> dict[str, Any] | None:
    """What the process compiled so far (graphs, compile time, recompiles, graph breaks); None: no counters."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    spent = getattr(utils, "calculate_time_spent", None)
    try:
        compile_s = float(spent()["total_wall_time"]) if spent is not None else None
    except (KeyError, TypeError, ValueError):
        compile_s = None
    return {
        "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
        "compile_s": compile_s,
        "recompiles": sum(
            getattr(r, "is_forward", True) is not False and is_recompile_id(str(getattr(r, "compile_id", "")))
            for r in records
        ),
        "graph_breaks": int(sum(counters.get("graph_break", {}).values())),
    }


def _current_compile_id() -> str | None:
    context = getattr(sys.modules.get("torch._guards"), "CompileContext", None)
    current = context.current_compile_id() if context is not None else None
    return None if current is None else str(current)


def _torch_version() -> str | None:
    version = getattr(sys.modules.get("torch"), "__version__", None)
    return str(version) if version is not None else None  # a plain str: TorchVersion would import torch in the writer
