"""The window's one classification pass (analysis/steps.classify): every table the summary reads
from its bucket equals the table read from the whole event list, on a window with DataLoader
workers, CUDA kernels and their launches, gc pauses, compile spans, dynamo's resume calls,
Lightning's stage ranges, a user hook and torch's memory instants."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from vt_lightning.analysis.breakdown import stage_ranges
from vt_lightning.analysis.compile import COMPILE_SPAN_PREFIX, compile_summary
from vt_lightning.analysis.spans import launches_by_correlation, x_events
from vt_lightning.analysis.steps import classify, find_steps, read_window
from vt_lightning.analysis.summary import summarize, top_ops
from vt_lightning.analysis.summary_devices import RUNTIME_CATEGORIES, gpu_summary, memory_summary
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

pytestmark = pytest.mark.unit

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
    events = x_events(trace)
    data = read_window(trace)
    assert len(data.rest) < len(events) // 3  # the Python calls stay out of ``rest``

    assert (data.steps, data.thread) == find_steps(events)
    assert len(data.steps) == 4 and data.thread == (MAIN, 1)
    ranges = stage_ranges(events, data.thread, {HOOK: "training_step"})
    assert (data.ranges, data.breakdown_source, data.user_hooks) == ranges
    assert {part for _, _, part in data.ranges} >= {"forward", "backward", "compile"}
    assert data.launches == launches_by_correlation(events, RUNTIME_CATEGORIES) and data.launches
    counted = data.counted
    region = (data.steps[counted[0]][0], data.steps[counted[-1]][1])
    ops = top_ops(data.rest, len(counted), region=region, launches=data.launches)
    assert ops == top_ops(events, len(counted), region=region) and ops["by_kernel"]
    span = (data.steps[0][0], data.steps[3][1])
    gpu = gpu_summary(data.rest, span, data.thread, calls=data.python_calls[data.thread])
    assert gpu == gpu_summary(events, span, data.thread) and gpu is not None
    memory = memory_summary(data.memory, None)
    assert memory == memory_summary(trace["traceEvents"], None) and memory is not None
    compiled = compile_summary(None, data.rest, data.steps)
    assert compiled == compile_summary(None, events, data.steps)
    assert compiled is not None and compiled["graph_breaks"][0]["calls"] == 4
    workers = trace[TRACE_METADATA_KEY]["workers"]["processes"]
    assert worker_summary(events, workers, [], data) == worker_summary(events, workers, [])

    # Everything the summary and its verdicts read, from the buckets and from the whole lists.
    whole = dataclasses.replace(data, rest=events, memory=list(trace["traceEvents"]))
    assert summarize(trace, None, data) == summarize(trace, None, whole)
    view, whole_view = WindowView(data, summarize(trace, None, data)), WindowView(whole, summarize(trace, None, whole))
    for bucket in ("ops", "runtime", "kernels", "gc", "compile_spans"):
        assert getattr(view, bucket) == getattr(whole_view, bucket), bucket
        assert getattr(view, bucket), bucket


def _with_workers_run(seed: int) -> tuple[dict[str, Any], range, dict[Any, list[Any]]]:
    """``_window``'s trace laid out as the merge writes one: the training process's events, then
    the workers' calls as one run, each thread's in one stretch by start; and those calls as the
    merge hands them over (``merge.merge_window``'s ``bounds``)."""
    trace = _window(seed)
    is_worker_call = [e.get("pid") in WORKERS and e.get("cat") == PYTHON_CATEGORY for e in trace["traceEvents"]]
    main = [e for e, worker in zip(trace["traceEvents"], is_worker_call) if not worker]
    stretches = [
        sorted((e for e, worker in zip(trace["traceEvents"], is_worker_call) if worker and e["pid"] == pid),
               key=lambda e: (e["ts"], -e["dur"]))
        for pid in WORKERS
    ]  # fmt: skip
    run_events = [e for stretch in stretches for e in stretch]
    trace["traceEvents"] = main + run_events + main[:3]  # events appended after the run too
    run = range(len(main), len(main) + len(run_events))
    calls = {(s[0]["pid"], s[0]["tid"]): [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in s] for s in stretches}
    return trace, run, calls


@pytest.mark.parametrize("seed", [0, 1])
def test_a_workers_run_handed_over_is_filed_as_reading_its_events_files_it(seed: int) -> None:
    trace, run, calls = _with_workers_run(seed)
    plain = classify(trace["traceEvents"])
    given = {thread: list(found) for thread, found in calls.items()}
    hinted = classify(trace["traceEvents"], run, given)
    assert hinted == plain
    assert all(hinted[0][thread] is given[thread] for thread in given)  # taken, not read again
    assert summarize(trace, None, read_window(trace, run, dict(calls))) == summarize(trace)


def _off_by_one_ns(events: list[dict[str, Any]], run: range, calls: dict[Any, list[Any]]) -> None:
    thread = next(iter(calls))
    start, end, name = calls[thread][-1]
    calls[thread][-1] = (start + 0.001, end, name)


def _threads_swapped(events: list[dict[str, Any]], run: range, calls: dict[Any, list[Any]]) -> None:
    first, second = list(calls.items())
    calls.clear()
    calls.update([second, first])


def _one_call_short(events: list[dict[str, Any]], run: range, calls: dict[Any, list[Any]]) -> None:
    next(iter(calls.values())).pop()


def _a_name_rest_keeps(events: list[dict[str, Any]], run: range, calls: dict[Any, list[Any]]) -> None:
    """A worker's call named as a gc pause, in the run and in the calls alike."""
    thread = next(iter(calls))
    start, end, _ = calls[thread][5]
    calls[thread][5] = (start, end, f"{GC_SPAN_PREFIX}generation 0")
    events[run.start + 5]["name"] = f"{GC_SPAN_PREFIX}generation 0"


@pytest.mark.parametrize("spoil", [_off_by_one_ns, _threads_swapped, _one_call_short, _a_name_rest_keeps])
def test_a_workers_run_that_does_not_describe_the_events_is_read_from_them(spoil: Any) -> None:
    """Calls that do not match the run (a stretch's bound off, the threads in another order, one
    call missing) or that hold a name ``rest`` keeps are not taken: the run is read as it is."""
    trace, run, calls = _with_workers_run(0)
    given = {thread: list(found) for thread, found in calls.items()}
    spoil(trace["traceEvents"], run, given)
    hinted = classify(trace["traceEvents"], run, given)
    assert hinted == classify(trace["traceEvents"])
    assert not any(hinted[0][thread] is found for thread, found in given.items())
