"""The window's one reading (analysis/steps.read_window over the typed trace's tables): every
table the summary reads from its bucket equals the table read from the whole event list, on a
window with DataLoader workers, CUDA kernels and their launches, gc pauses, compile spans,
dynamo's resume calls, Lightning's stage ranges, a user hook and torch's memory instants."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from vt_lightning.analysis.breakdown import stage_ranges
from vt_lightning.analysis.compile import COMPILE_SPAN_PREFIX, compile_summary
from vt_lightning.analysis.spans import launches_by_correlation
from vt_lightning.analysis.steps import find_steps, read_window
from vt_lightning.analysis.summary import summarize, top_ops
from vt_lightning.analysis.summary_devices import RUNTIME_CATEGORIES, gpu_summary, memory_summary
from vt_lightning.analysis.trace import Calls
from vt_lightning.analysis.verdicts.window import WindowView
from vt_lightning.analysis.workers import FETCH_CATEGORY, worker_summary
from vt_lightning.constants import (
    CPU_OP_CATEGORY,
    GC_SPAN_PREFIX,
    PL_PROFILE_PREFIX,
    PYTHON_CATEGORY,
    STEP_PREFIX,
    TRACE_METADATA_KEY,
    USER_ANNOTATION_CATEGORY,
)

MAIN, WORKERS = 7, (101, 202)
USER = "/home/me/project/train.py"
LIB = "/usr/lib/python3.11/site-packages/torchvision/transforms.py"
HOOK = f"Model.training_step ({USER}:20)"
RESUME = f"torch_dynamo_resume_in_forward_at_31 ({USER}:31)"


def _x(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def _window(seed: int) -> dict[str, Any]:
    """Four steps on the training thread, each with Python calls, ops, launches and kernels; two
    workers' calls and fetches interleaved; the named Python spans the tables read."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": MAIN, "args": {"name": "main"}}]
    correlation = 0
    stage = f"{PL_PROFILE_PREFIX}[Strategy]x."
    for step in range(4):
        t0 = 1000.0 * step + rng.random()
        events.append(_x(USER_ANNOTATION_CATEGORY, f"{STEP_PREFIX}{step}", t0, 990.0, MAIN, 1))
        events.append(_x(PYTHON_CATEGORY, f"{PL_PROFILE_PREFIX}run_training_batch", t0 + 1, 900.0, MAIN, 1))
        events.append(_x(USER_ANNOTATION_CATEGORY, f"{stage}training_step", t0 + 300, 300.0, MAIN, 1))
        events.append(_x(USER_ANNOTATION_CATEGORY, f"{stage}backward", t0 + 650, 200.0, MAIN, 1))
        events.append(_x(PYTHON_CATEGORY, HOOK, t0 + 305, 280.0 + rng.random(), MAIN, 1))
        events.append(_x(PYTHON_CATEGORY, f"{COMPILE_SPAN_PREFIX}forward (frame 0/{step})", t0 + 310, 50.0, MAIN, 1))
        events.append(_x(PYTHON_CATEGORY, RESUME, t0 + 400, 30.0 + rng.random(), MAIN, 1))
        events.append(_x(PYTHON_CATEGORY, f"{GC_SPAN_PREFIX}generation 2", t0 + 880, 5.0, MAIN, 1))
        for i in range(30):
            start = t0 + 10 + 30 * i + rng.random()
            helper = f"helper{i % 4} ({USER}:{40 + i % 4})"
            events.append(_x(PYTHON_CATEGORY, helper, start, 20 * rng.random(), MAIN, 1))
            if i % 3 == 0:
                events.append(_x(CPU_OP_CATEGORY, f"aten::op{i % 5}", start + 1, 10 * rng.random(), MAIN, 1))
                correlation += 1
                events.append(_x("cuda_runtime", "cudaLaunchKernel", start + 2, 2.0, MAIN, 1, correlation=correlation))
                kernel = _x("kernel", f"kernel{i % 3}", start + 5, 40 * rng.random(), 0, 7, correlation=correlation)
                events.append(kernel)
            if i % 7 == 0:
                events.append({"ph": "i", "name": "[memory]", "ts": start, "pid": MAIN, "tid": 1, "args": {
                    "Device Type": 1, "Device Id": 0, "Total Allocated": rng.randrange(1 << 30),
                    "Total Reserved": rng.randrange(1 << 31)}})  # fmt: skip
        for n, pid in enumerate(WORKERS):
            events.append(_x(FETCH_CATEGORY, f"fetch batch {step}", t0 - 800, 700.0 + n, pid, pid, batch=2 * step + n))
            for i in range(40):
                start = t0 - 800 + 17 * i + rng.random()
                events.append(_x(PYTHON_CATEGORY, f"__getitem__ ({USER}:{60 + n})", start, 16.0, pid, pid))
                events.append(_x(PYTHON_CATEGORY, f"crop ({LIB}:99)", start + 1, 14 * rng.random(), pid, pid))
    rng.shuffle(events)  # no table may rely on the trace's order beyond what it reads
    meta = {
        "user_hooks": {HOOK: "training_step"},
        "workers": {"processes": [{"pid": p, "worker": i, "rank": 0} for i, p in enumerate(WORKERS)], "missing": []},
    }
    return {"traceEvents": events, TRACE_METADATA_KEY: meta}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tables_read_from_the_buckets_equal_the_ones_read_from_every_event(seed: int) -> None:
    trace = _window(seed)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    data = read_window(trace)
    assert len(data.rest) < len(events) // 3  # the Python calls stay out of ``rest``

    assert (data.steps, data.thread) == find_steps(events)
    assert len(data.steps) == 4 and data.thread == (MAIN, 1)
    on_thread = [e for e in events if (e["pid"], e["tid"]) == data.thread]
    thread_calls = Calls.from_events([e for e in on_thread if e["cat"] == PYTHON_CATEGORY])
    ranges = stage_ranges(on_thread, thread_calls, {HOOK: "training_step"})
    assert (data.ranges, data.breakdown_source, data.user_hooks) == ranges
    assert {part for _, _, part in data.ranges} >= {"forward", "backward", "compile"}
    assert data.launches == launches_by_correlation(events, RUNTIME_CATEGORIES) and data.launches
    counted = data.counted
    region = (data.steps[counted[0]][0], data.steps[counted[-1]][1])
    ops = top_ops(data.rest, len(counted), data.launches, region=region)
    launches = launches_by_correlation(events, RUNTIME_CATEGORIES)
    assert ops == top_ops(events, len(counted), launches, region=region) and ops["by_kernel"]
    span = (data.steps[0][0], data.steps[3][1])
    gpu = gpu_summary(data.rest, span, data.python_calls[data.thread])
    assert gpu == gpu_summary(events, span, thread_calls) and gpu is not None
    assert data.python_calls[data.thread].names == thread_calls.names
    memory = memory_summary(data.memory, None)
    assert memory == memory_summary(trace["traceEvents"], None) and memory is not None
    compiled = compile_summary(None, data.rest, data.steps)
    assert compiled == compile_summary(None, events, data.steps)
    assert compiled is not None and compiled["graph_breaks"][0]["calls"] == 4
    workers = worker_summary(data)
    assert workers is not None and [w["batches"] for w in workers["workers"]] == [[0, 2, 4, 6], [1, 3, 5, 7]]

    # Everything the summary and its verdicts read, from the buckets and from the whole lists.
    whole = dataclasses.replace(data, rest=events, memory=list(trace["traceEvents"]))
    assert summarize(trace, None, data) == summarize(trace, None, whole)
    view, whole_view = WindowView(data, summarize(trace, None, data)), WindowView(whole, summarize(trace, None, whole))
    for bucket in ("ops", "runtime", "kernels", "gc", "compile_spans"):
        assert getattr(view, bucket) == getattr(whole_view, bucket), bucket
        assert getattr(view, bucket), bucket
