"""Benchmark-only instrumentation: time vt_lightning's stages by wrapping them (no source edits).

Wrappers are installed for one ``fit`` and removed afterwards; they run once per window stage, so
they add nothing to quiet or active steps.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

# Lightning + callback Python events per training step besides the workload's own calls (measured
# with this workload: it is subtracted so that windows hold about 1e4 / 1e5 / 1e6 events).
OVERHEAD_EVENTS_PER_STEP = 3000


class Stages:
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)

    def add(self, name: str, seconds: float) -> None:
        self.times[name].append(seconds)

    def summary(self) -> dict[str, float]:
        return {k: round(sum(v), 6) for k, v in self.times.items()}


def _wrap(stages: Stages, label: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            stages.add(label, time.perf_counter() - t0)

    return timed


# (module, attribute owner, attribute, label); "train:" runs on the training thread, "writer:" on the writer
# thread or, for the finish stages below the writer-process line, in the writer process (only seen there
# when a run falls back to the thread)
_TARGETS = [
    ("vt_lightning.recording.pytracer", "PythonTracer", "stop", "train: VizTracer stop"),
    ("vt_lightning.recording.pytracer", "PythonTracer", "dump", "train: VizTracer C dump"),
    ("vt_lightning.recording.torchtracer", "TorchTracer", "stop", "train: torch stop_trace"),
    ("vt_lightning.recording.window", None, "sample_pair", "train: clock pairs"),
    ("vt_lightning.recording.torchtracer", "TorchTracer", "save", "writer: torch export"),
    ("vt_lightning.recording.window", None, "wait_for_dump", "writer: wait for the VizTracer dump child"),
    (
        "vt_lightning.export.writer_process",
        "WriterProcess",
        "call",
        "writer: writer process (read, merge, encode, gzip, write)",
    ),
    ("vt_lightning.export.pipeline", None, "_read_json", "writer: read raw JSON (orjson)"),
    ("vt_lightning.export.pipeline", None, "merge_window", "writer: merge"),
    ("vt_lightning.export.pipeline", None, "apply_lightning_view", "writer: Lightning view"),
    ("vt_lightning.export.pipeline", None, "encode_trace", "writer: encode (orjson)"),
    ("vt_lightning.export.atomic", None, "gzip_bytes", "writer: gzip"),
    ("vt_lightning.export.pipeline", None, "atomic_write", "writer: write + fsync"),
    ("vt_lightning.export.pipeline", None, "build_cpu_snapshot", "writer: memory snapshot"),
    ("vt_lightning.export.pipeline", None, "_write_memory", "writer: memory snapshot"),
]


@contextlib.contextmanager
def stage_timers(stages: Stages) -> Iterator[None]:
    import importlib

    undo = []
    for module_name, owner_name, attr, label in _TARGETS:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        if not hasattr(owner, attr):
            continue
        original = owner.__dict__[attr] if owner_name else getattr(owner, attr)
        setattr(owner, attr, _wrap(stages, label, original))
        undo.append((owner, attr, original))
    try:
        yield
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


def time_writer_jobs(cb: Any, out: list[tuple[int, int]]) -> None:
    """Record (begin, end) perf_counter_ns of every background window job of ``cb``: its writer
    exists from setup on, so the wrapper goes onto the writer right after the controller's setup.

    The jobs timed are the writer process's, while training goes on: a CPU run's window near the
    run's end would otherwise be held until fit ends (``handoff.FINISH_AT_END_WITHIN_S``), and the
    benchmarks that stop once a job is done would run on to their step limit."""
    from vt_lightning.controller import handoff

    handoff.FINISH_AT_END_WITHIN_S = 0.0
    controller = cb._controller
    setup = controller.setup

    def setup_then_wrap(*args: Any, **kwargs: Any) -> None:
        setup(*args, **kwargs)
        writer = controller.writer
        if writer is None:
            return
        original = writer._finish

        def timed(closed: Any, *how: Any) -> Any:
            begin = time.perf_counter_ns()
            try:
                return original(closed, *how)
            finally:
                out.append((begin, time.perf_counter_ns()))

        writer._finish = timed

    controller.setup = setup_then_wrap
