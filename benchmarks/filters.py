"""Cost of the Python-call filters (issue 12): where they run and what that costs.  Usage:

    python benchmarks/filters.py            # ~1 minute on 2 cores; prints a markdown table

VizTracer records every call of a window; ``vt_lightning/filters.py`` then keeps what
``include_files`` / ``exclude_files`` / ``max_stack_depth`` select (and drops vt_lightning's own
frames) in the writer process. Two figures follow from that choice:

1. writer cost: ``filter_python_events`` per recorded event, on the events of a real window
   (a Lightning fit of the benchmark's PyHeavyModel), for each filter;
2. training-thread cost: recording with no filter (what every window now does) against VizTracer's
   own record-time ``include_files`` (what the filter would save if VizTracer could filter without
   dropping the user's code), per call, on the same tiny-function workload.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import lightning.pytorch as lp
from _common import cpu_trainer, writer_in_process
from workload import PyHeavyModel, python_work

import vt_lightning.export.pipeline as finish
from vt_lightning import VizTraceCallback
from vt_lightning.analysis.filters import PythonFilter, filter_python_events, path_prefixes

HEAVY_CALLS = 60_000  # Python calls in each of the window's 2 active steps


def capture_window_events(root: str) -> tuple[list[dict], PythonFilter]:
    """Run one window and keep a copy of the VizTracer events the writer is about to filter."""
    captured: dict[str, object] = {}

    def spy(original):
        def take(events, rules, *grouped):
            captured["events"], captured["rules"] = copy.deepcopy(events), rules
            return original(events, rules, *grouped)

        return take

    model = PyHeavyModel(calls=200, heavy_calls=HEAVY_CALLS, heavy_steps=(2, 3))
    cb = VizTraceCallback(
        wait=1, warmup=1, active=2, memory_snapshot=False, lightning_view=False, tracer_entries=2_000_000
    )
    with writer_in_process(finish, "filter_python_events", spy):  # finish in this process: the spy sees the events
        cpu_trainer(root, [cb], 5).fit(model)
    return captured["events"], captured["rules"]  # type: ignore[return-value]


def time_filter(events: list[dict], rules: PythonFilter, repeats: int = 5) -> tuple[float, int]:
    best = float("inf")
    kept = 0
    for _ in range(repeats):
        batch = copy.deepcopy(events)
        start = time.perf_counter()
        _, _, stats = filter_python_events(batch, rules)
        best = min(best, time.perf_counter() - start)
        kept = stats.kept
    return best, kept


def per_call_ns(tracer_kwargs: dict | None, calls: int = 200_000, repeats: int = 5) -> float:
    from viztracer import VizTracer

    times = []
    tracer = (
        VizTracer(verbose=0, register_global=False, tracer_entries=2_000_000, **tracer_kwargs)
        if tracer_kwargs is not None
        else None
    )
    for _ in range(repeats):
        if tracer is not None:
            tracer.start()
        start = time.perf_counter_ns()
        python_work(calls)
        elapsed = time.perf_counter_ns() - start
        if tracer is not None:
            tracer.stop()
            tracer.clear()
        times.append(elapsed / calls)
    return statistics.median(times)


def main() -> int:
    with tempfile.TemporaryDirectory() as root:
        events, rules = capture_window_events(root)
    calls = sum(1 for e in events if e.get("ph") in ("X", "B"))
    lightning_dir = os.path.dirname(lp.__file__)
    configs = {
        "vt_lightning's own frames only (always on)": rules,
        "include_files=[benchmarks/]": PythonFilter(
            include=path_prefixes([str(HERE)]), hook_locations=rules.hook_locations
        ),
        "exclude_files=[lightning/]": PythonFilter(
            exclude=path_prefixes([lightning_dir]), hook_locations=rules.hook_locations
        ),
        "max_stack_depth=2": PythonFilter(max_depth=2, hook_locations=rules.hook_locations),
    }
    print(f"window: {calls} recorded Python calls ({sys.version.split()[0]}, {os.cpu_count()} cores)\n")
    print("| filter (in the writer process) | kept calls | filter time | per recorded call |")
    print("|---|---|---|---|")
    for label, config in configs.items():
        seconds, kept = time_filter(events, config)
        print(f"| {label} | {kept} | {seconds * 1e3:.0f} ms | {seconds / calls * 1e6:.2f} µs |")
    base = per_call_ns(None)
    unfiltered = per_call_ns({})
    native = per_call_ns({"include_files": [tempfile.gettempdir() + "/nothing-here"]})
    print("\n| training thread, per Python call | ns |")
    print("|---|---|")
    print(f"| no tracer | {base:.0f} |")
    print(f"| VizTracer recording everything (every window now) | {unfiltered:.0f} |")
    print(f"| VizTracer's own include_files matching nothing (record-time filter, not used) | {native:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
